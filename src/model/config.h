// Model configuration: presets and Hugging Face config.json, for the two families.
//
//   gpt2   learned positions, LayerNorm with bias, biased Conv1D projections, GELU MLP of 4C
//          (tanh approximation, or exact), LM head tied to the token embedding
//   llama  rotary positions (rotate-half, rope_theta), RMSNorm, no biases, SwiGLU MLP of
//          ffn_dim, grouped-query attention (n_kv_head <= n_head), LM head tied or not; its
//          model_types qwen2 (q/k/v biases), qwen3 (q/k norms), mistral (sliding window), phi3,
//          olmo2 (norms after the sublayers), gemma3_text and gpt_neox (model/llama_types.h)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/activation.h"
#include "backend/rope.h"

namespace memfit {

// Mixture of experts (model/moe.h): in each sparse layer the MLP is `experts` SwiGLU experts of
// width `ffn`, a router (a linear map to one logit per expert) sending each token to top_k of
// them with the softmax weights (renormalised over the k when norm_topk). Layer l is sparse
// unless listed in dense_layers (Qwen's mlp_only_layers), every sparse_step-th layer
// (decoder_sparse_step). The training loss adds aux_coef x transformers' load-balancing loss
// over every sparse layer's router logits together (router_aux_loss_coef, when config.json's
// output_router_logits is true) and z_coef x the router z-loss (router_z_loss_coef).
struct MoeConfig {
    int   experts = 0;        // num_local_experts (Mixtral), num_experts (Qwen, OLMoE); 0: dense
    int   top_k = 2;          // num_experts_per_tok
    int   ffn = 0;            // each expert's width (moe_intermediate_size; Mixtral, OLMoE: intermediate_size)
    bool  norm_topk = true;   // norm_topk_prob (Mixtral always renormalises)
    int   sparse_step = 1;    // decoder_sparse_step
    std::vector<int> dense_layers;   // mlp_only_layers
    float aux_coef = 0;       // router_aux_loss_coef while output_router_logits, else 0
    float aux_coef_off = 0;   // router_aux_loss_coef as written while output_router_logits is false
    float z_coef = 0;         // router_z_loss_coef
    // Qwen2-MoE's shared expert: a SwiGLU MLP of this width over every token, scaled per token by
    // sigmoid(shared_expert_gate . x) and added to the experts' output (0: none).
    int   shared_ffn = 0;
    // Expert parallelism (model/expert_parallel.h): this model holds the ep_rank-th of ep_ranks
    // equal shares of the experts (ep_local_config; 1: all of them), and routes with this many
    // rows per expert and source rank per unit of the fair share (Megatron-LM's capacity factor).
    int   ep_ranks = 1, ep_rank = 0;
    float capacity_factor = 0;
    int   ep_data_ranks = 1;   // every data-parallel rank (the routing statistics' sum is theirs)
    bool  ep_drop_probs = true;   // past the capacity: the least probable rows dropped (else the last)
    int local_experts() const { return experts / ep_ranks; }
    int first_expert() const { return ep_rank * local_experts(); }
    bool enabled() const { return experts > 0; }
    bool layer(int l) const {
        if (experts <= 0 || (l + 1) % sparse_step != 0) return false;
        return std::find(dense_layers.begin(), dense_layers.end(), l) == dense_layers.end();
    }
};

struct ModelConfig {
    std::string name;            // preset name or the config file it came from
    std::string family = "gpt2"; // gpt2 | llama
    int   vocab_size = 0;        // 0: take it from the training data's tokenizer
    int   max_seq    = 1024;     // n_positions / max_position_embeddings
    int   n_embd     = 768;      // C
    int   n_layer    = 12;       // L
    int   n_head     = 12;       // NH
    int   n_kv_head  = 0;        // KVH (llama; 0: = n_head)
    int   ffn        = 0;        // MLP width (llama intermediate_size; 0: 4C)
    int   head_size  = 0;        // head dimension (llama head_dim; 0: n_embd / n_head)
    float rope_theta = 10000.0f; // llama
    // llama: config.json's rope_scaling (backend/rope.h): none, linear (factor) or llama3
    // (Llama 3.1/3.2: factor, low/high frequency factors, original_max_position_embeddings).
    Rope  rope_scaling;          // its theta is unused: rope() takes rope_theta
    float ln_eps     = 1e-5f;    // layer_norm_epsilon / rms_norm_eps
    bool  tied_head  = true;     // LM head reads the token embedding
    // gpt2 family: the MLP's GELU, config.json's activation_function ("gelu_new" and its tanh
    // aliases, or "gelu": the exact erf form).
    Gelu  gelu = Gelu::tanh;
    // The llama family's config.json model_type: llama, qwen2 (biases on q, k and v), qwen3
    // (per-head RMSNorm on q and k before RoPE) or mistral (sliding_window). Export writes it back
    // with its architecture class.
    std::string model_type = "llama";
    bool  qkv_bias   = false;    // llama family: q, k and v have biases (Qwen2)
    bool  qk_norm    = false;    // llama family: q_norm and k_norm, RMSNorm over each head (Qwen3)
    // OLMo 2 (model_type olmo2): q_norm over all of q and k_norm over all of k (not each head),
    // and each block's two norms on its attention and MLP outputs before the residual adds
    // (post_attention_layernorm, post_feedforward_layernorm) instead of on their inputs.
    bool  qk_norm_whole = false;
    bool  post_norm  = false;
    int   sliding_window = 0;    // mistral: each query attends to at most this many keys (0: all)
    // Gemma 3 (model_type gemma3_text). The MLP's gate GeGLU (glu gelu_tanh). sandwich_norm: the
    // blocks keep their norms on the attention's and the MLP's inputs and add two on their
    // outputs (post_attention_layernorm, post_feedforward_layernorm). norm_plus_one: checkpoints
    // store each RMSNorm weight w of a (1 + w) multiplier, memfit's layout holds the multiplier
    // (model/hf_weights.h shifts on the way in and out). The embedding's output times sqrt(C)
    // (scale_embed). Every sliding_pattern-th layer attends to all keys, the others within
    // sliding_window, with plain RoPE of base rope_local_theta (the global layers: rope_theta and
    // rope_scaling). Scores are scaled by attn_scalar^-1/2 (query_pre_attn_scalar; 0: head_dim).
    // GPT-NeoX (model_type gpt_neox, Pythia): LayerNorm with biases (layer_norm), biases on the
    // o, fc and down projections too (proj_bias; q, k, v: qkv_bias), an ungated MLP act(fc) of
    // width ffn with the GELU `gelu` (plain_mlp), and attention and the MLP reading the same
    // input, their outputs both added to it (parallel_residual).
    bool  layer_norm = false;
    bool  proj_bias = false;
    bool  plain_mlp = false;
    bool  parallel_residual = false;
    Glu   glu = Glu::silu;
    bool  sandwich_norm = false;
    bool  norm_plus_one = false;
    bool  scale_embed = false;
    int   sliding_pattern = 0;   // 0: every layer alike
    float rope_local_theta = 0;  // 0: rope_theta
    float attn_scalar = 0;
    // ALBERT's cross-layer sharing: groups of this many consecutive blocks use one stored block's
    // weights (block l reads stored block l / share_layers), memfit's key kShareLayersKey.
    int   share_layers = 1;
    // Positions training has covered (config.json's memfit_trained_context): a model trained at
    // --seq 128 with 256 positions never trained 128-255. 0: unknown, taken as all of max_seq (a
    // pretrained Hub model). Generation stays inside it unless asked for more.
    int   trained_seq = 0;
    MoeConfig moe;               // mixtral, qwen3_moe, olmoe (llama family)

