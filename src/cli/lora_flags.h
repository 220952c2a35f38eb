// The LoRA flags `memfit train`, `profile`, `bench` and `plan` share (the meaning is
// train/techniques.h's lora_options). F: any struct with lora_rank, lora_alpha, lora_targets,
// lora_dropout and base_weights members.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/validators.h"

namespace memfit::cli {

template <class F>
void add_lora_flags(CLI::App * c, F & o) {
    c->add_option("--lora-rank", o.lora_rank,
                  "LoRA: freeze the base and train rank-R adapters on --lora-targets (0: train every parameter)")
        ->capture_default_str()->check(kNonNegative);
    c->add_option("--lora-alpha", o.lora_alpha, "LoRA: the adapters' output is scaled by alpha / rank")
        ->capture_default_str();
    c->add_option("--lora-targets", o.lora_targets,
                  "LoRA: modules to adapt, q,k,v,o,gate,up,down or all (GPT-2: c_attn, c_proj, c_fc; default q,v | c_attn)");
    c->add_option("--lora-dropout", o.lora_dropout,
                  "LoRA: dropout probability on the adapters' input while training (0: none)")
        ->capture_default_str();
    c->add_option("--base-weights", o.base_weights,
                  "LoRA: storage of the frozen base: the compute precision (bf16, fp16, fp32), int8 (per-channel) or "
                  "nf4 (4-bit NormalFloat, blocks of 64, double-quantized scales, as QLoRA)")
        ->capture_default_str();
}

}  // namespace memfit::cli
