// Engine: one model configuration made runnable. It records the training (and evaluation)
// step programs, places them, checks the placement against the memory budget before obtaining
// anything, obtains the regions, and executes steps with the ledger measuring live and
// reserved bytes per category as they happen.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "memory/timeline.h"
#include "train/step.h"

namespace memfit {

struct EngineOptions {
    int      B = 8, T = 256;
    bool     with_eval = true;       // also build the forward+loss program for validation
    bool     checking = false;       // own allocation per buffer, poisoned after last use
    uint64_t budget = 0;             // bytes; 0 = no budget check
    int      loss_chunk = 0;         // tokens per LM-head + loss chunk; 0 = the whole batch at once
    bool     flash_attention = false;// tiled attention (no T x T buffer)
    int      recompute_every = 0;    // 0: none; K: checkpoint every K layers (see Gpt2Options)
    int      grad_accum = 1;         // micro-batches of B sequences per optimizer step
    Gpt2Options model() const {
        Gpt2Options m;
        m.loss_chunk = loss_chunk;
        m.flash_attention = flash_attention;
        m.recompute_every = recompute_every;
        return m;
    }
};

struct StepResult {
    float  loss = 0;          // mean over non-ignored targets
    float  grad_norm = 0;     // global L2 norm of the gradients (before the update)
    int    tokens = 0;        // non-ignored targets
};

class Engine {
public:
    Engine(const ModelConfig & cfg, Backend & backend, const EngineOptions & opt);
    ~Engine();

    // GPT-2 initialisation: N(0, 0.02) weights, c_proj weights N(0, 0.02/sqrt(2L)), zero
    // biases, unit LayerNorm weights. AdamW moments zeroed.
    void init_params(uint64_t seed);
    // Host views of persistent buffers (the CPU backend's memory is host memory).
    float * params();
    float * grads();
    float * adam_m();
    float * adam_v();

    // One optimizer step on grad_accum micro-batches laid end to end (grad_accum*B*T inputs and
    // targets; targets may hold -100). The loss is the mean over all their non-ignored targets,
    // as if they were one batch.
    StepResult train_step(const int32_t * inputs, const int32_t * targets, const AdamWHyper & h);
    // Mean loss of a batch without updating anything (needs with_eval).
    float eval_loss(const int32_t * inputs, const int32_t * targets);
    // Logits [batch,T,V] of `batch` sequences of T tokens (builds a forward-only program for
    // that batch size on first use; it runs on the training parameters).
    std::vector<float> logits(const int32_t * inputs, int batch);

    // Record the ops of every following training step into `t` (cleared at each step's start);
    // null stops recording.
    void set_timeline(Timeline * t) { timeline_ = t; }

    const TrainStep & step() const { return *train_; }
    const MemoryPlan & plan() const { return train_plan_; }
    // Bytes every region of the run needs: the training plan plus any evaluation arena that
    // does not fit inside the training one.
    CategoryBytes planned_reserved() const;
    CategoryBytes planned_peak_live() const;
    const Ledger & ledger() const { return ledger_; }
    Ledger & ledger() { return ledger_; }
    const ModelConfig & config() const { return cfg_; }
    const EngineOptions & options() const { return opt_; }
    const Backend & backend() const { return backend_; }
    int steps_done() const { return t_; }

private:
    // Runs one program on one batch; returns the sum of its per-token losses.
    double run_batch(const TrainStep & step, StepMemory & mem, const int32_t * inputs, const int32_t * targets,
                     float dloss, const AdamWHyper * h);
    // Non-ignored targets in n tokens; checks ids against the vocabulary.
    int count_targets(const int32_t * inputs, const int32_t * targets, size_t n) const;
    void execute(const TrainStep & step, StepMemory & mem, const StepScalars & s);

    ModelConfig cfg_;
    Backend & backend_;
    EngineOptions opt_;
    Ledger ledger_;
    // train_ is the step's last (or only) micro-step: it holds the optimizer. With accumulation,
    // first_ zeroes the gradients and mid_ only accumulates; both run in train_'s memory.
    std::unique_ptr<TrainStep> train_, first_, mid_, eval_, fwd_;
    MemoryPlan train_plan_, first_plan_, mid_plan_, eval_plan_, fwd_plan_;
    int fwd_batch_ = 0;
    std::unique_ptr<StepMemory> train_mem_, first_mem_, mid_mem_, eval_mem_, fwd_mem_;
    // Programs that run in train_'s memory, with their plans (for the planned totals).
    std::vector<std::pair<const TrainStep *, const MemoryPlan *>> secondary() const;
    int t_ = 0;
    Timeline * timeline_ = nullptr;
};

}  // namespace memfit
