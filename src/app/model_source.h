// What `memfit generate` reads: a Hugging Face model folder, the same with a PEFT LoRA adapter
// folder merged in, or a training checkpoint (LoRA adapters merged into their base).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/lora.h"

namespace memfit {

// A PEFT adapter_config.json as memfit's LoRA options (r, lora_alpha, target_modules or
// "all-linear", use_dora, use_rslora); what memfit does not compute (modules_to_save, per-layer
// patterns, DoRA on the embedding or the head) is a ConfigError naming the key.
LoraOptions peft_lora_options(const ModelConfig & cfg, const nlohmann::json & adapter_config, const std::string & where);

// What `memfit generate` runs: a model folder's weights (with a PEFT adapter folder merged in when
// `adapter` is set), or a training checkpoint's (a folder, or a root: the newest; LoRA adapters
// merged into their base). tokenizer: the folder's own files, or the one the checkpoint recorded
// while its files are unchanged ("" when neither). IoError saying what writes each when `path`
// is neither.
// A GPTQ folder (infer/gptq_folder.h) also gives its packed projections: `quant` (empty for
// any other source) and `packed`, its bytes; params then holds them dequantized.
struct LoadedModel {
    ModelConfig          cfg;
    std::vector<float>   params;
    std::string          tokenizer, what;
    QuantLayout          quant;
    std::vector<uint8_t> packed;
};
LoadedModel read_model_weights(const std::string & path, const std::string & adapter = "");

}  // namespace memfit
