#include "model/llama_types.h"

#include <fmt/format.h>

namespace memfit {

namespace {

// transformers' LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig, Phi3Config and
// Olmo2Config, Gemma3TextConfig and GPTNeoXConfig defaults. Phi-3's sliding_window defaults to none (Phi-3-mini-4k's config.json
// sets 2047).
constexpr LlamaType kLlamaTypes[] = {
    // type      architecture           vocab   max_seq  eps    hd   bias   norm   olmo2  window use_sw fused  windowed_as
    {"llama",   "LlamaForCausalLM",   32000,  2048,   1e-6f, 0,   false, false, false, -1,   false, false, "mistral"},
    {"qwen2",   "Qwen2ForCausalLM",   151936, 32768,  1e-6f, 0,   true,  false, false, -1,   true,  false, nullptr},
    {"qwen3",   "Qwen3ForCausalLM",   151936, 32768,  1e-6f, 128, false, true,  false, -1,   true,  false, nullptr},
    {"mistral", "MistralForCausalLM", 32000,  131072, 1e-6f, 0,   false, false, false, 4096, false, false, "mistral"},
    {"phi3",    "Phi3ForCausalLM",    32064,  4096,   1e-5f, 0,   false, false, false, 0,    false, true,  "phi3"},
    {"olmo2",   "Olmo2ForCausalLM",   50304,  2048,   1e-5f, 0,   false, true,  true,  -1,   false, false, nullptr},
    {"gemma3_text", "Gemma3ForCausalLM", 262208, 131072, 1e-6f, 256, false, true, false, 4096, false, false, nullptr, true, 1e6f},
    {"gpt_neox", "GPTNeoXForCausalLM", 50432, 2048, 1e-5f, 0, true, false, false, -1, false, true, nullptr, false, 10000.0f, true},
    // Mixtures of experts (MixtralConfig, Qwen3MoeConfig, OlmoeConfig defaults).
    {"mixtral", "MixtralForCausalLM", 32000, 131072, 1e-5f, 0, false, false, false, 0, false, false, "mixtral", false,
     1e6f, false, MoeNaming::mixtral},
    {"qwen2_moe", "Qwen2MoeForCausalLM", 151936, 32768, 1e-6f, 0, true, false, false, -1, true, false, nullptr, false,
     10000.0f, false, MoeNaming::qwen},
    {"qwen3_moe", "Qwen3MoeForCausalLM", 151936, 32768, 1e-6f, 0, false, true, false, -1, true, false, nullptr, false,
     10000.0f, false, MoeNaming::qwen},
    {"olmoe", "OlmoeForCausalLM", 50304, 4096, 1e-5f, 0, false, true, false, -1, false, false, nullptr, false, 10000.0f,
     false, MoeNaming::qwen, true},
};

}  // namespace

const LlamaType * find_llama_type(const std::string & type) {
    for (const LlamaType & t : kLlamaTypes)
        if (type == t.type) return &t;
    return nullptr;
}

std::string llama_type_names() {
    std::string s;
    for (const LlamaType & t : kLlamaTypes) s += fmt::format("{}{}", s.empty() ? "" : ", ", t.type);
    return s;
}

const std::vector<FusedTensor> & fused_tensors(const LlamaType & t) {
    static const std::vector<FusedTensor> none, phi3 = {
        {"self_attn.qkv_proj.weight", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
        {"mlp.gate_up_proj.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
    }, neox = {
        {"attention.query_key_value.weight",
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}, true},
        {"attention.query_key_value.bias", {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}, true},
    };
    return !t.fused ? none : t.neox ? neox : phi3;
}

// GPT-NeoX's names (transformers' GPTNeoXForCausalLM), applied in this order to the layout's
// names once the fused tensors are formed.
const std::vector<TensorRename> & tensor_renames(const LlamaType & t) {
    static const std::vector<TensorRename> none, neox = {
        {"model.embed_tokens.", "gpt_neox.embed_in."},   {"model.norm.", "gpt_neox.final_layer_norm."},
        {"lm_head.", "embed_out."},                      {"model.layers.", "gpt_neox.layers."},
        {"self_attn.o_proj.", "attention.dense."},       {"mlp.up_proj.", "mlp.dense_h_to_4h."},
        {"mlp.down_proj.", "mlp.dense_4h_to_h."},
    };
    return t.neox ? neox : none;
}

}  // namespace memfit
