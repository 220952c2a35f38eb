// `memfit export`: a training checkpoint as a Hugging Face folder.
//
// A full checkpoint's state holds the whole model: it is written as config.json +
// model.safetensors. A LoRA checkpoint's state holds only the adapters (make_lora_layout order);
// its meta records the options (lora_json) and where the frozen base came from ("base_model": the
// Hugging Face folder's absolute path, or "" for the seed's random initialisation). It exports in
// one of two ways:
//
//   merge_lora    a plain folder with the adapters folded into the base (merge_lora), loadable
//                 without PEFT. The base is rebuilt as training computed with it: an engine with
//                 the checkpoint's LoRA options is initialised from the seed, given the base
//                 folder's weights, and its base read back (Engine::base_weights). For an int8
//                 or nf4 base that is the dequantized weights the adapters were trained against.
//                 For a compute-dtype base it is the fp32 source weights: the meta does not record
//                 the run's precision, and a bf16 run's bf16-rounded base differs from the source
//                 by at most bf16 rounding, below what the adapters resolve.
//   adapter_only  PEFT's adapter folder: adapter_config.json (LoraConfig's fields) and
//                 adapter_model.safetensors with the adapters in fp32 under PEFT's names, which
//                 PeftModel.from_pretrained loads onto the base folder.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/lora.h"
#include "train/checkpoint.h"

namespace memfit {

enum class ExportMode : uint8_t { plain, merge_lora, adapter_only };

// How a model folder's weights are written (export_hf's HfWriteOptions, as the user names them).
struct ExportFormat {
    std::string dtype;                              // fp32 | bf16 | fp16; "": the run's --precision
    uint64_t    max_shard_bytes = 5000000000ull;    // transformers' save_pretrained default, 5GB
};

// The run's tokenizer files a checkpoint records ("tokenizer" names the tokenizer.json or
// tokenizer.model; its tokenizer_config.json and chat_template.jinja beside it) with their content
// digests, {file name: digest}: `memfit export` copies only files that still have them. Empty for
// gpt2, bytes, or files that are gone.
nlohmann::json tokenizer_file_digests(const std::string & tokenizer);

// The model a checkpoint's meta records (FormatError naming `what` when it has none).
ModelConfig checkpoint_model_config(const Checkpoint & c, const std::string & what);

// What a LoRA checkpoint's meta records besides the model.
struct LoraCheckpointMeta {
    LoraOptions lora;
    std::string base_model;   // "" : the base is init_params(seed)'s
    std::string base_digest;  // its weights' digest as the run loaded them ("": not recorded)
    uint64_t    seed = 0;
};
bool is_lora_checkpoint(const Checkpoint & c);
// FormatError naming `what` on a malformed record or a state whose size is not the adapters'.
LoraCheckpointMeta lora_checkpoint_meta(const Checkpoint & c, const ModelConfig & cfg, const std::string & what);

// The whole model's fp32 weights (make_param_layout order) with the adapters folded in.
// base_folder: where the base's weights are ("" = the recorded base_model). IoError naming the
// folder when it holds no weights.
std::vector<float> merged_lora_weights(const Checkpoint & c, const ModelConfig & cfg, const std::string & what,
                                       const std::string & base_folder = "");

// The whole model's weights (make_param_layout order) with `adapters` (make_lora_layout order)
// folded into the base as training computed with it: `base` a folder ("": init_params(seed)),
// its weights' digest checked against want_digest when that is set. `what` names the source in
// errors, recorded_base the folder the adapters were trained on.
std::vector<float> fold_adapters(const ModelConfig & cfg, const LoraOptions & lora, const std::string & base,
                                 uint64_t seed, const std::vector<float> & adapters, const std::string & want_digest,
                                 const std::string & what, const std::string & recorded_base);

// PEFT's adapter_config.json for these options.
nlohmann::json peft_adapter_config(const ModelConfig & cfg, const LoraOptions & lora, const std::string & base_model);

// Writes checkpoint `path` (a checkpoint folder, or a root holding several: the newest) into
// folder `out` as `mode` says (a model folder also gets the run's tokenizer.json or
// tokenizer.model, with its tokenizer_config.json and chat_template.jinja, when the checkpoint
// names one that still exists); base_model overrides a LoRA checkpoint's recorded base folder.
// A model folder also gets generation_config.json, and config.json the tokenizer's bos/eos ids
// (eos: the end-of-text token and, for a chat template, its end-of-turn token, so that
// transformers' generate stops at the end of a reply). ConfigError when the mode does not suit
// the checkpoint. Returns one line saying what it wrote.
std::string export_checkpoint(const std::string & path, const std::string & out, ExportMode mode,
                              const std::string & base_model = "", const ExportFormat & format = {});

// The folder's tokenizer ids as config.json and generation_config.json carry them:
// {"bos_token_id", "eos_token_id" (one id, or [end-of-turn, end-of-text] for a chat template),
// "pad_token_id"}; ids the tokenizer does not have are left out. `kind` is what make_tokenizer
// takes ("" or "bytes": none).
nlohmann::json tokenizer_token_ids(const std::string & kind);

}  // namespace memfit
