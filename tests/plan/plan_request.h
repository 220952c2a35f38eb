// What the planner tests share: a search request for a preset on a catalog device, exact plans
// sized by the CUDA backend's scratch (the planner's default for GPU hardware).
#pragma once

#include <memory>
#include <vector>

#include "backend/cuda_sizing.h"
#include "plan/hardware.h"
#include "plan/search.h"

namespace memfit::test {

inline PlanRequest plan_request(const char * model, const char * hw, int gpus, int seq, int global_batch, int top = 3) {
    static const std::vector<Hardware> catalog = default_hardware_catalog("");
    static const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
    PlanRequest r;
    r.cfg = model_preset(model);
    if (r.cfg.vocab_size == 0) r.cfg.vocab_size = 256;   // the small presets: a byte vocabulary
    r.hw = find_hardware(catalog, hw);
    r.gpus = gpus;
    r.run.seq = seq;
    r.run.global_batch = global_batch;
    r.top = top;
    r.exact_sizing = cuda.get();
    return r;
}

}  // namespace memfit::test
