// The llama family's config.json model_types (ModelConfig::model_type): what each one adds to
// LLaMA blocks, the defaults its transformers Config class gives to keys a config.json leaves
// out, and how its checkpoints name the fused projections. A new LLaMA-shaped family is one row
// of kLlamaTypes (llama_types.cpp).
#pragma once

#include <string>
#include <vector>

namespace memfit {

// How a mixture-of-experts type names its sparse MLP (model/moe_config.h).
enum class MoeNaming { none, mixtral, qwen };

struct LlamaType {
    const char * type;           // config.json's model_type
    const char * architecture;   // the class export names, LlamaForCausalLM ...
    int   vocab, max_seq;        // the Config's vocab_size and max_position_embeddings defaults
    float eps;                   // its rms_norm_eps default
    int   head_dim;              // its head_dim default (0: hidden_size / num_attention_heads)
    bool  qkv_bias;              // q, k and v have biases (Qwen2)
    bool  qk_norm;               // q and k RMSNorm over each head (Qwen3)
    // OLMo 2: q and k RMSNorm over all of q and all of k, and the blocks' norms after attention
    // and the MLP (post_attention_layernorm, post_feedforward_layernorm).
    bool  olmo2_norms;
    // sliding_window: -1 this type has no such key (ignored on read, never written); 0 read,
    // absent or null = none; > 0 read, absent = this default.
    int   window;
    bool  use_sliding_window;    // the Qwen form: a use_sliding_window flag, refused when true
    // The checkpoint fuses q|k|v into self_attn.qkv_proj and gate|up into mlp.gate_up_proj
    // (Phi-3): memfit's q, k, v (gate, up) matrices are adjacent rows of those.
    bool  fused;
    // The model_type a --attention-window run exports as (nullptr: refused for this type).
    const char * windowed_as;
    // Gemma 3: GeGLU, norms before and after attention and the MLP, (1 + w) norm weights, the
    // embedding scaled by sqrt(C), sliding and global layers with their own RoPE bases, scores
    // scaled by query_pre_attn_scalar (ModelConfig's Gemma 3 fields).
    bool  gemma3 = false;
    float theta = 10000.0f;      // its rope_theta default
    // GPT-NeoX (Pythia): LayerNorm with biases, biases on every projection, a plain GELU MLP,
    // attention and the MLP side by side (use_parallel_residual), partial rotary (rotary_pct),
    // checkpoints under their own names with q|k|v interleaved head by head (hf_weights.h).
    bool  neox = false;
    // Mixture of experts (ModelConfig::moe): the names of its router and experts (none: dense).
    MoeNaming moe = MoeNaming::none;
    // OLMoE: q and k RMSNorm over all of q and all of k (OLMo 2's), the blocks' norms before.
    bool  qk_whole = false;
};

// nullptr when `type` is not a llama-family model_type.
const LlamaType * find_llama_type(const std::string & type);
// "llama, qwen2, qwen3, mistral, phi3, olmo2, gemma3_text"
std::string llama_type_names();

// A fused checkpoint tensor and the adjacent layout parameters it holds, in row order, as
// suffixes after "model.layers.N."; by_head: the checkpoint interleaves them head by head (GPT-NeoX's
// query_key_value: each head's q, k and v rows together), memfit keeps them part after part.
struct FusedTensor {
    const char * name;
    std::vector<const char *> parts;
    bool by_head = false;
};
// Where a type's checkpoints name a tensor differently from memfit's layout: the layout name's
// piece and the checkpoint's (prefixes, whole names, or suffixes within a layer).
struct TensorRename {
    const char * ours, * theirs;
};
const std::vector<TensorRename> & tensor_renames(const LlamaType & t);
// The fused tensors of a type's checkpoints (empty unless LlamaType::fused).
const std::vector<FusedTensor> & fused_tensors(const LlamaType & t);

}  // namespace memfit
