// The engine's reading of a mixture of experts' routing statistics after each micro-batch
// (Transformer::moe_stats): the router losses' values and the tokens each expert received; and
// expert parallelism's sums over the data axis and whole model (model/expert_parallel.h).
#include "train/engine.h"

#include "comm/communicator.h"
#include "model/expert_parallel.h"

namespace memfit {

// The load-balancing loss of transformers' load_balancing_loss_func over every sparse layer's
// router logits at once: E / (L N)^2 sum_e (tokens sent to e) (probabilities of e summed), and
// the z-loss, the mean squared log-sum-exp of the logits.
void Engine::moe_read(const TrainStep & step, StepMemory & mem) {
    const Tensor st = step.moe_stats();
    if (!st.valid()) return;
    const int64_t L = st.rows(), W = st.cols(), E = cfg_.moe.experts;
    std::vector<float> v(size_t(L * W));
    backend_.download(v.data(), mem.base(st.buffer), v.size() * sizeof(float));
    // Expert parallel: the statistics are every data rank's tokens' (summed before backward).
    const double ranks = opt_.expert_parallel > 1 ? double(opt_.expert_parallel * opt_.data_parallel) : 1.0;
    const double LN = double(L) * double(step.B()) * double(step.T()) * ranks;
    double aux = 0, z = 0;
    moe_.tokens.resize(size_t(L * E), 0.0f);
    for (int64_t e = 0; e < E; ++e) {
        double c = 0, p = 0;
        for (int64_t l = 0; l < L; ++l) {
            c += v[size_t(l * W + e)], p += v[size_t(l * W + E + e)];
            moe_.tokens[size_t(l * E + e)] += v[size_t(l * W + e)];
        }
        aux += c * p;
    }
    for (int64_t l = 0; l < L; ++l) z += v[size_t(l * W + 2 * E)], moe_.dropped += v[size_t(l * W + 2 * E + 1)];
    moe_.aux += double(E) * aux / (LN * LN);
    moe_.z += z / LN;
    ++moe_.batches;
}

// The whole model from every expert rank's share (each holds the dense part alike).
std::vector<float> Engine::ep_gather(const std::vector<float> & local) const {
    std::vector<ParamLayout> parts;
    for (int r = 0; r < opt_.expert_parallel; ++r)
        parts.push_back(make_param_layout(ep_local_config(cfg_, {opt_.expert_parallel, r, 0, 0, true})));
    return gather_by_name(*ep_comm_, local, parts, make_param_layout(cfg_));
}

double Engine::sum_over_data(double v) const {
    if (opt_.data_parallel > 1) v = comm_->all_reduce_sum(v);
    if (opt_.expert_parallel > 1) v = ep_comm_->all_reduce_sum(v);
    return v;
}

}  // namespace memfit
