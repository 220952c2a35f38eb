// The planner's inverse questions: instead of "does this fit?", "what is the most that fits?" —
// the longest sequence, the largest micro-batch, the largest model of a family — each answered
// by searches (search.h) of the runnable layouts, so the answer is one `memfit train` runs.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "plan/search.h"

namespace memfit {

// The largest value for which a search finds a configuration that fits, with that search.
struct Largest {
    int value = 0;            // 0: not even the smallest value fits
    int next = 0;             // the next value tried above it, which did not fit (0: none above)
    PlanRequest request;      // the request at `value`
    SearchReport report;      // its search (top = the request's)
    int searches = 0;
};

// Sequence length, in steps of kSeqStep tokens (of 1 below it) up to the model's positions.
constexpr int kSeqStep = 128;
Largest largest_seq(const PlanRequest & r);

// Micro-batch per data-parallel rank (the global batch then micro-batch x accumulation x dp),
// up to kMaxMicroBatch. ConfigError when the request fixes the global batch.
constexpr int kMaxMicroBatch = 1 << 16;
Largest largest_micro_batch(const PlanRequest & r);

// The names of the presets a --max-model value means: those whose name starts with `family`
// ("llama3", "qwen", "gpt2"), every preset for "" or "presets". ConfigError naming the families
// when none does.
std::vector<std::string> model_family(const std::string & family);

// The model with the most parameters among `models` that fits, by `make` (the request for one
// model; a ConfigError from it or its search counts as not fitting). `tried` holds each model
// looked at, largest first, with why it did not fit (empty for the answer).
struct LargestModel {
    std::string model;        // "" when none fits
    Largest at;               // value 1 when one fits
    std::vector<std::pair<std::string, std::string>> tried;
};
LargestModel largest_model(const std::vector<std::string> & models,
                           const std::function<PlanRequest(const std::string &)> & make);

}  // namespace memfit
