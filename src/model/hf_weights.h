// Hugging Face weight folders: config.json plus model.safetensors (or shards listed in
// model.safetensors.index.json), tensor names as in the Hub's checkpoints. GPT-2:
// "h.0.attn.c_attn.weight" (optionally under "transformer."), Conv1D weights [in, out], the LM
// head tied to wte. LLaMA: "model.layers.0.self_attn.q_proj.weight", Linear weights [out, in],
// "lm_head.weight" unless tie_word_embeddings. Phi-3 (model_type phi3): the same with q|k|v
// fused into "self_attn.qkv_proj.weight" and gate|up into "mlp.gate_up_proj.weight". GPT-NeoX
// (gpt_neox): "gpt_neox.layers.0.attention.query_key_value.weight" (q|k|v interleaved by head),
// "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h", "gpt_neox.embed_in",
// "gpt_neox.final_layer_norm", "embed_out" (model/llama_types.h's renames).
//
// Loading checks every tensor before copying any: a missing or unexpected tensor, or one whose
// shape differs from the config's, is a FormatError naming it. F32, F16 and BF16 are converted
// to fp32. The attention-mask buffers old checkpoints carry ("h.N.attn.bias",
// "h.N.attn.masked_bias"), LLaMA's "rotary_emb.inv_freq" and a tied "lm_head.weight" equal in
// shape to the embedding are accepted and ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/param_layout.h"
#include "model/safetensors.h"

namespace memfit {

// The layout as the model_type's checkpoints name it: where they fuse projections (Phi-3's
// qkv_proj and gate_up_proj, model/llama_types.h), the adjacent parameters a fused tensor holds
// become one entry with its name and stacked shape; otherwise `layout` itself. Loading, export
// and `memfit verify` read and write tensors through it.
ParamLayout checkpoint_layout(const ModelConfig & cfg, const ParamLayout & layout);

// A checkpoint_layout tensor's values, in place, from the checkpoint's form to memfit's and back:
// Gemma 3's RMSNorms multiply by (1 + w) and its checkpoints store w, memfit's layout the
// multiplier (ModelConfig::norm_plus_one: +1); GPT-NeoX's query_key_value interleaves q, k and
// v head by head, memfit keeps all of q, then k, then v (rows permuted). Loading, export and
// `memfit verify` apply them (PEFT adapters too: the B and DoRA magnitude rows of query_key_value);
// a gradient (gradient = true) is permuted, never shifted.
void from_checkpoint(const ModelConfig & cfg, const ParamInfo & p, float * values);
void to_checkpoint(const ModelConfig & cfg, const ParamInfo & p, float * values, bool gradient = false);

// True when `dir` holds model.safetensors or model.safetensors.index.json.
bool has_hf_weights(const std::string & dir);

// Fills params[layout.total] from the folder's weights. skip(name), when given, names tensors
// (memfit's names) that another reader takes (a GPTQ folder's packed projections): neither
// loaded nor unexpected.
void load_hf_weights(const std::string & dir, const ModelConfig & cfg, const ParamLayout & layout, float * params,
                     const std::function<bool(const std::string &)> & skip = {});
// The folder's safetensors files (model.safetensors, or the shards its index names); IoError when
// it has neither.
std::vector<std::string> hf_weight_files(const std::string & dir);
// A checkpoint's tensor name as memfit's layout names it (GPT2LMHeadModel's "transformer." prefix
// dropped, Gemma 3's multimodal prefixes mapped).
std::string checkpoint_tensor_name(const std::string & n);

// How export_hf writes the weights. dtype: "F32", "BF16" (rounded to nearest even) or "F16"
// (IEEE; a weight beyond its range, 65504, is a ConfigError naming it). Above max_shard_bytes
// (transformers' 5GB default) the tensors, in layout order, go to model-0000K-of-0000N.safetensors
// with model.safetensors.index.json (a tensor larger than a shard gets one of its own).
// config_extra is merged into config.json (the tokenizer's bos/eos/pad ids).
struct HfWriteOptions {
    std::string    dtype = "F32";
    uint64_t       max_shard_bytes = 5000000000ull;
    nlohmann::json config_extra = nlohmann::json::object();
    // Tensors written after the layout's, in the last file (a GPTQ folder's packed projections);
    // their data must outlive the call.
    std::vector<TensorToWrite> extra;
};

// "F32", "BF16", "F16" from fp32 / bf16 / fp16 (also float32, bfloat16, float16); "" otherwise.
std::string hf_dtype_name(const std::string & precision);

// What export_hf wrote: the weight files (model.safetensors, or the shards and the index) and
// the bytes of the tensors.
struct HfWritten {
    std::vector<std::string> files;
    uint64_t                 tensor_bytes = 0;
};

// Writes DIR/config.json and DIR/model.safetensors (or its shards and index) that transformers'
// GPT2LMHeadModel, LlamaForCausalLM, ... loads as-is. Each file is written atomically; weight
// files an earlier export left in DIR that this one did not write are removed after it.
HfWritten export_hf(const std::string & dir, const ModelConfig & cfg, const ParamLayout & layout, const float * params,
                    const HfWriteOptions & opts = {});

}  // namespace memfit
