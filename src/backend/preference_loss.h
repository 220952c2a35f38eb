// Direct Preference Optimization's loss (Rafailov et al. 2023, "Direct Preference Optimization:
// Your Language Model is Secretly a Reward Model") and the variants TRL's DPOTrainer names by
// `loss_type`, per pair of rows (chosen, rejected). With the policy's and the frozen reference's
// log-probabilities of each answer, pc, pr and rc, rr, the pair's margin is
//     h = (pc - rc) - (pr - rr)
// and its loss, with beta > 0 and label smoothing ls in [0, 0.5):
//     sigmoid  -(1 - ls) log sigmoid(beta h) - ls log sigmoid(-beta h)   (DPO; cDPO with ls > 0)
//     ipo      (h - 1 / (2 beta))^2, over the answers' mean log-probabilities (Azar et al. 2023,
//              as TRL averages them for ipo)
//     hinge    max(0, 1 - beta h)                                        (SLiC, Zhao et al. 2023)
// Compiled into the CPU kernels and the CUDA ones alike (backend/kernel_list.h's dpo_loss), so
// both do the same arithmetic in double.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/stochastic_round.h"   // MF_HOST_DEVICE

namespace memfit {

enum class DpoLoss : uint8_t { sigmoid, ipo, hinge };

struct DpoDesc {
    DpoLoss loss = DpoLoss::sigmoid;
    float beta = 0.1f;
    float label_smoothing = 0.0f;
    // The gradient's scale: 1 / (pairs in the whole optimizer step), times the loss scale.
    float dloss = 0.0f;
};

// A pair's loss at margin h and its derivative d loss / d h.
struct DpoPairLoss {
    double loss, dh;
};

MF_HOST_DEVICE inline double dpo_log_sigmoid(double x) {
    return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

MF_HOST_DEVICE inline double dpo_sigmoid(double x) {
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

MF_HOST_DEVICE inline DpoPairLoss dpo_pair_loss(const DpoDesc & d, double h) {
    const double b = d.beta, ls = d.label_smoothing;
    switch (d.loss) {
    case DpoLoss::ipo: {
        const double e = h - 1.0 / (2.0 * b);
        return {e * e, 2.0 * e};
    }
    case DpoLoss::hinge:
        return b * h < 1.0 ? DpoPairLoss{1.0 - b * h, -b} : DpoPairLoss{0.0, 0.0};
    case DpoLoss::sigmoid:
    default:
        return {-(1.0 - ls) * dpo_log_sigmoid(b * h) - ls * dpo_log_sigmoid(-b * h),
                -(1.0 - ls) * b * dpo_sigmoid(-b * h) + ls * b * dpo_sigmoid(b * h)};
    }
}

// Whether the loss compares the answers' mean log-probabilities (per trained token) instead of
// their sums.
MF_HOST_DEVICE inline bool dpo_mean_logps(DpoLoss l) { return l == DpoLoss::ipo; }

// Row b's log-probability of its trained targets: -sum_t losses[b, t] (xent_fwd's losses, 0 at
// ignored targets), summed in double (row_logps in backend/kernel_list.h).
MF_HOST_DEVICE inline float dpo_row_logp(const float * losses, int b, int T) {
    double s = 0.0;
    for (int t = 0; t < T; ++t) s += double(losses[int64_t(b) * T + t]);
    return float(-s);
}

// Pair i of dpo_loss (backend/kernel_list.h), as both backends compute it: rows 2i (chosen) and
// 2i + 1 (rejected) of losses, targets and scale [B, T]; logps and ref [B].
MF_HOST_DEVICE inline void dpo_pair(int i, float * losses, float * scale, float * logps, const float * ref,
                                    const int32_t * targets, int T, const DpoDesc & d) {
    const bool mean = dpo_mean_logps(d.loss);
    double sum[2] = {0.0, 0.0}, per[2] = {1.0, 1.0};
    for (int k = 0; k < 2; ++k) {
        double n = 0.0;
        for (int t = 0; t < T; ++t) {
            const int64_t at = int64_t(2 * i + k) * T + t;
            sum[k] -= double(losses[at]);
            n += targets[at] != -100 ? 1.0 : 0.0;
        }
        // A mean over no trained target is 0, and so is its gradient.
        if (mean) per[k] = n > 0.0 ? 1.0 / n : 0.0;
    }
    const double h = (sum[0] - double(ref[2 * i])) * per[0] - (sum[1] - double(ref[2 * i + 1])) * per[1];
    const DpoPairLoss l = dpo_pair_loss(d, h);
    const double g[2] = {l.dh * per[0], -l.dh * per[1]};
    for (int k = 0; k < 2; ++k) {
        const int row = 2 * i + k;
        logps[row] = float(sum[k]);
        for (int t = 0; t < T; ++t) {
            const int64_t at = int64_t(row) * T + t;
            scale[at] = targets[at] != -100 ? float(-g[k] * double(d.dloss)) : 0.0f;
            losses[at] = 0.0f;
        }
    }
    losses[int64_t(2 * i) * T] = float(l.loss);
}

}  // namespace memfit