    bool llama() const { return family == "llama"; }
    Rope rope() const {
        Rope r = rope_scaling;
        r.theta = rope_theta;
        return r;
    }
    // Layer l's window (0: all keys) and rotary embedding.
    bool layer_global(int l) const { return sliding_pattern > 0 && (l + 1) % sliding_pattern == 0; }
    int layer_window(int l) const { return layer_global(l) ? 0 : sliding_window; }
    Rope layer_rope(int l) const {
        if (rope_local_theta <= 0 || layer_global(l)) return rope();
        Rope r(rope_local_theta);
        r.rotary_dim = rope_scaling.rotary_dim;
        return r;
    }
    // The multiplier of the attention scores' 1 / sqrt(head_dim) that gives attn_scalar^-1/2.
    float score_scale() const { return attn_scalar > 0 ? std::sqrt(float(head_dim()) / attn_scalar) : 1.0f; }
    float embed_scale() const { return scale_embed ? std::sqrt(float(n_embd)) : 1.0f; }
    int head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
    // Width of the attention output (the input of the output projection): NH * head_dim; n_embd
    // unless head_dim is explicit (a tensor-parallel rank's heads, or a config that sets it).
    int attn_dim() const { return n_head * head_dim(); }
    int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    int ffn_dim() const { return ffn > 0 ? ffn : 4 * n_embd; }
    // The q and k norms as the qk_norm kernels take them: groups of q (then of k) in a row, each
    // normalised over its own width: the heads (Qwen3), or one group each (OLMo 2, whose
    // validate() asks for as many KV heads as heads).
    int qk_norm_q_groups() const { return qk_norm_whole ? 1 : n_head; }
    int qk_norm_k_groups() const { return qk_norm_whole ? 1 : kv_heads(); }
    int qk_norm_width() const { return qk_norm_whole ? attn_dim() : head_dim(); }
    // Width of the fused q|k|v projection: (NH + 2 KVH) * head_dim.
    int qkv_dim() const { return (n_head + 2 * kv_heads()) * head_dim(); }
    // A gated MLP: act(gate) * up (the llama family but GPT-NeoX).
    bool gated() const { return llama() && !plain_mlp; }
    // Width of the first MLP matmul's output: 4C (gpt2), [gate | up] = 2 ffn (llama), ffn (gpt_neox).
    int fc_dim() const { return gated() ? 2 * ffn_dim() : ffn_dim(); }
    // The positions generation may use without walking into untrained ones.
    int trained_context() const { return trained_seq > 0 ? std::min(trained_seq, max_seq) : max_seq; }

