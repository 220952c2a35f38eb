// The memory techniques as the user names them (flags shared by train, profile and bench),
// resolved into EngineOptions for one model: precision, attention, loss chunking, recompute
// policy (including `budget`, solved against the memory budget) and `--fit auto`, which
// searches micro-batch x accumulation x precision x attention x recomputation x loss chunk for
// the highest predicted throughput whose plan fits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "train/engine.h"

namespace memfit {

struct RunShape {
    std::string model = "micro";     // preset or Hugging Face config.json
    int      batch = 8;              // micro-batch: sequences per forward/backward
    int      seq = 128;              // tokens per sequence
    int      grad_accum = 1;         // micro-batches per optimizer step
    int      threads = 0;            // 0: OpenMP's default
    std::string device = "cpu";      // cpu | cuda (backend/make_backend.h)
    uint64_t seed = 1337;
    int      loss_chunk = 0;         // tokens per LM-head + loss chunk (0: all at once)
    std::string attention = "auto";    // auto (flash where the backend takes the head dim) | flash | naive
    std::string recompute = "none";    // none | full | every:K | sqrt | selective | budget
    std::string precision = "fp32";    // fp32 | bf16 | fp16 | auto (with --fit auto)
    std::string fit = "off";           // off | auto
    float    clip = 0;               // global gradient-norm clipping (0: off)
    std::string memory_budget;       // "": the memory available to the process
    // LoRA (model/lora.h): rank 0 trains every parameter.
    int      lora_rank = 0;
    float    lora_alpha = 16;
    std::string lora_targets;        // "": the family's default (q,v | c_attn)
    std::string base_weights = "compute";   // compute | fp32 | bf16 | fp16 | int8 | nf4
    float    lora_dropout = 0;
    // Data parallel: the ZeRO stage (0-3) and the gradient bucket size in MiB (0: one bucket per
    // transformer block), flags; the ranks and this rank, set by the trainer from the
    // communicator (batch is then the per-rank micro-batch).
    int      zero = 0;
    double   bucket_mb = 0;
    int      data_parallel = 1;
    int      rank = 0;
    // Tensor parallel (--tp T): the ranks of a tensor group (the world is T x data parallel), and
    // this rank's place in it, set by the trainer.
    int      tp = 1;
    int      tp_rank = 0;
    bool     sp = false;             // --sp: sequence parallel over the tensor group
    // Pipeline parallel (--pp P, --schedule gpipe|1f1b): stages of consecutive blocks; each
    // step's --grad-accum micro-batches flow through them. pp_rank: this rank's stage.
    int      pp = 1;
    int      pp_rank = 0;
    std::string schedule = "1f1b";
};

// ConfigError for a --zero outside 0..3, a negative --bucket-mb, a --tp or --pp below 1 or an
// unknown --schedule.
void check_data_parallel_flags(const RunShape & s);

// The LoRA options the flags name, checked against the model and the compute precision.
LoraOptions lora_options(const RunShape & s, const ModelConfig & cfg, DType compute);

// "fp32" | "bf16" | "fp16" -> DType; ConfigError otherwise.
DType parse_precision(const std::string & p);
std::string precision_name(DType compute);

// Time model for ranking configurations: each op costs max(FLOPs / (flops_rate x the op
// kind's efficiency), bytes / byte_rate) plus a fixed overhead; a step is the sum over its micro-steps' programs.
// The efficiencies are this CPU's, measured with `memfit profile` (gpt2-6l, B=2, T=512, per-op
// times in trace.json): gemms ~100 GFLOP/s, flash attention 0.8 of that, naive attention 0.2,
// the exp-bound cross-entropy 0.015, other elementwise kernels 0.15; gemms on bf16/fp16 storage
// run at 0.9 of the fp32 rate (the bench's matmul probe: tiles are converted to fp32).
struct TimeModel {
    double flops_rate = 100e9;   // FLOP/s of the gemms
    double byte_rate = 20e9;     // bytes/s of memory traffic
    double lowp_gemm = 0.9;      // gemm rate factor when weights and activations are 16-bit
    double op_overhead = 20e-6;  // seconds per op (dispatch, threads' fork/join): favours fewer micro-steps
    double op_seconds(const OpRecord & op, bool lowp) const;
    double step_seconds(const StepPlans & plans, int grad_accum) const;
};

struct ResolvedRun {
    EngineOptions eo;
    std::vector<std::string> notes;   // what --fit auto / --recompute budget chose and why
};

// Resolves the flags for `cfg` within `budget` bytes (0: no budget). Throws ConfigError for a
// bad flag and OutOfMemory when --fit auto or --recompute budget finds nothing that fits (the
// message gives the smallest configuration's needs per category).
ResolvedRun resolve_run(const RunShape & s, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                        uint64_t budget);

}  // namespace memfit
