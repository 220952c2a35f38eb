#include "model/config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_read.h"
#include "core/json_num.h"
#include "model/llama_types.h"
#include "model/moe_config.h"

namespace memfit {

namespace {

struct Preset {
    const char * name;
    const char * family;
    int vocab, max_seq, C, L, NH, KVH, ffn;
    float theta;
    bool tied;
    const char * what;
    int window = 0;   // sliding_window (0: none)
};

// vocab 0: the small demo models take the vocabulary of the data they train on. The LLaMA
// shapes are Meta's published ones (Touvron et al. 2023, Llama 2 paper, table 1; the Llama 3
// model card), as in their Hugging Face config.json files; the small ones use ffn = 8C/3
// rounded up to a multiple of 16.
constexpr Preset kPresets[] = {
    {"nano",        "gpt2",  0,      256,  64,   2,  4,  0, 0,     0,        true,  "2 layers, 64 channels: tests and smoke runs"},
    {"micro",       "gpt2",  0,      256,  128,  4,  4,  0, 0,     0,        true,  "4 layers, 128 channels: the quick CPU demo"},
    {"mini",        "gpt2",  0,      512,  256,  6,  8,  0, 0,     0,        true,  "6 layers, 256 channels: a longer CPU demo"},
    {"gpt2-6l",     "gpt2",  50257,  1024, 384,  6,  6,  0, 0,     0,        true,  "6 layers, 384 channels, GPT-2 vocabulary: the CPU benchmark"},
    {"gpt2",        "gpt2",  50257,  1024, 768,  12, 12, 0, 0,     0,        true,  "GPT-2 124M"},
    {"gpt2-medium", "gpt2",  50257,  1024, 1024, 24, 16, 0, 0,     0,        true,  "GPT-2 350M"},
    {"gpt2-large",  "gpt2",  50257,  1024, 1280, 36, 20, 0, 0,     0,        true,  "GPT-2 774M"},
    {"gpt2-xl",     "gpt2",  50257,  1024, 1600, 48, 25, 0, 0,     0,        true,  "GPT-2 1.5B"},
    {"llama-nano",  "llama", 0,      256,  64,   2,  4,  2, 176,   10000.f,  false, "LLaMA-shaped, 2 layers, 64 channels, 2 KV heads: tests"},
    {"llama-micro", "llama", 0,      256,  128,  4,  4,  2, 352,   10000.f,  false, "LLaMA-shaped, 4 layers, 128 channels: a quick CPU run"},
    {"llama-mini",  "llama", 0,      512,  256,  6,  8,  4, 688,   10000.f,  false, "LLaMA-shaped, 6 layers, 256 channels"},
    {"llama2-7b",   "llama", 32000,  4096, 4096, 32, 32, 32, 11008, 10000.f, false, "Llama 2 7B"},
    {"llama2-13b",  "llama", 32000,  4096, 5120, 40, 40, 40, 13824, 10000.f, false, "Llama 2 13B"},
    {"llama2-70b",  "llama", 32000,  4096, 8192, 80, 64, 8, 28672, 10000.f,  false, "Llama 2 70B (GQA, 8 KV heads)"},
    {"llama3-8b",   "llama", 128256, 8192, 4096, 32, 32, 8, 14336, 500000.f, false, "Llama 3 8B (GQA, 8 KV heads)"},
    {"llama3-70b",  "llama", 128256, 8192, 8192, 80, 64, 8, 28672, 500000.f, false, "Llama 3 70B (GQA, 8 KV heads)"},
    {"llama3.1-8b", "llama", 128256, 131072, 4096, 32, 32, 8, 14336, 500000.f, false, "Llama 3.1 8B (rope_scaling llama3, factor 8)"},
    {"llama3.1-70b", "llama", 128256, 131072, 8192, 80, 64, 8, 28672, 500000.f, false, "Llama 3.1 70B (rope_scaling llama3, factor 8)"},
    {"llama3.2-1b", "llama", 128256, 131072, 2048, 16, 32, 8, 8192, 500000.f, true,  "Llama 3.2 1B (rope_scaling llama3, factor 32, tied)"},
    {"llama3.2-3b", "llama", 128256, 131072, 3072, 28, 24, 8, 8192, 500000.f, true,  "Llama 3.2 3B (rope_scaling llama3, factor 32, tied)"},
    // Qwen2.5 (Qwen's config.json files): LLaMA blocks with biases on q, k and v.
    {"qwen2.5-0.5b", "qwen2", 151936, 32768, 896, 24, 14, 2, 4864, 1000000.f, true,  "Qwen2.5 0.5B (q/k/v biases, tied)"},
    {"qwen2.5-1.5b", "qwen2", 151936, 32768, 1536, 28, 12, 2, 8960, 1000000.f, true,  "Qwen2.5 1.5B (q/k/v biases, tied)"},
    {"qwen2.5-7b",   "qwen2", 152064, 32768, 3584, 28, 28, 4, 18944, 1000000.f, false, "Qwen2.5 7B (q/k/v biases)"},
    // Qwen3 (Qwen's config.json files): q and k RMSNorm per head, head_dim 128 whatever C / NH.
    {"qwen3-0.6b",   "qwen3", 151936, 40960, 1024, 28, 16, 8, 3072,  1000000.f, true,  "Qwen3 0.6B (q/k norms, head_dim 128, tied)"},
    {"qwen3-1.7b",   "qwen3", 151936, 40960, 2048, 28, 16, 8, 6144,  1000000.f, true,  "Qwen3 1.7B (q/k norms, tied)"},
    {"qwen3-4b",     "qwen3", 151936, 40960, 2560, 36, 32, 8, 9728,  1000000.f, true,  "Qwen3 4B (q/k norms, head_dim 128, tied)"},
    {"qwen3-8b",     "qwen3", 151936, 40960, 4096, 36, 32, 8, 12288, 1000000.f, false, "Qwen3 8B (q/k norms)"},
    // Mistral 7B v0.1 (its config.json): LLaMA blocks, attention within a 4096-token window.
    {"mistral-7b",   "mistral", 32000, 32768, 4096, 32, 32, 8, 14336, 10000.f,  false, "Mistral 7B v0.1 (sliding window 4096)", 4096},
    // Phi-3 and Phi-4 (Microsoft's config.json files, model_type phi3): LLaMA blocks whose
    // checkpoints fuse q|k|v (qkv_proj) and gate|up (gate_up_proj).
    {"phi-3-mini",   "phi3", 32064,  4096,  3072, 32, 32, 32, 8192,  10000.f,  false, "Phi-3-mini-4k 3.8B (sliding window 2047)", 2047},
    {"phi-4",        "phi3", 100352, 16384, 5120, 40, 40, 10, 17920, 250000.f, false, "Phi-4 14B (GQA, 10 KV heads)"},
    // OLMo 2 (AI2's config.json files, model_type olmo2): LLaMA blocks whose norms follow attention
    // and the MLP, q and k normalised over all their heads.
    {"olmo-2-1b",    "olmo2", 100352, 4096, 2048, 16, 16, 16, 8192,  500000.f, false, "OLMo 2 1B (0425)"},
    {"olmo-2-7b",    "olmo2", 100352, 4096, 4096, 32, 32, 32, 11008, 500000.f, false, "OLMo 2 7B (1124)"},
    {"olmo-2-13b",   "olmo2", 100352, 4096, 5120, 40, 40, 40, 13824, 500000.f, false, "OLMo 2 13B (1124)"},
    // Gemma 3 (Google's config.json files; 4B and up: the text_config of Gemma3ForConditionalGeneration).
    {"gemma-3-1b",   "gemma3_text", 262144, 32768,  1152, 26, 4,  1,  6912,  1000000.f, true, "Gemma 3 1B (5 sliding : 1 global, window 512)", 512},
    {"gemma-3-4b",   "gemma3_text", 262208, 131072, 2560, 34, 8,  4,  10240, 1000000.f, true, "Gemma 3 4B text (window 1024)", 1024},
    {"gemma-3-12b",  "gemma3_text", 262208, 131072, 3840, 48, 16, 8,  15360, 1000000.f, true, "Gemma 3 12B text (window 1024)", 1024},
    {"gemma-3-27b",  "gemma3_text", 262208, 131072, 5376, 62, 32, 16, 21504, 1000000.f, true, "Gemma 3 27B text (window 1024)", 1024},
    // Pythia (EleutherAI's config.json files, model_type gpt_neox): rotary_pct 0.25, parallel residuals.
    {"pythia-1b",    "gpt_neox", 50304, 2048, 2048, 16, 8,  8,  8192,  10000.f, false, "Pythia 1B (GPT-NeoX)"},
    {"pythia-6.9b",  "gpt_neox", 50432, 2048, 4096, 32, 32, 32, 16384, 10000.f, false, "Pythia 6.9B (GPT-NeoX)"},
    // Mixtures of experts (their experts: model/moe_config.cpp's kMoePresets; their config.json
    // files); ffn: Qwen's dense MLP width.
    {"mixtral-nano", "mixtral", 0,      256,    64,   2,  4,  2, 64,    1000000.f, false, "Mixtral-shaped, 2 layers, 4 experts (top 2): tests"},
    {"qwen3-moe-nano", "qwen3_moe", 0,  256,    64,   2,  4,  2, 128,   1000000.f, false, "Qwen3-MoE-shaped, 2 layers, 8 experts (top 2): tests"},
    {"mixtral-8x7b", "mixtral", 32000,  32768,  4096, 32, 32, 8, 14336, 1000000.f, false, "Mixtral 8x7B (8 experts, top 2)"},
    {"qwen3-30b-a3b", "qwen3_moe", 151936, 40960, 2048, 48, 32, 4, 6144, 1000000.f, false, "Qwen3-30B-A3B (128 experts, top 8)"},
    {"qwen3-235b-a22b", "qwen3_moe", 151936, 40960, 4096, 94, 64, 4, 12288, 1000000.f, false, "Qwen3-235B-A22B (128 experts, top 8)"},
    {"olmoe-1b-7b",  "olmoe",   50304,  4096,   2048, 16, 16, 16, 1024, 10000.f,   false, "OLMoE-1B-7B (0924: 64 experts, top 8)"},
    {"qwen1.5-moe-a2.7b", "qwen2_moe", 151936, 8192, 2048, 24, 16, 16, 5632, 1000000.f, false, "Qwen1.5-MoE-A2.7B (60 experts, top 4, a shared expert)"},
};

// Gemma 3's presets beyond the table's columns: the global layers' linear rope_scaling factor
// (1: none), head_dim and query_pre_attn_scalar.
struct GemmaPreset {
    const char * name;
    float rope_factor;
    int head_dim, scalar;
};
constexpr GemmaPreset kGemmaPresets[] = {
    {"gemma-3-1b", 1.0f, 256, 256}, {"gemma-3-4b", 8.0f, 256, 256}, {"gemma-3-12b", 8.0f, 256, 256},
    {"gemma-3-27b", 8.0f, 128, 168}};

// The presets with Llama 3.1's rope_scaling (their config.json files): rope_type llama3, low and
// high frequency factors 1 and 4, original_max_position_embeddings 8192.
struct RopePreset {
    const char * name;
    float factor;
};
constexpr RopePreset kRopePresets[] = {{"llama3.1-8b", 8.0f}, {"llama3.1-70b", 8.0f}, {"llama3.2-1b", 32.0f}, {"llama3.2-3b", 32.0f}};

// Gemma 3's block form (ModelConfig's Gemma 3 fields) with Gemma3TextConfig's defaults: 5 sliding
// layers to 1 global, local RoPE base 10,000, query_pre_attn_scalar 256.
void set_gemma3(ModelConfig & c) {
    c.glu = Glu::gelu_tanh;
    c.sandwich_norm = c.norm_plus_one = c.scale_embed = true;
    c.sliding_pattern = 6;
    c.rope_local_theta = 10000.0f;
    c.attn_scalar = 256.0f;
}

}  // namespace

std::string ModelConfig::describe() const {
    std::string s = fmt::format("{}, {} layers, {} channels, {} heads", family, n_layer, n_embd, n_head);
    if (llama()) s += fmt::format("{}, MLP {}{}", kv_heads() != n_head ? fmt::format(" ({} KV)", kv_heads()) : "",
                                  ffn_dim(), tied_head ? ", tied head" : "");
    else if (gelu == Gelu::erf) s += ", exact GELU";
    if (post_norm) s += ", norms after attention and MLP";
    if (sandwich_norm) s += ", norms before and after attention and MLP";
    if (parallel_residual) s += ", attention and MLP in parallel";
    if (glu == Glu::gelu_tanh) s += ", GeGLU";
    if (sliding_pattern > 0) s += fmt::format(", every {}th layer global", sliding_pattern);
    if (share_layers > 1) s += fmt::format(", {} blocks shared {} ways", stored_layers(), share_layers);
    if (moe.enabled())
        s += fmt::format(", {} experts of {} (top {}) in {} of {} layers", moe.experts, moe.ffn, moe.top_k, moe_layers(),
                         n_layer);
    return s;
}

namespace {
// Parameters with `blocks` transformer blocks; sparse layers with `active` of their experts
// (-1: all of them).
int64_t params_with(const ModelConfig & m, int64_t blocks, int active = -1) {
    const int64_t C = m.n_embd, V = m.vocab_size, P = m.max_seq, F = m.ffn_dim(), Q = m.qkv_dim(), A = m.attn_dim();
    if (m.llama()) {
        // norms, q|k|v (and their biases: Qwen2; q and k norms: Qwen3), o, gate|up|down
        const int64_t norm = m.layer_norm ? 2 * C : C;   // LayerNorm: weight and bias
        const int64_t attn = (m.sandwich_norm ? 4 : 2) * norm + C * Q + (m.qkv_bias ? Q : 0) +
                             (m.qk_norm ? 2 * m.qk_norm_width() : 0) + C * A;
        const int64_t dense = (m.gated() ? 3 : 2) * C * F + (m.proj_bias ? 2 * C + F : 0);
        const int64_t experts = active < 0 ? m.moe.local_experts() : active;   // (expert parallel: a share)
        // router, experts, Qwen2-MoE's shared expert and its gate
        const int64_t sparse = int64_t(m.moe.experts) * C + experts * 3 * C * m.moe.ffn +
                               (m.moe.shared_ffn > 0 ? 3 * C * m.moe.shared_ffn + C : 0);
        int64_t layers = 0;
        for (int64_t l = 0; l < blocks; ++l) layers += attn + (m.moe_layer(int(l)) ? sparse : dense);
        return V * C + layers + norm + (m.tied_head ? 0 : V * C);
    }
    const int64_t per_layer = 2 * C + (C * Q + Q) + (A * C + C) + 2 * C + (C * F + F) + (F * C + C);
    return V * C + P * C + blocks * per_layer + 2 * C;
}
}  // namespace

int64_t ModelConfig::num_params() const { return params_with(*this, stored_layers()); }
int64_t ModelConfig::compute_params() const { return params_with(*this, n_layer); }
int64_t ModelConfig::active_params() const { return params_with(*this, n_layer, moe.top_k); }
int ModelConfig::moe_layers() const {
    int n = 0;
    for (int l = 0; l < n_layer; ++l) n += moe_layer(l);
    return n;
}

double train_flops_per_token(const ModelConfig & cfg, int seq) {
    if (cfg.vocab_size <= 0) throw ConfigError(fmt::format("model '{}': FLOPs per token need vocab_size", cfg.name));
    const int64_t lookup = cfg.llama() ? (cfg.tied_head ? 0 : int64_t(cfg.vocab_size) * cfg.n_embd)
                                       : int64_t(cfg.max_seq) * cfg.n_embd;
    return 6.0 * double(cfg.active_params() - lookup) + 12.0 * cfg.n_layer * double(cfg.attn_dim()) * seq;
}

void ModelConfig::validate() const {
    auto bad = [&](const std::string & what) {
        throw ConfigError(fmt::format("model '{}': {}", name, what));
    };
    const LlamaType * type = llama() ? find_llama_type(model_type) : nullptr;
    if (llama() && !type)
        bad(fmt::format("model_type '{}' is not a LLaMA-family type ({})", model_type, llama_type_names()));
    if (llama() && qkv_bias != type->qkv_bias) bad("q, k and v biases belong to qwen2 (model_type)");
    if (qk_norm != (llama() && type->qk_norm)) bad("q and k norms belong to qwen3 and olmo2 (model_type)");
    if (qk_norm_whole != (llama() && (type->olmo2_norms || type->qk_whole)) || post_norm != (llama() && type->olmo2_norms))
        bad("whole-projection q and k norms and norms after attention and the MLP belong to olmo2 (model_type)");
    if (qk_norm_whole && n_kv_head > 0 && n_kv_head != n_head)
        bad(fmt::format("olmo2 with {} KV heads for {} heads (OLMo-2-32B's layout) is not supported yet: its q and k "
                        "norms span unequal widths", n_kv_head, n_head));
    const bool gemma = llama() && type->gemma3;
    if (sandwich_norm != gemma || norm_plus_one != gemma || scale_embed != gemma || (glu == Glu::gelu_tanh) != gemma)
        bad("GeGLU, norms before and after each sublayer, (1 + w) norms and a scaled embedding belong to gemma3_text "
            "(model_type)");
    const bool neox = llama() && type->neox;
    if (layer_norm != neox || proj_bias != neox || plain_mlp != neox || (parallel_residual && !neox))
        bad("LayerNorm, biased o and MLP projections, an ungated MLP and parallel residuals belong to gpt_neox "
            "(model_type)");
    if (neox && n_kv_head > 0 && n_kv_head != n_head)
        bad(fmt::format("gpt_neox with {} KV heads for {} heads: GPT-NeoX has no grouped-query attention", n_kv_head,
                        n_head));
    validate_moe(*this, type);
    if (sliding_pattern < 0) bad(fmt::format("sliding_window_pattern = {}, must be positive", sliding_pattern));
    if (!(rope_local_theta >= 0)) bad(fmt::format("rope_local_base_freq = {}, must be positive", rope_local_theta));
    if (!(attn_scalar >= 0)) bad(fmt::format("query_pre_attn_scalar = {}, must be positive", attn_scalar));
    if (attn_scalar > 0 && !qk_norm) bad("query_pre_attn_scalar needs q and k norms (gemma3_text)");
    if (sliding_window < 0) bad(fmt::format("sliding_window = {}, must be positive", sliding_window));
    if (family != "gpt2" && family != "llama") bad(fmt::format("family '{}' is not supported (supported: gpt2, llama)", family));
    if (n_layer < 1) bad(fmt::format("n_layer = {}, must be at least 1", n_layer));
    if (share_layers < 1 || share_layers > n_layer)
        bad(fmt::format("{} = {}: blocks per shared group, from 1 to n_layer = {}", kShareLayersKey, share_layers,
                        n_layer));
    if (n_embd < 1 || n_head < 1) bad(fmt::format("n_embd = {}, n_head = {}: both must be positive", n_embd, n_head));
    if (head_size < 0) bad(fmt::format("head_dim = {}, must be positive", head_size));
    // Bounds far beyond any real model, so that parameter counts cannot overflow 64 bits.
    auto at_most = [&](const char * what, int64_t v, int64_t cap) {
        if (v > cap) bad(fmt::format("{} = {} exceeds the supported {}", what, v, cap));
    };
    at_most("n_embd", n_embd, 1 << 20);
    at_most("intermediate_size", ffn, 1 << 22);
    at_most("n_layer", n_layer, 1 << 14);
    at_most("vocab_size", vocab_size, 1 << 24);
    at_most("n_positions", max_seq, 1 << 24);
    at_most("num_attention_heads", n_head, 1 << 16);
    at_most("head_dim", head_size, 1 << 16);
    // The attention width and q|k|v are int products: bounded like n_embd, before any is formed.
    at_most("num_attention_heads x head_dim", int64_t(n_head) * (head_size > 0 ? head_size : n_embd / n_head), 1 << 20);
    if (head_size == 0 && n_embd % n_head != 0)
        bad(fmt::format("n_embd = {} is not divisible by n_head = {}", n_embd, n_head));
    if (max_seq < 1) bad(fmt::format("n_positions = {}, must be positive", max_seq));
    if (vocab_size < 0) bad(fmt::format("vocab_size = {}, must be positive", vocab_size));
    if (!(ln_eps > 0)) bad(fmt::format("norm epsilon = {}, must be positive", ln_eps));
    if (ffn < 0) bad(fmt::format("intermediate_size = {}, must be positive", ffn));
    if (trained_seq < 0) bad(fmt::format("{} = {}, must be positive", kTrainedContextKey, trained_seq));
    if (!llama()) {
        if (n_kv_head != 0 && n_kv_head != n_head) bad("grouped-query attention is a llama option");
        if (!tied_head) bad("untied GPT-2 heads are not supported");
        return;
    }
    if (n_kv_head < 0 || n_head % kv_heads() != 0)
        bad(fmt::format("num_attention_heads = {} is not a multiple of num_key_value_heads = {}", n_head, n_kv_head));
    if (head_dim() % 2 != 0) bad(fmt::format("head_dim = {} must be even for rotary embeddings", head_dim()));
    if (!(rope_theta > 0)) bad(fmt::format("rope_theta = {}, must be positive", rope_theta));
    const Rope & r = rope_scaling;
    if ((r.scaling == RopeScaling::linear || r.scaling == RopeScaling::llama3 || r.scaling == RopeScaling::yarn) &&
        !(r.factor >= 1))
        bad(fmt::format("rope_scaling factor = {}, must be at least 1", r.factor));
    if (r.scaling == RopeScaling::llama3) {
        if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
            bad(fmt::format("rope_scaling low_freq_factor = {} and high_freq_factor = {}: need 0 < low < high",
                            r.low_freq_factor, r.high_freq_factor));
        if (r.original_context < 1)
            bad(fmt::format("rope_scaling original_max_position_embeddings = {}, must be positive", r.original_context));
    }
    const int rot = r.rotary_dims(head_dim());
    if (rot < 2 || rot % 2 != 0 || rot > head_dim())
        bad(fmt::format("partial_rotary_factor gives {} rotary dimensions of head_dim {}: they must be even, from 2 to "
                        "head_dim", rot, head_dim()));
    if (r.scaling == RopeScaling::longrope &&
        (r.short_factor.size() != size_t(rot / 2) || r.long_factor.size() != size_t(rot / 2)))
        bad(fmt::format("rope_scaling longrope has {} short and {} long factors; the {} rotary dimensions need {} each",
                        r.short_factor.size(), r.long_factor.size(), rot, rot / 2));
}

std::vector<std::string> preset_names() {
    std::vector<std::string> out;
    for (const auto & p : kPresets) out.push_back(p.name);
    return out;
}

ModelConfig model_preset(const std::string & name) {
    for (const auto & p : kPresets) {
        if (name != p.name) continue;
        ModelConfig c;
        c.name = p.name;
        c.family = p.family;
        if (const LlamaType * t = find_llama_type(c.family); t && c.family != "llama") {
            c.model_type = c.family;
            c.family = "llama";
            c.qkv_bias = t->qkv_bias;
            c.qk_norm = t->qk_norm;
            c.qk_norm_whole = c.post_norm = t->olmo2_norms;
            c.qk_norm_whole = c.qk_norm_whole || t->qk_whole;
            if (c.qkv_bias || c.qk_norm) c.ln_eps = 1e-6f;
            if (t->moe != MoeNaming::none) c.ln_eps = t->eps;   // Qwen's and OLMo 2's config.json files
            c.head_size = t->head_dim;
            c.sliding_window = p.window;
            if (t->gemma3) set_gemma3(c);
            if (t->neox) {   // GPTNeoXConfig's block; the quarter of each head that turns is set below
                c.layer_norm = c.proj_bias = c.plain_mlp = c.parallel_residual = true;
                c.gelu = Gelu::erf;
            }
            for (const GemmaPreset & gp : kGemmaPresets)
                if (name == gp.name) {
                    c.head_size = gp.head_dim;
                    c.attn_scalar = float(gp.scalar);
                    if (gp.rope_factor > 1) c.rope_scaling.scaling = RopeScaling::linear;
                    c.rope_scaling.factor = gp.rope_factor;
                }
        }
        c.vocab_size = p.vocab;
        c.max_seq = p.max_seq;
        c.n_embd = p.C;
        c.n_layer = p.L;
        c.n_head = p.NH;
        c.n_kv_head = p.KVH;
        c.ffn = p.ffn;
        if (p.theta > 0) c.rope_theta = p.theta;
        c.tied_head = p.tied;
        if (c.plain_mlp) c.rope_scaling.rotary_dim = c.head_dim() / 4;   // gpt_neox: Pythia's rotary_pct 0.25
        apply_moe_preset(name, c);
        for (const RopePreset & r : kRopePresets)
            if (name == r.name) {
                c.rope_scaling.scaling = RopeScaling::llama3;
                c.rope_scaling.factor = r.factor;
                c.rope_scaling.low_freq_factor = 1.0f;
                c.rope_scaling.high_freq_factor = 4.0f;
                c.rope_scaling.original_context = 8192;
            }
        return c;
    }
    throw ConfigError(fmt::format("unknown model '{}': use a preset ({}) or a path to a Hugging Face config.json",
                                  name, fmt::join(preset_names(), ", ")));
}

namespace {
// Range-checked numbers (core/json_num.h), as ConfigError naming the field.
int int_field(const nlohmann::json & j, const char * key, const std::string & name) {
    if (const auto x = json_number<int>(j.at(key))) return *x;
    throw ConfigError(fmt::format("{}: {} = {} is not an integer in range", name, key, j[key].dump()));
}
int int_field(const nlohmann::json & j, const char * key, int fallback, const std::string & name) {
    return j.contains(key) && !j[key].is_null() ? int_field(j, key, name) : fallback;
}
float float_field(const nlohmann::json & j, const char * key, float fallback, const std::string & name) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (const auto x = json_number<float>(j[key])) return *x;
    throw ConfigError(fmt::format("{}: {} = {} is not a number in range", name, key, j[key].dump()));
}
// LongRoPE (Phi-3 128K, Phi-3.5, Phi-4-mini): rope_scaling's short_factor and long_factor lists,
// the original context (its original_max_position_embeddings or the config's) and the cos/sin
// scale: attention_factor when given, else sqrt(1 + ln(s) / ln(O)) for s = max_position_embeddings
// / O > 1 (transformers' _compute_longrope_parameters). The lists' lengths are checked against
// the rotary dimensions by ModelConfig::validate.
Rope parse_longrope(const nlohmann::json & j, const nlohmann::json & rs, const std::string & name) {
    Rope r;
    r.scaling = RopeScaling::longrope;
    for (auto [field, out] : {std::pair{"short_factor", &r.short_factor}, std::pair{"long_factor", &r.long_factor}}) {
        if (!rs.contains(field) || !rs[field].is_array())
            throw ConfigError(fmt::format("{}: rope_scaling of type longrope needs a '{}' list", name, field));
        for (const auto & v : rs[field]) {
            const auto x = json_number<double>(v);
            if (!x || !(*x > 0) || !std::isfinite(*x))
                throw ConfigError(fmt::format("{}: rope_scaling {} holds {}, not a positive number", name, field, v.dump()));
            out->push_back(*x);
        }
    }
    const int max_pos = int_field(j, "max_position_embeddings", 4096, name);
    const int original = rs.contains("original_max_position_embeddings")
                             ? int_field(rs, "original_max_position_embeddings", name)
                             : int_field(j, "original_max_position_embeddings", max_pos, name);
    if (original < 2)
        throw ConfigError(fmt::format("{}: original_max_position_embeddings = {} must be at least 2", name, original));
    r.original_context = original;
    const double s = double(max_pos) / original;
    r.factor = float(s);
    r.attention_factor = rs.contains("attention_factor") && !rs["attention_factor"].is_null()
                             ? float_field(rs, "attention_factor", 1.0f, name)
                             : s > 1 ? float(std::sqrt(1 + std::log(s) / std::log(double(original)))) : 1.0f;
    return r;
}

// rope_scaling of type yarn: factor (absent: max_position_embeddings / the original), the
// original context (absent: max_position_embeddings), beta_fast / beta_slow (32 / 1),
// truncate, and the cos/sin scale attention_factor (absent: from mscale and mscale_all_dim, or
// 0.1 ln(factor) + 1), as transformers' _compute_yarn_parameters reads them.
Rope parse_yarn(const nlohmann::json & j, const nlohmann::json & rs, const std::string & name) {
    Rope r;
    r.scaling = RopeScaling::yarn;
    auto given = [&](const char * k) { return rs.contains(k) && !rs[k].is_null(); };
    const int max_pos = int_field(j, "max_position_embeddings", 4096, name);
    r.original_context = given("original_max_position_embeddings")
                             ? int_field(rs, "original_max_position_embeddings", name) : max_pos;
    if (r.original_context < 2)
        throw ConfigError(fmt::format("{}: rope_scaling original_max_position_embeddings = {} must be at least 2", name,
                                      r.original_context));
    auto number = [&](const char * k, float fallback) {
        const float x = given(k) ? float_field(rs, k, fallback, name) : fallback;
        if (!(x > 0) || !std::isfinite(x))
            throw ConfigError(fmt::format("{}: rope_scaling {} = {} must be a positive number", name, k,
                                          given(k) ? rs[k].dump() : std::to_string(x)));
        return x;
    };
    r.factor = number("factor", float(max_pos) / float(r.original_context));
    r.beta_fast = number("beta_fast", 32.0f);
    r.beta_slow = number("beta_slow", 1.0f);
    if (given("truncate")) {
        if (!rs["truncate"].is_boolean())
            throw ConfigError(fmt::format("{}: rope_scaling truncate = {} must be true or false", name, rs["truncate"].dump()));
        r.truncate = rs["truncate"].get<bool>();
    }
    auto mscale = [&](double m) { return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(double(r.factor)) + 1.0; };
    if (given("attention_factor")) r.attention_factor = number("attention_factor", 1.0f);
    else if (given("mscale") && given("mscale_all_dim"))
        r.attention_factor = float(mscale(number("mscale", 1.0f)) / mscale(number("mscale_all_dim", 1.0f)));
    else r.attention_factor = float(mscale(1.0));
    return r;
}

// config.json's rope_scaling: {"rope_type" (or the older "type"): "llama3", "factor",
// "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} or {"rope_type":
// "linear", "factor"}, longrope or yarn (above); "default" is plain RoPE. Other types (dynamic)
// are refused.
Rope parse_rope_scaling(const nlohmann::json & j, const std::string & name) {
    const nlohmann::json & rs = j["rope_scaling"];
    if (!rs.is_object())
        throw ConfigError(fmt::format("{}: rope_scaling = {} must be an object", name, rs.dump()));
    const char * key = rs.contains("rope_type") ? "rope_type" : "type";
    const std::string type = rs.contains(key) && rs[key].is_string() ? rs[key].get<std::string>() : "";
    Rope r;
    if (type == "default") return r;
    if (type == "longrope") return parse_longrope(j, rs, name);
    if (type == "yarn") return parse_yarn(j, rs, name);
    if (type != "llama3" && type != "linear")
        throw ConfigError(fmt::format("{}: rope_scaling {} = {} is not supported (supported: llama3, linear, "
                                      "longrope, yarn); hint: remove rope_scaling to train at the base context",
                                      name, key, rs.contains(key) ? rs[key].dump() : "nothing"));
    auto number = [&](const char * field, float fallback) {
        if (!rs.contains(field)) {
            if (fallback > 0) return fallback;
            throw ConfigError(fmt::format("{}: rope_scaling of type {} needs '{}'", name, type, field));
        }
        if (const auto x = json_number<float>(rs[field])) return *x;
        throw ConfigError(fmt::format("{}: rope_scaling {} = {} is not a number in range", name, field, rs[field].dump()));
    };
    r.factor = number("factor", 0);
    if (type == "linear") {
        r.scaling = RopeScaling::linear;
        return r;
    }
    r.scaling = RopeScaling::llama3;
    r.low_freq_factor = number("low_freq_factor", 0);
    r.high_freq_factor = number("high_freq_factor", 0);
    const float original = number("original_max_position_embeddings", 0);
    if (!(original >= 1 && original <= 1e9f) || original != std::floor(original))
        throw ConfigError(fmt::format("{}: rope_scaling original_max_position_embeddings = {} must be a positive integer",
                                      name, rs["original_max_position_embeddings"].dump()));
    r.original_context = int(original);
    return r;
}

// config.json's activation_function names of the GELUs (transformers' ACT2FN); the first row of
// each kind is the one export writes.
struct GeluName {
    const char * name;
    Gelu kind;
};
constexpr GeluName kGeluNames[] = {
    {"gelu_new", Gelu::tanh}, {"gelu_pytorch_tanh", Gelu::tanh}, {"gelu_fast", Gelu::tanh}, {"gelu", Gelu::erf},
};

Gelu gelu_of(const nlohmann::json & v, const std::string & name) {
    for (const GeluName & g : kGeluNames)
        if (v.is_string() && v.get<std::string>() == g.name) return g.kind;
    std::vector<std::string> known;
    for (const GeluName & g : kGeluNames) known.push_back(g.name);
    throw ConfigError(fmt::format("{}: activation_function {} is not supported (supported: {})", name, v.dump(),
                                  fmt::join(known, ", ")));
}

// Gemma 3's own keys (Gemma3TextConfig): the gate's GELU (hidden_activation, tanh form only), the
// local RoPE base, query_pre_attn_scalar, which layers slide (layer_types, or the older
// sliding_window_pattern: every N-th layer global), and the soft-capping Gemma 2 had (refused).
void parse_gemma3_fields(const nlohmann::json & j, const std::string & name, ModelConfig & c) {
    set_gemma3(c);
    auto refuse = [&](const char * key, const std::string & why) {
        throw ConfigError(fmt::format("{}: {} = {} is not supported ({})", name, key, j[key].dump(), why));
    };
    for (const char * key : {"hidden_activation", "hidden_act"})
        if (j.contains(key) && !j[key].is_null() && gelu_of(j[key], name) != Gelu::tanh)
            refuse(key, "Gemma 3's gate is gelu_pytorch_tanh");
    for (const char * key : {"final_logit_softcapping", "attn_logit_softcapping"})
        if (j.contains(key) && !j[key].is_null()) refuse(key, "soft-capping is Gemma 2's; Gemma 3 has none");
    c.rope_local_theta = float_field(j, "rope_local_base_freq", 10000.0f, name);
    c.attn_scalar = float_field(j, "query_pre_attn_scalar", 256.0f, name);
    if (!(c.rope_local_theta > 0)) refuse("rope_local_base_freq", "a RoPE base must be positive");
    if (!(c.attn_scalar > 0)) refuse("query_pre_attn_scalar", "scores are scaled by its -1/2 power: it must be positive");
    c.sliding_pattern = int_field(j, "sliding_window_pattern", 6, name);
    if (!j.contains("layer_types") || j["layer_types"].is_null()) return;
    const nlohmann::json & types = j["layer_types"];
    if (!types.is_array()) refuse("layer_types", "a list of sliding_attention and full_attention");
    int first_global = -1;
    for (size_t l = 0; l < types.size() && first_global < 0; ++l)
        if (types[l] == "full_attention") first_global = int(l);
    c.sliding_pattern = first_global + 1;   // none global: 0, every layer slides
    for (size_t l = 0; l < types.size(); ++l)
        if (types[l] != (c.layer_global(int(l)) ? "full_attention" : "sliding_attention"))
            refuse("layer_types", fmt::format("memfit takes every N-th layer global, N = {} from the first; layer {} "
                                              "breaks the pattern", c.sliding_pattern, l));
    if (int(types.size()) != c.n_layer)
        refuse("layer_types", fmt::format("{} entries for {} layers", types.size(), c.n_layer));
}

// GPT-NeoX's own keys (GPTNeoXConfig): layer_norm_eps, rotary_emb_base (or rope_theta),
// use_parallel_residual, the MLP's GELU (hidden_act), attention_bias (true; false is refused);
// its rotary_pct is read where partial_rotary_factor is.
void parse_neox_fields(const nlohmann::json & j, const std::string & name, ModelConfig & c) {
    c.layer_norm = c.proj_bias = c.plain_mlp = true;
    auto refuse = [&](const char * key, const std::string & why) {
        throw ConfigError(fmt::format("{}: {} = {} is not supported ({})", name, key, j[key].dump(), why));
    };
    c.ln_eps = float_field(j, "layer_norm_eps", 1e-5f, name);
    if (!j.contains("rope_theta")) c.rope_theta = float_field(j, "rotary_emb_base", 10000.0f, name);
    c.parallel_residual = j.value("use_parallel_residual", true);
    c.gelu = j.contains("hidden_act") ? gelu_of(j["hidden_act"], name) : Gelu::erf;
    if (!j.value("attention_bias", true)) refuse("attention_bias", "GPT-NeoX's projections have biases");
}

// LLaMA blocks and what the model_type's row adds, with its Config's defaults.
void parse_llama_fields(const nlohmann::json & j, const LlamaType & t, const std::string & name, ModelConfig & c) {
    c.family = "llama";
    c.model_type = t.type;
    c.qkv_bias = t.qkv_bias;   // Qwen2's q, k and v projections always have biases
    c.qk_norm = t.qk_norm;     // Qwen3's q and k always have their norms
    c.qk_norm_whole = c.post_norm = t.olmo2_norms;
    c.qk_norm_whole = c.qk_norm_whole || t.qk_whole;   // OLMoE
    c.vocab_size = int_field(j, "vocab_size", t.vocab, name);
    c.max_seq = int_field(j, "max_position_embeddings", t.max_seq, name);
    c.n_embd = int_field(j, "hidden_size", name);
    c.ffn = int_field(j, "intermediate_size", name);
    c.n_layer = int_field(j, "num_hidden_layers", name);
    c.n_head = int_field(j, "num_attention_heads", name);
    c.n_kv_head = int_field(j, "num_key_value_heads", c.n_head, name);
    c.ln_eps = float_field(j, "rms_norm_eps", t.eps, name);
    c.rope_theta = float_field(j, "rope_theta", t.theta, name);
    c.tied_head = j.value("tie_word_embeddings", t.gemma3);   // Gemma3TextConfig ties by default
    if (t.window >= 0)   // absent: the Config's default; null: none (Mistral 7B v0.2 and later)
        c.sliding_window = !j.contains("sliding_window") ? t.window : int_field(j, "sliding_window", 0, name);
    auto refuse = [&](const char * key, const std::string & why) {
        throw ConfigError(fmt::format("{}: {} = {} is not supported ({})", name, key, j[key].dump(), why));
    };
    if (t.gemma3) parse_gemma3_fields(j, name, c);
    else if (t.neox) parse_neox_fields(j, name, c);
    else if (j.contains("hidden_act") && j["hidden_act"] != "silu") refuse("hidden_act", "supported: silu");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) c.rope_scaling = parse_rope_scaling(j, name);
    if (t.moe != MoeNaming::none) parse_moe_fields(j, t, name, c);
    if (t.use_sliding_window && j.value("use_sliding_window", false))
        refuse("use_sliding_window", "sliding-window attention is not implemented yet; set it to false");
    if (!t.qkv_bias && j.value("attention_bias", false)) refuse("attention_bias", "LLaMA projections have no biases");
    if (j.value("mlp_bias", false)) refuse("mlp_bias", "LLaMA projections have no biases");
    // Explicit when it differs from C / NH; Qwen3Config's default is 128.
    const int hd = j.contains("head_dim") && !j["head_dim"].is_null() ? int_field(j, "head_dim", name) : t.head_dim;
    if (hd != 0 && c.n_head > 0 && (c.n_embd % c.n_head != 0 || hd != c.n_embd / c.n_head)) c.head_size = hd;
    // Partial rotary (Phi-4-mini's 0.75, GPT-NeoX's rotary_pct 0.25): the first int(head_dim x
    // factor) dimensions turn.
    const char * pkey = t.neox ? "rotary_pct" : "partial_rotary_factor";
    const float partial = float_field(j, pkey, t.neox ? 0.25f : 1.0f, name);
    if (!(partial > 0 && partial <= 1)) refuse(pkey, "a fraction of the head, in (0, 1]");
    if (partial < 1 && c.n_head > 0) {
        c.rope_scaling.rotary_dim = int(float(c.head_dim()) * partial);
        if (c.rope_scaling.rotary_dim < 2)
            throw ConfigError(fmt::format("{}: {} = {} gives {} rotary dimensions of head_dim {}; at least 2 must turn",
                                          name, pkey, partial, c.rope_scaling.rotary_dim, c.head_dim()));
    }
}

