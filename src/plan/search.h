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

// A search: the run as `memfit train` takes it (RunConfig) on a cluster, with the layout and
// technique choices it leaves open searched. Every candidate is a copy of `run` with the searched
// fields set, so a plan is a RunConfig plus the layout it chose.
struct PlanRequest {
    ModelConfig cfg;
    Hardware hw;
    int gpus = 1;
    int nodes = 0;   // 0: as many as the devices fill (per_node each)
    // seq, global_batch (0: micro_batch x grad_accum per data-parallel rank, whatever dp a layout
    // has: both must then be fixed), precision, optimizer, master weights, packing, loss and MLP
    // chunks, offload fraction and folder, LoRA and distillation settings, seed, ...
    RunConfig run = planned_run();
    // Fixed choices; what is unset is searched.
    std::optional<int> zero, tp, pp, micro_batch, grad_accum;   // grad_accum: per data-parallel rank
    std::optional<Offload> offload;
    std::optional<bool> offload_acts;        // --offload activations (searched on GPUs without pipelines)
    std::optional<int> cp;                   // --cp (searched from kCpSearchSeq positions on)
    std::optional<int> ep;                   // --ep (a mixture of experts: searched over the data ranks)
    std::optional<PipeSchedule> schedule;
    int virtual_stages = 2;                  // interleaved:V
    std::optional<bool> sp, flash;
    std::optional<std::string> recompute;
    // LoRA / QLoRA (make_lora_plan of run.lora), fixed for every candidate: the search never
    // turns it on or off. Null: full fine-tuning.
    std::shared_ptr<const LoraPlan> lora;
    // Distillation (make_distill_plan), fixed for every candidate. Null: none.
    std::shared_ptr<const DistillPlan> distill;
    // Predict an engine that overlaps tensor-parallel collectives (Candidate::tp_comm_overlap).
    bool tp_comm_overlap = false;
    size_t top = 5;
    // Say what would make each rejected candidate fit (else only the closest one).
    bool explain = false;
    // Also rank the layouts `memfit train` refuses on this hardware's backend (marked, with the
    // reason); by default they are counted and the fastest that fits is named, not listed.
    bool include_plan_only = false;
    // Look for a change that makes a search with nothing that fits succeed (the hint).
    bool hint = true;
    // The backend whose scratch sizes apply (the CPU backend for the `cpu` hardware, the CUDA
    // sizing backend for a GPU): candidates whose program the engine can record get its exact
    // numbers. Null: the analytic model only.
    const Backend * exact_sizing = nullptr;

    // The defaults of a planned run: bf16 at 1,024 tokens, global batch 8.
    static RunConfig planned_run();
};

struct PlanResult {
    Candidate c;
    DeviceMemory mem;    // what decided `fits`: exact where the engine records it, else analytic
    StepTime time;
    bool fits = false;
    std::string why;     // rejected: what does not fit, and what would
    bool hinted = false; // `why` is final (no change of technique can help)
    // Why `memfit train` refuses this configuration on the hardware's backend (run/compat.h's
    // unsupported(), the rule set train itself asks); empty: it runs.
    std::string refused;
    bool runnable() const { return refused.empty(); }
};

struct SearchReport {
    std::vector<PlanResult> best;       // fitting, fastest first (at most `top`)
    std::vector<PlanResult> rejected;   // the fastest candidates that did not fit (at most `top`)
    // Of every candidate that did not fit, the one needing the fewest bytes (what "nothing fits:
    // closest" names, with the change that would make it fit where one was found); empty if none.
    std::vector<PlanResult> closest;
    // Fitting by the analytic model but refused by `memfit train` (not listed unless
    // include_plan_only): how many, and the fastest few (exact where the engine records them).
    size_t plan_only = 0;
    std::vector<PlanResult> plan_only_best;
    // fitting: by the analytic model, less those whose exact plan (recorded for the fastest,
    // until `top` fit) does not fit. exact_recorded: the engine programs recorded for that.
    size_t evaluated = 0, fitting = 0, pruned_layouts = 0, exact_recorded = 0;
    double seconds = 0;
    // When nothing fits: a change that was checked to make something fit (a flag to add or drop),
    // or what is left (more devices); never one the request already has.
    std::string hint;
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

// Where `memfit train` runs on this hardware: "cpu" for the `cpu` entry, else "cuda".
std::string planned_device(const Hardware & hw);

// The run `memfit train` is given for a candidate: its RunConfig at the hardware's device, LoRA
// and distillation from their plans.
RunConfig planned_train_run(const PlanRequest & r, const Candidate & c);

// "dp 8 x tp 8 x pp 1, ZeRO-1, sp, 1F1B" and "micro-batch 1 x 16, recompute selective, flash".
std::string layout_name(const Layout & l);
std::string technique_name(const Candidate & c);

}  // namespace memfit
