// Expert parallelism's part of a training run (model/expert_parallel.h): --ep E makes expert
// groups of E consecutive data ranks (the all-to-alls' and the dense gradients' sums) and the
// groups of the ranks holding the same experts (ZeRO's and the experts' gradients'), and says so.
#include <fmt/format.h>

#include "app/training_run.h"
#include "backend/moe.h"
#include "comm/device_communicator.h"
#include "core/error.h"
#include "model/expert_parallel.h"

namespace memfit {

void TrainingRun::make_expert_groups() {
    const int E = opt_.layout.ep;
    if (E <= 1) return;
    MF_ASSERT(!groups_ && "expert parallelism with tensor, pipeline or context parallelism (compat.cpp)");
    const int r = comm_->rank();
    ep_host_ = comm_->split(r / E, r % E);
    edp_host_ = comm_->split(r % E, r / E);
    device_ep_ = make_device_communicator(*ep_host_, *backend_);
    device_edp_ = make_device_communicator(*edp_host_, *backend_);
}

void TrainingRun::use_expert_groups() {
    if (!ep_host_) return;
    eo_.comm = device_edp_ ? device_edp_.get() : edp_host_.get();   // the gradients' group
    eo_.rank = rank_ / opt_.layout.ep;
    eo_.ep_comm = device_ep_ ? device_ep_.get() : ep_host_.get();
}

std::string TrainingRun::expert_line(const ModelConfig & cfg) const {
    const int R = eo_.expert_parallel, E = cfg.moe.experts;
    const double f = ep_capacity_factor(eo_.moe_capacity_factor);
    return fmt::format("  expert parallel: {} ranks per group, each {} of {} experts; capacity factor {:g}: at most {} "
                       "of a rank's {} tokens' rows to each expert, past it dropped (moe/dropped); the dense part "
                       "data parallel over all {} ranks",
                       R, E / R, E, f, moe_capacity_rows(int64_t(eo_.B) * eo_.T, cfg.moe.top_k, E, f), eo_.B * eo_.T,
                       world_);
}

}  // namespace memfit