const char * gelu_name(Gelu kind) {
    for (const GeluName & g : kGeluNames)
        if (g.kind == kind) return g.name;
    MF_UNREACHABLE();
}
}  // namespace

ModelConfig parse_hf_config(const nlohmann::json & j, const std::string & name) {
    if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", name));
    // Gemma 3 4B-27B's checkpoints are Gemma3ForConditionalGeneration (model_type gemma3): memfit
    // reads their text model (text_config, Gemma3TextConfig's defaults; the vision tower's weights
    // are skipped where weights are read) and writes it back as a gemma3_text model.
    if (const auto t = j.find("model_type"); t != j.end() && t->is_string() && *t == "gemma3") {
        if (!j.contains("text_config") || !j["text_config"].is_object())
            throw ConfigError(fmt::format("{}: model_type gemma3 without a text_config object", name));
        nlohmann::json text = j["text_config"];
        text["model_type"] = "gemma3_text";
        for (const char * key : {kTrainedContextKey, kShareLayersKey})
            if (j.contains(key) && !text.contains(key)) text[key] = j[key];
        return parse_hf_config(text, name);
    }
    ModelConfig c;
    c.name = name;
    try {
        const std::string type = j.value("model_type", "gpt2");
        if (type == "gpt2") {
            c.vocab_size = int_field(j, "vocab_size", name);
            c.max_seq = int_field(j, "n_positions", int_field(j, "n_ctx", 1024, name), name);
            c.n_embd = int_field(j, "n_embd", name);
            c.n_layer = int_field(j, "n_layer", name);
            c.n_head = int_field(j, "n_head", name);
            c.ln_eps = float_field(j, "layer_norm_epsilon", 1e-5f, name);
            c.tied_head = j.value("tie_word_embeddings", true);
            c.ffn = int_field(j, "n_inner", 0, name);
            if (j.contains("activation_function")) c.gelu = gelu_of(j["activation_function"], name);
        } else if (const LlamaType * t = find_llama_type(type)) {
            parse_llama_fields(j, *t, name, c);
        } else {
            throw ConfigError(fmt::format("{}: model_type '{}' is not supported (supported: gpt2, {})", name, type,
                                          llama_type_names()));
        }
    } catch (const nlohmann::json::exception & e) {
        throw ConfigError(fmt::format("{}: missing or malformed field ({})", name, json_error_text(e.what())));
    }
    if (c.vocab_size < 1) throw ConfigError(fmt::format("{}: vocab_size = {}, must be positive", name, c.vocab_size));
    c.trained_seq = int_field(j, kTrainedContextKey, 0, name);
    c.share_layers = int_field(j, kShareLayersKey, 1, name);
    c.validate();
    return c;
}

