// The engine's side of preference tuning (model/preference.h): the reference copy's weights, the
// reference log-probabilities a batch brings (--reference precompute) and the metrics each run
// leaves.
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "train/engine.h"
#include "train/split_weights.h"

namespace memfit {

void Engine::set_reference(const float * full) {
    const FrozenModel & f = plans_.train->reference_model();
    MF_ASSERT(f.model && f.dense >= 0);
    Tensor dense(f.dense, f.dtype, {int64_t(f.layout.total)});
    dense.data = train_mem_->base(f.dense);
    store_split_weights(backend_, f.cfg, f.quant, dense,
                        static_cast<uint8_t *>(f.packed >= 0 ? train_mem_->base(f.packed) : nullptr), full);
}

void Engine::reference_from_start() {
    const std::vector<float> w = plans_.train->lora() ? base_weights() : full_params();
    set_reference(w.data());
}

std::vector<float> Engine::row_logps(const int32_t * inputs, const int32_t * targets, const int32_t * doc_start) {
    MF_ASSERT(plans_.eval && opt_.pref.enabled());
    const std::vector<float> zeros(size_t(opt_.B), 0.0f);   // the reference's: unused here
    eval_loss(inputs, targets, doc_start, zeros.data());
    std::vector<float> out(size_t(opt_.B));
    backend_.download(out.data(), eval_mem_->base(plans_.eval->policy_logps), out.size() * sizeof(float));
    return out;
}

void Engine::preference_io(const TrainStep & step, StepMemory & mem, const int32_t * targets, bool before) {
    const size_t B = size_t(step.B());
    if (before) {
        if (step.preference().reference != Reference::precompute) return;
        if (!batch_ref_)
            throw ConfigError("--reference precompute: the batch came without its reference log-probabilities");
        backend_.upload(mem.base(step.ref_logps), batch_ref_, B * sizeof(float));
        return;
    }
    std::vector<float> policy(B), ref(B);
    backend_.download(policy.data(), mem.base(step.policy_logps), B * sizeof(float));
    backend_.download(ref.data(), mem.base(step.ref_logps), B * sizeof(float));
    run_pref_.add(pair_metrics(step.preference(), policy.data(), ref.data(), targets, int(B), step.T()));
}

PreferenceMetrics Engine::reduced_preference(const PreferenceMetrics & m) {
    if (opt_.data_parallel == 1 || !opt_.pref.enabled()) return m;
    PreferenceMetrics r;
    double * in[] = {&r.pairs, &r.chosen, &r.rejected, &r.accurate, &r.logps_chosen, &r.logps_rejected};
    const double v[] = {m.pairs, m.chosen, m.rejected, m.accurate, m.logps_chosen, m.logps_rejected};
    for (size_t i = 0; i < 6; ++i) *in[i] = comm_->all_reduce_sum(v[i]);
    return r;
}

}  // namespace memfit
