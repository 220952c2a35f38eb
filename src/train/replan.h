// Run-time re-planning: when memory runs short during training (an allocation fails, or the
// budget is lowered while the run goes on), the step is redone with half the micro-batch and
// twice the accumulation, so the global batch, and with it the optimisation, is unchanged.
// The training state (weights, AdamW moments, step count, loss scale) moves into an engine
// planned for the new shape; a step that failed had not reached its optimizer, so nothing is
// lost and the parameters are those of a run that used the smaller micro-batch from that step.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/engine.h"

namespace memfit {

// Half the micro-batch, twice the accumulation; nullopt when the micro-batch is odd, or when half
// of it would split a preference pair.
std::optional<EngineOptions> halve_micro_batch(const EngineOptions & eo);

// Replaces `engine` by one planned for `eo`, carrying the training state over. The old engine's
// memory is returned before the new one obtains its own.
void rebuild_engine(std::unique_ptr<Engine> & engine, const ModelConfig & cfg, Backend & backend,
                    const EngineOptions & eo);

// Halves the micro-batch until the plan fits `budget` and rebuilds the engine if that changed
// anything. Throws OutOfMemory (naming the smallest plan) when no micro-batch fits.
void shrink_to_budget(std::unique_ptr<Engine> & engine, const ModelConfig & cfg, Backend & backend,
                      uint64_t budget, std::vector<std::string> & notes);

// One optimizer step on global-batch inputs (B*grad_accum sequences end to end, and their
// document starts with packed documents) that survives OutOfMemory: re-plans with a smaller
// micro-batch and redoes the step. Each re-plan adds a line to `notes`.
StepResult resilient_step(std::unique_ptr<Engine> & engine, const ModelConfig & cfg, Backend & backend,
                          const int32_t * inputs, const int32_t * targets, const OptimHyper & h,
                          std::vector<std::string> & notes, const int32_t * doc_start = nullptr,
                          const float * ref_logps = nullptr);

// `--budget-file PATH`: a control file holding a size ("512MiB"), polled before every step.
// poll() returns the budget when the file's text changed since the last poll (nothing while the
// file is absent); the trainer then shrinks the run to it. ConfigError on text that is not a size.
class BudgetFile {
public:
    explicit BudgetFile(std::string path) : path_(std::move(path)) {}
    // The new budget when the file changed. A value that is no size leaves the budget as it was
    // and says why in *warning.
    std::optional<uint64_t> poll(std::string * warning = nullptr);

private:
    std::string path_, last_;
};

}  // namespace memfit
