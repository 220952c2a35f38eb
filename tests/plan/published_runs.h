// The published training runs the step-time model is calibrated on, read from tests/data:
//   published_runs.json                llm-foundry's MPT table under FSDP, torchtitan's Llama 3.1 8B
//                                      (each with its whole configuration: a fixed candidate)
//   published_runs_3d_calibration.json Narayanan et al. 2021 (Table 1, Table 2's PTD-P rows) on
//                                      A100, the Megatron-LM README's H100 weak scaling (stated
//                                      layout fields fixed, the rest planned by the search)
// and the prediction of each with a given hardware catalog, so that the calibration tests and the
// efficiency fit see the same runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "plan/plan_types.h"
#include "plan/search.h"

namespace memfit::test {

// A run of published_runs.json: one fixed configuration.
struct PublishedRun {
    std::string name, hw;
    ModelConfig cfg;
    int gpus = 0, seq = 0, mb = 0, ga = 0, zero = 0;
    std::string recompute;
    double tok_s_gpu = 0;
};
std::vector<PublishedRun> published_runs();
Candidate layout_of(const PublishedRun & r);
int nodes_of(const Hardware & hw, int gpus);

// A run of published_runs_3d_calibration.json: GPT-style (a GPT-2-family config of its shape).
struct Run3D {
    nlohmann::json j;
    std::string name, hw;
    ModelConfig cfg;
    int seq = 0, gpus = 0;
    double tflops_per_gpu = 0;
    double tok_s_gpu = 0;   // published TFLOP/s per GPU over the source's own FLOPs per token
};
std::vector<Run3D> runs_3d();
// The search's best for the run, its stated fields fixed (unstated: searched, including the TP x
// PP split of a stated product and the virtual stages); nullopt when nothing fits.
std::optional<PlanResult> plan_run(const Run3D & r, const Hardware & hw);

// Predicted / published tokens/s per GPU of every run of both files on `catalog`'s kinds (those
// named `only`, when not empty), with a table row each.
struct RunRatio {
    std::string name, hw, row;
    double ratio = 0;
};
std::vector<RunRatio> calibration_ratios(const std::vector<Hardware> & catalog, const std::string & only = "");

}  // namespace memfit::test
