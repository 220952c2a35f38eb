// Mixture-of-experts config.json keys and parameter names (ModelConfig::moe), for the llama
// family's MoE model_types (model/llama_types.h): mixtral (MixtralConfig), qwen3_moe
// (Qwen3MoeConfig) and olmoe (OlmoeConfig).
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"
#include "model/llama_types.h"

namespace memfit {

// Reads the MoE keys of a `t.moe` type into c.moe: the experts (num_local_experts |
// num_experts), num_experts_per_tok, the experts' width (intermediate_size | moe_intermediate_size),
// norm_topk_prob, decoder_sparse_step, mlp_only_layers, router_aux_loss_coef (applied while
// output_router_logits is true, as transformers' ForCausalLM does) and router_z_loss_coef.
// ConfigError naming the key for what memfit does not run (router_jitter_noise, clip_qkv,
// shared experts).
void parse_moe_fields(const nlohmann::json & j, const LlamaType & t, const std::string & name, ModelConfig & c);
// The same keys written back, as the type's Config names them.
void add_moe_fields(const ModelConfig & cfg, const LlamaType & t, nlohmann::json & j);

// A MoE preset's experts (model_preset's table rows of the MoE types: count, top-k, width,
// norm_topk_prob, the aux-loss coefficient a run from scratch applies, head_dim); nothing for
// another name.
void apply_moe_preset(const std::string & name, ModelConfig & c);

// Parameter names inside block prefix h ("model.layers.3."): the router [E, C] and expert e's
// gate, up [F, C] and down [C, F] matrices.
enum class ExpertPart { gate, up, down };
std::string router_param(const ModelConfig & cfg, const std::string & h);
std::string expert_param(const ModelConfig & cfg, const std::string & h, int e, ExpertPart part);

// ConfigError naming the first bad MoE field (ModelConfig::validate).
void validate_moe(const ModelConfig & cfg, const LlamaType * t);

}  // namespace memfit
