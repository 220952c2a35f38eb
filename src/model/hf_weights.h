// Hugging Face weight folders: config.json plus model.safetensors (or shards listed in
// model.safetensors.index.json), tensor names as in the Hub's checkpoints. GPT-2:
// "h.0.attn.c_attn.weight" (optionally under "transformer."), Conv1D weights [in, out], the LM
// head tied to wte. LLaMA: "model.layers.0.self_attn.q_proj.weight", Linear weights [out, in],
// "lm_head.weight" unless tie_word_embeddings.
//
// Loading checks every tensor before copying any: a missing or unexpected tensor, or one whose
// shape differs from the config's, is a FormatError naming it. F32, F16 and BF16 are converted
// to fp32. The attention-mask buffers old checkpoints carry ("h.N.attn.bias",
// "h.N.attn.masked_bias"), LLaMA's "rotary_emb.inv_freq" and a tied "lm_head.weight" equal in
// shape to the embedding are accepted and ignored.
#pragma once

#include <string>

#include "model/config.h"
#include "model/param_layout.h"

namespace memfit {

// True when `dir` holds model.safetensors or model.safetensors.index.json.
bool has_hf_weights(const std::string & dir);

// Fills params[layout.total] from the folder's weights.
void load_hf_weights(const std::string & dir, const ModelConfig & cfg, const ParamLayout & layout, float * params);

// Writes DIR/config.json and DIR/model.safetensors (F32) that transformers' GPT2LMHeadModel or
// LlamaForCausalLM loads as-is. Each file is written atomically.
void export_hf(const std::string & dir, const ModelConfig & cfg, const ParamLayout & layout, const float * params);

}  // namespace memfit
