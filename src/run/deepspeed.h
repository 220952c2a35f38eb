// DeepSpeed's config.json (https://www.deepspeed.ai/docs/config-json/) read as memfit flags, so
// `--config ds_config.json` trains what the DeepSpeed run would: batch sizes, precision and loss
// scaling, the ZeRO stage and offload, AdamW / SGD and their hyperparameters, the warmup
// schedulers, activation checkpointing. Keys memfit has no counterpart for (bucket sizes,
// overlap_comm, monitors, ...) are listed so the caller can print them in one warning; values
// memfit would silently train differently with (NVMe offload, coupled Adam, a log warmup, ...)
// are refused with what to write instead. The table is docs/deepspeed.md.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memfit {

// The DeepSpeed keys of a config file as memfit flags.
struct DeepSpeedTranslation {
    nlohmann::json flags = nlohmann::json::object();  // memfit flag name -> value (number, string or bool)
    std::vector<std::string> ignored;  // DeepSpeed keys memfit does not implement (dotted paths), in file order
};

// Whether any top-level key of `j` is one of DeepSpeed's. "optimizer" counts only as an object
// (DeepSpeed's block); a string there is memfit's own --optimizer.
bool has_deepspeed_keys(const nlohmann::json & j);
bool has_deepspeed_keys(const nlohmann::ordered_json & j);

// Translates the DeepSpeed keys of the object `j`; every other top-level key is copied into `flags`
// unchanged (they are memfit's own flag names, checked by the caller). Throws ConfigError (one line
// that starts with `path`, names the key and its value, and says what to write instead) for a value
// memfit cannot honour, and when a DeepSpeed key and a memfit key set the same flag to different values.
// A string "auto" (what Hugging Face's Trainer writes for values it fills in) counts as absent.
// `ignored` follows the iteration order of `j`: nlohmann::json keeps keys sorted, so parse the file
// as nlohmann::ordered_json to list them in the order they were written.
DeepSpeedTranslation translate_deepspeed(const nlohmann::json & j, const std::string & path);
DeepSpeedTranslation translate_deepspeed(const nlohmann::ordered_json & j, const std::string & path);

}  // namespace memfit