    // "llama, 2 layers, 64 channels, 4 heads (2 KV), MLP 176"
    std::string describe() const;
    // Stored blocks, and the one block l reads (share_layers).
    int stored_layers() const { return (n_layer + share_layers - 1) / share_layers; }
    int stored_block(int l) const { return l / share_layers; }
    int64_t num_params() const;      // stored (shared blocks once); requires vocab_size > 0
    int64_t compute_params() const;  // as if unshared: the weights a token's matmuls read (every expert)
    // The weights one token's matmuls read: compute_params with top_k experts of each sparse layer.
    int64_t active_params() const;
    // Mixture of experts: whether layer l's MLP is the experts, and how many layers' are.
    bool moe_layer(int l) const { return moe.layer(l); }
    int moe_layers() const;
    // Layer l's MLP width (its experts' or the dense MLP's) and its first matmul's output width.
    int layer_ffn(int l) const { return moe_layer(l) ? moe.ffn : ffn_dim(); }
    int layer_fc_dim(int l) const { return moe_layer(l) ? 2 * moe.ffn : fc_dim(); }
    // What one token's MLP matmuls compute, its first matmul's outputs and its activation's: a
    // mixture's k experts and shared expert (its sparse layers), else fc_dim() and ffn_dim().
    int64_t active_fc_dim() const {
        return moe.enabled() ? int64_t(moe.top_k) * 2 * moe.ffn + 2 * int64_t(moe.shared_ffn) : fc_dim();
    }
    int64_t active_ffn() const { return moe.enabled() ? int64_t(moe.top_k) * moe.ffn + moe.shared_ffn : ffn_dim(); }
    // Throws ConfigError naming the first bad field and why.
    void validate() const;
};

// Dense FLOPs per token of training (forward + backward): 6 N + 12 L H T, N the parameters that
// multiply (not GPT-2's position table nor an untied LLaMA input embedding: lookups), H =
// n_embd, T = seq (attention's QK^T and AV over the full T x T; PaLM, Chowdhery et al. 2022).
// The MFU of `memfit bench` and `memfit plan`. ConfigError when vocab_size is 0.
double train_flops_per_token(const ModelConfig & cfg, int seq);

// Throws ConfigError listing the known presets.
ModelConfig model_preset(const std::string & name);
std::vector<std::string> preset_names();
// A Hugging Face config.json: model_type gpt2 (n_embd, n_layer, n_head, n_positions, vocab_size,
// layer_norm_epsilon) or llama, qwen2, qwen3, mistral (hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, max_position_embeddings, rms_norm_eps, rope_theta,
// rope_scaling of rope_type llama3 or linear, tie_word_embeddings, head_dim, sliding_window), both with memfit's kTrainedContextKey (ModelConfig::trained_seq) when
// present. Throws IoError / ConfigError.
ModelConfig load_hf_config(const std::string & path);
// The same from parsed JSON; `name` names the source in errors.
ModelConfig parse_hf_config(const nlohmann::json & j, const std::string & name);
// The config.json transformers loads (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM or MistralForCausalLM), plus the trained
// context when known (transformers keeps unknown keys as config attributes).
nlohmann::json hf_config_json(const ModelConfig & cfg);
constexpr const char * kTrainedContextKey = "memfit_trained_context";
// ModelConfig::share_layers in a checkpoint's config (memfit's own reload; export expands the
// blocks and leaves it out, so that transformers loads a plain model).
constexpr const char * kShareLayersKey = "memfit_share_layers";
// A preset name, or a path to a config.json or a folder holding one.
ModelConfig resolve_model(const std::string & name_or_path);

}  // namespace memfit
