// Model configuration: presets and Hugging Face config.json (GPT-2 family in this issue).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memfit {

struct ModelConfig {
    std::string name;            // preset name or the config file it came from
    std::string family = "gpt2";
    int   vocab_size = 0;        // 0: take it from the training data's tokenizer
    int   max_seq    = 1024;     // n_positions
    int   n_embd     = 768;      // C
    int   n_layer    = 12;       // L
    int   n_head     = 12;       // NH
    float ln_eps     = 1e-5f;
    bool  tied_head  = true;     // LM head reads wte

    int64_t num_params() const;  // requires vocab_size > 0
    // Throws ConfigError naming the first bad field and why.
    void validate() const;
};

// Throws ConfigError listing the known presets.
ModelConfig model_preset(const std::string & name);
std::vector<std::string> preset_names();
// A Hugging Face GPT-2 config.json (model_type gpt2; n_embd, n_layer, n_head, n_positions,
// vocab_size, layer_norm_epsilon). Throws IoError / ConfigError.
ModelConfig load_hf_config(const std::string & path);
// A preset name, or a path to a config.json.
ModelConfig resolve_model(const std::string & name_or_path);

}  // namespace memfit
