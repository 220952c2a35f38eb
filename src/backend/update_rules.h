// The optimizers' per-element update rules, compiled into the CPU kernels (cpu/kernels_optim.cpp,
// cpu/kernels_adamw8.cpp) and the CUDA ones (cuda/kernels_optim.cu) alike, so both backends do
// the same arithmetic in the same order. The rows they serve are in backend/optimizer.h; g is the
// stored gradient times the step's scale (update_scale()); `frozen` is a kept zero of N:M
// sparsity (OptimHyper::keep_zeros): its states become 0 and its weight stays.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/optimizer.h"
#include "backend/stochastic_round.h"

namespace memfit {

// A step's constants, formed once on the host (the same floats on every backend).
struct UpdateConsts {
    float lr, beta1, beta2, eps, inv_bc1, inv_bc2, decay, one_m_b1, one_m_b2;
    float momentum, weight_decay;
    // The gradients' factor (CPU: formed on the host; CUDA: from norm_sq on the device, with
    // clip and grad_scale, the skips of skips_update()).
    float scale, clip, grad_scale, skip_above_norm_sq;
    bool skip_nonfinite, keep_zeros;
    uint64_t sr_seed, sr_at;   // bf16-sr weights: backend/stochastic_round.h's draws
    // Adafactor: the second moments' decay at this step, 1 - t^decay_rate, and its settings.
    float beta2t, eps1, clip_threshold, af_beta1;
};

inline UpdateConsts update_consts(const OptimHyper & h, float scale = 1.0f) {
    UpdateConsts c;
    c.lr = h.lr, c.beta1 = h.beta1, c.beta2 = h.beta2, c.eps = h.eps;
    c.inv_bc1 = float(1.0 / (1.0 - std::pow(double(h.beta1), h.t)));
    c.inv_bc2 = float(1.0 / (1.0 - std::pow(double(h.beta2), h.t)));
    c.decay = float(1.0 - double(h.lr) * h.weight_decay);
    c.one_m_b1 = 1.0f - h.beta1, c.one_m_b2 = 1.0f - h.beta2;
    c.momentum = h.momentum, c.weight_decay = h.weight_decay;
    c.scale = scale, c.clip = h.clip, c.grad_scale = h.grad_scale, c.skip_above_norm_sq = h.skip_above_norm_sq;
    c.skip_nonfinite = h.skip_nonfinite, c.keep_zeros = h.keep_zeros;
    c.sr_seed = h.sr_seed, c.sr_at = h.sr_at;
    c.beta2t = float(1.0 - std::pow(double(h.t), double(h.decay_rate)));
    c.eps1 = h.eps1, c.clip_threshold = h.clip_threshold, c.af_beta1 = h.adafactor_beta1;
    return c;
}

// AdamW (torch.optim.AdamW, decoupled weight decay, non-amsgrad): p *= 1 - lr wd;
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
// m and v in and out; the new weight returned.
MF_HOST_DEVICE inline float adamw_rule(const UpdateConsts & c, float w, float g, float & m, float & v, bool frozen) {
    m = frozen ? 0.0f : c.beta1 * m + c.one_m_b1 * g;
    v = frozen ? 0.0f : c.beta2 * v + c.one_m_b2 * g * g;
    const float mhat = m * c.inv_bc1, vhat = v * c.inv_bc2;
    return frozen ? w : w * c.decay - c.lr * mhat / (sqrtf(vhat) + c.eps);
}

// SGD with momentum (torch.optim.SGD, no dampening or Nesterov, L2 weight decay):
// g' = g + wd p, b = momentum b + g', p -= lr b.
MF_HOST_DEVICE inline float sgd_rule(const UpdateConsts & c, float w, float g, float & b, bool frozen) {
    const float d = g + c.weight_decay * w;
    b = frozen ? 0.0f : c.momentum * b + d;
    return frozen ? w : w - c.lr * b;
}

// Adafactor (Shazeer & Stern 2018; transformers' Adafactor with relative_step, scale_parameter
// and beta1 off), for a matrix view [R, C] (a vector: R = 1, one statistic per element):
//   row_i = b row_i + (1-b) mean_j(g_ij^2 + eps1),  col_j = b col_j + (1-b) mean_i(g_ij^2 + eps1)
//   u_ij = g_ij r_i c_j,  r_i = 1 / sqrt(row_i / mean(row)),  c_j = 1 / sqrt(col_j)
//                                               (a vector: u_i = g_i c_i, c_i = 1 / sqrt(v_i))
//   p = p (1 - lr wd) - lr u / max(1, RMS(u) / clip_threshold)
// with b = beta2t. The kernels form the statistics' sums, then u's sum of squares, then the step.
MF_HOST_DEVICE inline float adafactor_stat(const UpdateConsts & c, float stat, double mean_sq) {
    return c.beta2t * stat + (1.0f - c.beta2t) * float(mean_sq);
}
MF_HOST_DEVICE inline float adafactor_row_factor(float row, float row_mean) { return 1.0f / sqrtf(row / row_mean); }
MF_HOST_DEVICE inline float adafactor_col_factor(float col) { return 1.0f / sqrtf(col); }
MF_HOST_DEVICE inline float adafactor_u(float g, float r, float c) { return g * r * c; }
// 1 / max(1, RMS(u) / clip_threshold), from u's sum of squares over the view's n elements.
MF_HOST_DEVICE inline float adafactor_inv_denom(const UpdateConsts & c, double u_sq, double n) {
    const float rms = float(sqrt(u_sq / n));
    const float d = rms / c.clip_threshold;
    return d > 1.0f ? 1.0f / d : 1.0f;
}
MF_HOST_DEVICE inline float adafactor_rule(const UpdateConsts & c, float w, float u, float inv_denom) {
    return w * c.decay - c.lr * (u * inv_denom);
}
// With a first moment (--adafactor-beta1 b1 > 0, transformers' use_first_moment): the clipped,
// lr-scaled update averaged, m = b1 m + (1 - b1) lr u / d, and p = p (1 - lr wd) - m.
MF_HOST_DEVICE inline float adafactor_rule_m(const UpdateConsts & c, float w, float u, float inv_denom, float & m) {
    m = c.af_beta1 * m + (1.0f - c.af_beta1) * (c.lr * (u * inv_denom));
    return w * c.decay - m;
}

// The gradients' factor on a device that reads norm_sq itself: update_scale() of optimizer.h.
MF_HOST_DEVICE inline float rule_scale(const UpdateConsts & c, float norm_sq) {
    if (!(c.clip > 0)) return c.grad_scale;
    const float norm = sqrtf(norm_sq) * c.grad_scale;
    return norm > c.clip ? c.grad_scale * (c.clip / norm) : c.grad_scale;
}
MF_HOST_DEVICE inline bool rule_skips(const UpdateConsts & c, float norm_sq) {
#if defined(__CUDA_ARCH__)
    const bool finite = isfinite(norm_sq);
#else
    const bool finite = std::isfinite(norm_sq);
#endif
    if (c.skip_nonfinite && !finite) return true;
    return c.skip_above_norm_sq > 0 && norm_sq > c.skip_above_norm_sq;
}

}  // namespace memfit
