// One device's run (RunConfig) resolved into EngineOptions: precision, attention, loss chunking,
// recompute policy (including `budget`, solved against the memory budget) and `--fit auto`,
// which searches micro-batch x accumulation x precision x attention x recomputation x loss
// chunk for the highest predicted throughput whose exact plan fits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "memory/budget.h"
#include "model/config.h"
#include "run/run_config.h"
#include "train/engine.h"

namespace memfit {

// The LoRA options of the run, checked against the model and the compute precision.
LoraOptions lora_options(const RunConfig & r, const ModelConfig & cfg, DType compute);
// The distillation options of the run: the teacher's configuration (resolve_model of --teacher),
// checked against the student `cfg` (vocabulary, context) and the compute precision.
DistillOptions distill_options(const RunConfig & r, const ModelConfig & cfg, DType compute);
// --objective dpo and its flags as the engine takes them (reference auto resolved: adapters-off
// under LoRA, else copy); disabled options for --objective lm. ConfigError for DPO flags without
// --objective dpo and for values out of range.
PreferenceOptions preference_options(const RunConfig & r);

// --loss-chunk auto (RunConfig::loss_chunk < 0): rows per LM-head + loss chunk when the whole
// fp32 logits would be at least kAutoChunkMinBytes and a quarter of the step's unchunked peak
// (planned exactly for `eo`), else 0: the rows of kAutoChunkShare of the logits, a multiple of
// 64 and at least kAutoChunkMinRows. The analytic planner applies the same rule (memory_model.h).
// The peak is the training step's without evaluation, and a pipeline's with one micro-batch (on
// its last stage, which holds the head; the others never chunk), so the choice does not depend on
// who asks or on the micro-batches in flight.
constexpr uint64_t kAutoChunkMinBytes = uint64_t(64) << 20;
constexpr int kAutoChunkMinRows = 512, kAutoChunkShare = 8;
int auto_chunk_rows(int64_t rows);   // the chunk for `rows` tokens when chunking
int auto_loss_chunk(const ModelConfig & cfg, const Backend & backend, EngineOptions eo);

// The engine's options for one rank's program of `r` (micro_batch per rank, layout.dp the
// data-parallel ranks; pp_stage: the stage whose program it is): the one place they are built.
// Asks run/compat.h whether the engine runs it (ConfigError otherwise).
EngineOptions engine_options(const RunConfig & r, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                             int pp_stage = 0);

struct ResolvedRun {
    EngineOptions eo;
    std::vector<std::string> notes;   // what --fit auto / --recompute budget chose and why
};

// What resolve_run throws when --fit auto or --recompute budget finds nothing that fits: the
// smallest configuration it tried, whose plan the trainer draws.
class PlanRefused : public OutOfMemory {
public:
    PlanRefused(const std::string & what, const EngineOptions & smallest_tried)
        : OutOfMemory(what), smallest(smallest_tried) {}
    EngineOptions smallest;
};

// Resolves `r` for `cfg` within r.budget bytes (0: no budget). Throws ConfigError for what the
// engine does not run and PlanRefused when --fit auto or --recompute budget finds nothing that
// fits (the message gives the smallest configuration's needs per category).
ResolvedRun resolve_run(const RunConfig & r, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                        int pp_stage = 0);

}  // namespace memfit
