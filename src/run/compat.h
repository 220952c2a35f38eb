// What combines: the one place that says whether the engine runs a configuration. The engine,
// the trainer, `--fit auto` and the planner (exact plan or analytic only) all ask it.
#pragma once

#include <optional>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "run/run_config.h"

namespace memfit {

// The reason (one line, with the numbers and what to use instead) that the engine cannot run
// `r` for `cfg`, or nothing. micro_batch is the per-rank one; grad_accum the pipeline's
// micro-batches per step. `backend`: the kernels that would run it (flash attention's head
// dimensions), null when none is known. r.device names where it executes ("": a plan, any
// device).
std::optional<std::string> unsupported(const RunConfig & r, const ModelConfig & cfg, const Backend * backend);

// The layout's numbers outside what any run can be (ZeRO 0-3, tensor and pipeline sizes,
// bucket size): the part of unsupported() that the planner, which models more than the engine
// runs, also asks.
std::optional<std::string> out_of_range(const RunConfig & r);

// The model a run trains: resolve_model(r.model) with --attention-window applied. A llama
// model with a window becomes a mistral one (Mistral is LLaMA plus sliding_window, and exports
// as MistralForCausalLM); GPT-2, Qwen2 and Qwen3 models are refused in one line.
ModelConfig run_model(const RunConfig & r);

// Throws ConfigError with unsupported()'s reason.
void check_supported(const RunConfig & r, const ModelConfig & cfg, const Backend * backend);

}  // namespace memfit
