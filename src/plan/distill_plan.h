// What `memfit plan` needs to know about a distillation teacher (model/distill.h), computed once
// per request: its weights in the compute dtype and packed, for the `teacher` category, and its
// configuration for the forward FLOPs it adds to every micro-batch (plan/time_model.h).
#pragma once

#include <cstdint>
#include <memory>

#include "model/distill.h"
#include "run/run_config.h"

namespace memfit {

struct DistillPlan {
    DistillConfig config;       // as the run takes it: candidates carry it to the engine's exact plan
    DistillOptions opts;        // opts.teacher: the teacher's configuration
    int64_t dense_params = 0;   // teacher elements held in the compute dtype
    uint64_t packed_bytes = 0;  // its packed projections (--teacher-weights int8 | nf4)
    uint64_t weight_bytes(DType compute) const { return uint64_t(dense_params) * dtype_size(compute) + packed_bytes; }
};

// Null when the run has no --teacher.
std::shared_ptr<const DistillPlan> make_distill_plan(const RunConfig & run, const DistillOptions & opts);

}  // namespace memfit
