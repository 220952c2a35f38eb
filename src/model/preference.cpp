#include "model/preference.h"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {

// Each enum's names in its order: the flags' choices.
constexpr std::array kLosses = {"sigmoid", "ipo", "hinge"};
constexpr std::array kReferences = {"adapters-off", "precompute", "copy"};
constexpr std::array kWeights = {"compute", "bf16", "int8", "nf4"};

template <class E, size_t N>
E parse_name(const std::array<const char *, N> & names, const std::string & s, const char * flag) {
    for (size_t i = 0; i < N; ++i)
        if (s == names[i]) return E(i);
    throw ConfigError(fmt::format("{} {}: expected one of {}", flag, s, fmt::join(names, ", ")));
}

}  // namespace

DpoLoss parse_dpo_loss(const std::string & s) { return parse_name<DpoLoss>(kLosses, s, "--dpo-loss"); }
Reference parse_reference(const std::string & s) { return parse_name<Reference>(kReferences, s, "--reference"); }
ReferenceWeights parse_reference_weights(const std::string & s) {
    return parse_name<ReferenceWeights>(kWeights, s, "--reference-weights");
}
void PreferenceMetrics::add(const PreferenceMetrics & o) {
    pairs += o.pairs, chosen += o.chosen, rejected += o.rejected, accurate += o.accurate;
    logps_chosen += o.logps_chosen, logps_rejected += o.logps_rejected;
}

std::vector<std::pair<std::string, double>> PreferenceMetrics::means() const {
    if (pairs <= 0) return {};
    return {{"rewards/chosen", chosen / pairs},          {"rewards/rejected", rejected / pairs},
            {"rewards/margins", margin()}, {"rewards/accuracies", accuracy()},
            {"logps/chosen", logps_chosen / pairs},      {"logps/rejected", logps_rejected / pairs}};
}

PreferenceMetrics pair_metrics(const PreferenceOptions & o, const float * policy, const float * reference,
                               const int32_t * targets, int B, int T) {
    PreferenceMetrics m;
    const bool mean = dpo_mean_logps(o.loss);
    for (int i = 0; i + 1 < B; i += 2) {
        double logp[2], reward[2];
        for (int k = 0; k < 2; ++k) {
            const int row = i + k;
            double n = 0;
            for (int t = 0; t < T; ++t) n += targets[size_t(row) * size_t(T) + size_t(t)] != -100 ? 1 : 0;
            const double per = mean ? (n > 0 ? 1.0 / n : 0.0) : 1.0;
            logp[k] = double(policy[row]) * per;
            reward[k] = double(o.beta) * (logp[k] - double(reference[row]) * per);
        }
        m.pairs += 1;
        m.chosen += reward[0], m.rejected += reward[1];
        m.accurate += reward[0] > reward[1] ? 1 : 0;
        m.logps_chosen += logp[0], m.logps_rejected += logp[1];
    }
    return m;
}

uint64_t reference_bytes(const ModelConfig & cfg, const PreferenceOptions & o, DType compute) {
    if (!o.copy()) return 0;
    const QuantLayout q = o.quantized() ? make_quant_layout(cfg, quant_format(o.base_weights(), true)) : QuantLayout{};
    return uint64_t(dense_layout(cfg, q).total) * dtype_size(o.dtype(compute)) + q.bytes;
}

const char * dpo_loss_name(DpoLoss l) { return kLosses[size_t(l)]; }
const char * reference_name(Reference r) { return kReferences[size_t(r)]; }
const char * reference_weights_name(ReferenceWeights w) { return kWeights[size_t(w)]; }

}  // namespace memfit
