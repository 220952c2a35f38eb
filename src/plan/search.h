// The configuration search of `memfit plan`: every layout and technique the request leaves
// open, enumerated and pruned (a layout whose model states alone do not fit gets no micro-batch
// sweep), each candidate's memory predicted per device (memory_model.h) and its step time
// (time_model.h); ranked by predicted tokens/s, ties by memory headroom.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "plan/memory_model.h"
#include "plan/plan_types.h"
#include "plan/time_model.h"

namespace memfit {

struct PlanRequest {
    ModelConfig cfg;
    Hardware hw;
    int gpus = 1, nodes = 1;
    int seq = 1024, global_batch = 8;
    DType compute = DType::bf16;
    Optimizer optimizer = Optimizer::adamw;
    // Fixed choices; what is unset is searched.
    std::optional<int> zero, tp, pp, micro_batch, grad_accum;   // grad_accum: per data-parallel rank
    std::optional<Offload> offload;
    // --offload optimizer's share and folder (the cpu hardware's engine offloads to files only),
    // and --master-weights, as memfit train takes them.
    double offload_fraction = 1;
    std::string offload_dir;
    MasterWeights master_weights = MasterWeights::fp32;
    // --packing (instruction data): each token's document start is one more buffer, and the
    // engine runs it with data parallelism only: tensor and pipeline layouts are left out.
    bool packing = false;
    // --loss-chunk and --mlp-chunk (TiledMLP), tokens per chunk (0: off), fixed for every candidate.
    int loss_chunk = 0, mlp_chunk = 0;
    std::optional<PipeSchedule> schedule;
    int virtual_stages = 2;                  // interleaved:V
    std::optional<bool> sp, flash;
    std::optional<std::string> recompute;
    // LoRA / QLoRA (make_lora_plan), fixed for every candidate: the search never turns it on or
    // off. Null: full fine-tuning. A packed base excludes ZeRO-3 and optimizer+params offload.
    std::shared_ptr<const LoraPlan> lora;
    // Distillation (make_distill_plan), fixed for every candidate. Null: none.
    std::shared_ptr<const DistillPlan> distill;
    size_t top = 5;
    // Say what would make each rejected candidate fit (else only the closest one).
    bool explain = false;
    // One device and engine-runnable candidates get the engine's exact numbers when set (the
    // backend whose workspace sizes apply: the CPU backend for the `cpu` hardware).
    const Backend * exact_sizing = nullptr;
};

struct PlanResult {
    Candidate c;
    DeviceMemory mem;    // what decided `fits`: exact where the engine runs it, else analytic
    StepTime time;
    bool fits = false;
    std::string why;     // rejected: what does not fit, and what would
    bool hinted = false; // `why` is final (no change of technique can help)
};

struct SearchReport {
    std::vector<PlanResult> best;       // fitting, fastest first (at most `top`)
    std::vector<PlanResult> rejected;   // the fastest candidates that did not fit (at most `top`)
    // fitting: by the analytic model, less those whose exact plan (recorded for the fastest,
    // until `top` fit) does not fit. exact_recorded: the engine programs recorded for that.
    size_t evaluated = 0, fitting = 0, pruned_layouts = 0, exact_recorded = 0;
    double seconds = 0;
};

// The most devices a search takes (--gpus): far past any cluster, and a bound on its work.
constexpr int kMaxPlannedDevices = 1 << 20;

// Every configuration listed as fitting fits by the bytes it carries (`mem`, exact where the
// engine runs it). Throws ConfigError for a request no layout can satisfy (e.g. a global batch
// the data-parallel size cannot divide, with the sizes that would).
SearchReport search_plans(const PlanRequest & r);

// The fewest devices (multiples of one, then of a node) on which some configuration fits, up to
// `limit`, with that search's report; 0 if none does.
int min_gpus(PlanRequest r, int limit, SearchReport * report);

// "dp 8 x tp 8 x pp 1, ZeRO-1, sp, 1F1B" and "micro-batch 1 x 16, recompute selective, flash".
std::string layout_name(const Layout & l);
std::string technique_name(const Candidate & c);

}  // namespace memfit