namespace {

// A float as the decimal it was written as (1e-05, not 9.99999974737875e-06).
double shortest(float f) { return std::stod(fmt::format("{}", f)); }

nlohmann::json rope_scaling_json(const Rope & r) {
    if (r.scaling == RopeScaling::linear) return {{"rope_type", "linear"}, {"factor", shortest(r.factor)}};
    if (r.scaling == RopeScaling::llama3)
        return {{"rope_type", "llama3"},
                {"factor", shortest(r.factor)},
                {"low_freq_factor", shortest(r.low_freq_factor)},
                {"high_freq_factor", shortest(r.high_freq_factor)},
                {"original_max_position_embeddings", r.original_context}};
    if (r.scaling == RopeScaling::longrope) {   // Phi3Config's three fields; the context goes beside it
        nlohmann::json j = {{"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
        const double s = r.factor, computed = s > 1 ? std::sqrt(1 + std::log(s) / std::log(double(r.original_context))) : 1;
        if (std::fabs(r.attention_factor - computed) > 1e-6) j["attention_factor"] = shortest(r.attention_factor);
        return j;
    }
    if (r.scaling == RopeScaling::yarn)   // every field, the computed attention_factor included
        return {{"rope_type", "yarn"},
                {"factor", shortest(r.factor)},
                {"original_max_position_embeddings", r.original_context},
                {"beta_fast", shortest(r.beta_fast)},
                {"beta_slow", shortest(r.beta_slow)},
                {"truncate", r.truncate},
                {"attention_factor", shortest(r.attention_factor)}};
    return nullptr;
}

// Gemma3TextConfig's keys beside the LLaMA ones (the layer kinds as layer_types, which
// transformers reads since 4.53; sliding_window_pattern for the older ones).
void add_gemma3_fields(const ModelConfig & cfg, nlohmann::json & j) {
    j.erase("hidden_act");
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["rope_local_base_freq"] = shortest(cfg.rope_local_theta);
    j["query_pre_attn_scalar"] = shortest(cfg.attn_scalar);
    j["sliding_window_pattern"] = cfg.sliding_pattern;
    nlohmann::json types = nlohmann::json::array();
    for (int l = 0; l < cfg.n_layer; ++l) types.push_back(cfg.layer_global(l) ? "full_attention" : "sliding_attention");
    j["layer_types"] = types;
    j["final_logit_softcapping"] = j["attn_logit_softcapping"] = nullptr;
    j["attention_bias"] = false;
}

// GPTNeoXConfig's keys (rotary_emb_base and, for transformers since 4.45, rope_theta).
nlohmann::json neox_config_json(const ModelConfig & cfg) {
    const int rot = cfg.rope_scaling.rotary_dims(cfg.head_dim());
    return {{"architectures", {"GPTNeoXForCausalLM"}},
            {"model_type", "gpt_neox"},
            {"vocab_size", cfg.vocab_size},
            {"max_position_embeddings", cfg.max_seq},
            {"hidden_size", cfg.n_embd},
            {"intermediate_size", cfg.ffn_dim()},
            {"num_hidden_layers", cfg.n_layer},
            {"num_attention_heads", cfg.n_head},
            {"hidden_act", gelu_name(cfg.gelu)},
            {"rotary_pct", shortest(float(rot) / float(cfg.head_dim()))},
            {"rotary_emb_base", shortest(cfg.rope_theta)},
            {"rope_theta", shortest(cfg.rope_theta)},
            {"rope_scaling", rope_scaling_json(cfg.rope_scaling)},
            {"layer_norm_eps", shortest(cfg.ln_eps)},
            {"use_parallel_residual", cfg.parallel_residual},
            {"attention_bias", true},
            {"tie_word_embeddings", cfg.tied_head},
            {"torch_dtype", "float32"}};
}

nlohmann::json hf_config_fields(const ModelConfig & cfg) {
    if (cfg.llama()) {
        const std::string type = cfg.model_type;
        const LlamaType * t = find_llama_type(type);
        MF_ASSERT(t);
        if (t->neox) return neox_config_json(cfg);
        nlohmann::json j = {{"architectures", {t->architecture}},
                {"model_type", type},
                {"vocab_size", cfg.vocab_size},
                {"max_position_embeddings", cfg.max_seq},
                {"hidden_size", cfg.n_embd},
                {"intermediate_size", cfg.ffn_dim()},
                {"num_hidden_layers", cfg.n_layer},
                {"num_attention_heads", cfg.n_head},
                {"num_key_value_heads", cfg.kv_heads()},
                {"head_dim", cfg.head_dim()},
                {"hidden_act", "silu"},
                {"rms_norm_eps", shortest(cfg.ln_eps)},
                {"rope_theta", shortest(cfg.rope_theta)},
                {"rope_scaling", rope_scaling_json(cfg.rope_scaling)},
                {"tie_word_embeddings", cfg.tied_head},
                {"torch_dtype", "float32"}};
        if (type == "llama") j["attention_bias"] = j["mlp_bias"] = false;
        if (t->use_sliding_window) j["use_sliding_window"] = false;
        if (type == "qwen3" || type == "olmo2") j["attention_bias"] = false;
        if (t->window >= 0)
            j["sliding_window"] = cfg.sliding_window > 0 ? nlohmann::json(cfg.sliding_window) : nlohmann::json(nullptr);
        if (cfg.rope_scaling.scaling == RopeScaling::longrope)
            j["original_max_position_embeddings"] = cfg.rope_scaling.original_context;
        if (cfg.rope_scaling.rotary_dim > 0)
            j["partial_rotary_factor"] = shortest(float(cfg.rope_scaling.rotary_dim) / float(cfg.head_dim()));
        if (t->gemma3) add_gemma3_fields(cfg, j);
        if (t->moe != MoeNaming::none) add_moe_fields(cfg, *t, j);
        if (type == "olmoe") j["clip_qkv"] = nullptr, j["attention_bias"] = false;
        return j;
    }
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", cfg.vocab_size},
            {"n_positions", cfg.max_seq},
            {"n_ctx", cfg.max_seq},
            {"n_embd", cfg.n_embd},
            {"n_layer", cfg.n_layer},
            {"n_head", cfg.n_head},
            {"n_inner", cfg.ffn > 0 ? nlohmann::json(cfg.ffn) : nlohmann::json(nullptr)},
            {"activation_function", gelu_name(cfg.gelu)},
            // GPT-2's <|endoftext|> is its BOS and EOS; a byte vocabulary has none.
            {"bos_token_id", cfg.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
            {"eos_token_id", cfg.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
            {"layer_norm_epsilon", shortest(cfg.ln_eps)},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"}};
}
}  // namespace

nlohmann::json hf_config_json(const ModelConfig & cfg) {
    nlohmann::json j = hf_config_fields(cfg);
    if (cfg.trained_seq > 0) j[kTrainedContextKey] = cfg.trained_seq;
    if (cfg.share_layers > 1) j[kShareLayersKey] = cfg.share_layers;
    return j;
}

ModelConfig load_hf_config(const std::string & path) {
    nlohmann::json j;
    try {
        j = read_json_file(path, kMaxJsonFileBytes);
    } catch (const FormatError & e) {
        throw ConfigError(e.what());
    }
    return parse_hf_config(j, path);
}

ModelConfig resolve_model(const std::string & name_or_path) {
    namespace fs = std::filesystem;
    if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json") || fs::exists(name_or_path)) {
        fs::path p(name_or_path);
        if (fs::is_directory(p)) p /= "config.json";
        return load_hf_config(p.string());
    }
    return model_preset(name_or_path);
}

}  // namespace memfit
