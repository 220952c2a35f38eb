// CPU kernels: softmax cross-entropy, forward and backward (in place). Contracts are in
// kernels.h. Rows are independent, so both kernels parallelise over rows. Rows whose target is
// the ignore index (-100) still get their softmax in the forward (loss 0); the backward zeroes
// them. The row sum of exponentials is accumulated in double. exp is the vectorised polynomial
// (fast_exp, relative error < 1e-7; glibc's expf does not vectorise without -ffast-math) on rows
// whose logits are all finite; a row holding an infinity or a NaN takes glibc's exp, so that it
// gives the same inf/NaN loss as before (what the loss scaler and the divergence checks see).
//
// The vocabulary-parallel kernels split the same arithmetic over shards of columns: each shard's
// log-sum-exp (its own max first), the shards' combined in double (max first again), then the
// probabilities exp(logit - lse) directly, with no second normalisation.
//
// Distillation's kernels reuse the row helpers: per row, the student's lse at temperature 1 and T
// (kept for the backward), the teacher's softmax at T written over its logits, and the KL term
// from one cross sum, KL(q || p) = sum_j q_j (t_j - z_j) / T - lse(t / T) + lse(z / T).
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "backend/cpu/convert.h"
#include "backend/cpu/exp_poly.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {
constexpr int32_t kIgnoreIndex = -100;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The shard's valid columns: those below the vocabulary size (the rest pad the last shard).
int valid_columns(int Vl, int64_t vocab_lo, int64_t V) {
    return static_cast<int>(std::clamp<int64_t>(V - vocab_lo, 0, Vl));
}

// The column of target t in the shard, or -1 when the shard does not hold it (or it is ignored).
int shard_column(int32_t t, int64_t vocab_lo, int valid) {
    MF_ASSERT(t == kIgnoreIndex || t >= 0);
    const int64_t j = int64_t(t) - vocab_lo;
    return t != kIgnoreIndex && j >= 0 && j < valid ? static_cast<int>(j) : -1;
}

// The largest of row[0, n) (n >= 1); `finite` false when any value is an infinity or a NaN
// (x * 0 is 0 exactly for finite x and NaN otherwise).
float row_max(const float * row, int n, bool & finite) {
    float maxv = row[0], zero = 0.0f;
#pragma omp simd reduction(max : maxv) reduction(+ : zero)
    for (int j = 0; j < n; ++j) {
        maxv = row[j] > maxv ? row[j] : maxv;
        zero += row[j] * 0.0f;
    }
    finite = zero == 0.0f;
    return maxv;
}

// sum_j exp(row[j] - maxv) in double over row[0, n); with `out`, also out[j] = exp(row[j] - maxv)
// (out may be row).
double exp_sum(const float * row, float * out, int n, float maxv, bool finite) {
    double sum = 0.0;
    if (!finite) {
        for (int j = 0; j < n; ++j) {
            const float e = std::exp(row[j] - maxv);
            if (out) out[j] = e;
            sum += e;
        }
    } else if (out) {
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; ++j) {
            const float e = fast_exp(row[j] - maxv);
            out[j] = e;
            sum += e;
        }
    } else {
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; ++j) sum += fast_exp(row[j] - maxv);
    }
    return sum;
}

// sum_j exp((row[j] - maxv) * inv_t) in double over row[0, n) (maxv: the row's largest).
double exp_sum_scaled(const float * row, int n, float maxv, float inv_t, bool finite) {
    double sum = 0.0;
    if (!finite) {
        for (int j = 0; j < n; ++j) sum += std::exp((row[j] - maxv) * inv_t);
        return sum;
    }
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) sum += fast_exp((row[j] - maxv) * inv_t);
    return sum;
}

float exp_any(float x, bool finite) { return finite ? fast_exp(x) : std::exp(x); }

// One row: its loss (0 for the ignore index), and exp(logit - max) written over the logits;
// returns 1 / (the row's sum of them), which normalises the row to the softmax.
float softmax_numerators(float * row, int32_t target, int V, float & loss) {
    MF_ASSERT(target == kIgnoreIndex || (target >= 0 && target < V));
    bool finite = true;
    const float maxv = row_max(row, V, finite);
    // Read the target logit before the row is overwritten.
    const float target_logit = target == kIgnoreIndex ? 0.0f : row[target];
    const double sum = exp_sum(row, row, V, maxv, finite);
    const double lse = static_cast<double>(maxv) + std::log(sum);
    loss = target == kIgnoreIndex ? 0.0f : static_cast<float>(lse - static_cast<double>(target_logit));
    return static_cast<float>(1.0 / sum);
}

// probs -> (probs - onehot(target)) * dloss in place, 0 for the ignore index.
void row_dlogits(float * row, int32_t target, float dloss, int V) {
    if (target == kIgnoreIndex) {
#pragma omp simd
        for (int j = 0; j < V; ++j) row[j] = 0.0f;
        return;
    }
    MF_ASSERT(target >= 0 && target < V);
    const float p_target = row[target];
#pragma omp simd
    for (int j = 0; j < V; ++j) row[j] *= dloss;
    row[target] = (p_target - 1.0f) * dloss;
}
}  // namespace

void crossentropy_forward(float * losses, float * logits_to_probs, const int32_t * targets,
                          int N, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        float * row = logits_to_probs + static_cast<size_t>(r) * V;
        const float inv = softmax_numerators(row, targets[r], V, losses[r]);
#pragma omp simd
        for (int j = 0; j < V; ++j) row[j] *= inv;
    }
}

void crossentropy_backward(float * probs_to_dlogits, const int32_t * targets, float dloss,
                           int N, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) row_dlogits(probs_to_dlogits + static_cast<size_t>(r) * V, targets[r], dloss, V);
}

// While the row is in cache: the normalisation, then the backward's scaling (rounded in turn,
// as the two kernels do).
void crossentropy_forward_backward(float * losses, float * logits_to_dlogits, const int32_t * targets,
                                   float dloss_all, int N, int V, bool round_bf16, const float * row_scale) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        float * row = logits_to_dlogits + static_cast<size_t>(r) * V;
        float unused = 0.0f;
        const float inv = softmax_numerators(row, targets[r], V, losses ? losses[r] : unused);
        const float dloss = row_scale ? row_scale[r] : dloss_all;
        if (targets[r] == kIgnoreIndex) {
            row_dlogits(row, targets[r], dloss, V);
        } else {
            const float p_target = row[targets[r]] * inv;
#pragma omp simd
            for (int j = 0; j < V; ++j) row[j] = (row[j] * inv) * dloss;
            row[targets[r]] = (p_target - 1.0f) * dloss;
        }
        if (round_bf16) round_bf16_row_in_place(row, V);
    }
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel

void crossentropy_shard_stats(float * stats, const float * logits, const int32_t * targets, int N, int Vl,
                              int64_t vocab_lo, int64_t V) {
    const int nv = valid_columns(Vl, vocab_lo, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        const float * row = logits + static_cast<size_t>(r) * Vl;
        MF_ASSERT(targets[r] == kIgnoreIndex || targets[r] < V);
        const int col = shard_column(targets[r], vocab_lo, nv);
        stats[static_cast<size_t>(N) + r] = col < 0 ? 0.0f : row[col];
        if (nv == 0) {
            stats[r] = kNegInf;
            continue;
        }
        bool finite = true;
        const float maxv = row_max(row, nv, finite);
        const double sum = exp_sum(row, nullptr, nv, maxv, finite);
        stats[r] = static_cast<float>(static_cast<double>(maxv) + std::log(sum));
    }
}

void crossentropy_shard_loss(float * losses, float * lse, const float * gathered, const int32_t * targets, int N,
                             int R) {
    const size_t stride = 2 * static_cast<size_t>(N);   // one shard's stats
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        float maxv = kNegInf;
        for (int r = 0; r < R; ++r) maxv = std::max(maxv, gathered[r * stride + i]);
        double sum = 0.0, target_logit = 0.0;
        for (int r = 0; r < R; ++r) {
            const float s = gathered[r * stride + i];
            if (s != kNegInf) sum += std::exp(static_cast<double>(s) - maxv);
            target_logit += gathered[r * stride + static_cast<size_t>(N) + i];
        }
        const double l = maxv == kNegInf ? -std::numeric_limits<double>::infinity()
                                         : static_cast<double>(maxv) + std::log(sum);
        lse[i] = static_cast<float>(l);
        losses[i] = targets[i] == kIgnoreIndex ? 0.0f : static_cast<float>(l - target_logit);
    }
}

void crossentropy_shard_backward(float * logits_to_dlogits, const int32_t * targets, const float * lse, float dloss,
                                 int N, int Vl, int64_t vocab_lo, int64_t V) {
    const int nv = valid_columns(Vl, vocab_lo, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        float * row = logits_to_dlogits + static_cast<size_t>(r) * Vl;
        const int32_t target = targets[r];
        if (target == kIgnoreIndex) {
#pragma omp simd
            for (int j = 0; j < Vl; ++j) row[j] = 0.0f;
            continue;
        }
        MF_ASSERT(target >= 0 && target < V);
        const int col = shard_column(target, vocab_lo, nv);
        const float l = lse[r];
        const float p_target = col < 0 ? 0.0f : std::exp(row[col] - l);
        bool finite = std::isfinite(l);
        if (nv > 0 && finite) row_max(row, nv, finite);   // for its finiteness only
        if (finite) {
#pragma omp simd
            for (int j = 0; j < nv; ++j) row[j] = fast_exp(row[j] - l) * dloss;
        } else {
            for (int j = 0; j < nv; ++j) row[j] = std::exp(row[j] - l) * dloss;
        }
#pragma omp simd
        for (int j = nv; j < Vl; ++j) row[j] = 0.0f;
        if (col >= 0) row[col] = (p_target - 1.0f) * dloss;
    }
}

// ---------------------------------------------------------------------------------------------
// Distillation

void distill_forward(float * losses, float * stats, const float * logits, float * teacher_to_probs,
                     const int32_t * targets, int N, int V, float alpha, float temperature) {
    MF_ASSERT(temperature > 0.0f && alpha >= 0.0f && alpha <= 1.0f);
    const float inv_t = 1.0f / temperature;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        const float * z = logits + static_cast<size_t>(r) * V;
        float * t = teacher_to_probs + static_cast<size_t>(r) * V;
        const int32_t target = targets[r];
        MF_ASSERT(target == kIgnoreIndex || (target >= 0 && target < V));
        bool zf = true, tf = true;
        const float zmax = row_max(z, V, zf), tmax = row_max(t, V, tf);
        const double lse = double(zmax) + std::log(exp_sum(z, nullptr, V, zmax, zf));
        const double lse_t = double(zmax) * inv_t + std::log(exp_sum_scaled(z, V, zmax, inv_t, zf));
        // The teacher's row: e_j = exp((t_j - tmax) / T), their sum, and sum_j e_j (t_j - z_j),
        // before the row is overwritten with q = e / sum.
        double esum = 0.0, cross = 0.0;
        if (tf && zf) {
#pragma omp simd reduction(+ : esum, cross)
            for (int j = 0; j < V; ++j) {
                const float e = fast_exp((t[j] - tmax) * inv_t);
                esum += e;
                cross += e * (t[j] - z[j]);
                t[j] = e;
            }
        } else {
            for (int j = 0; j < V; ++j) {
                const float e = exp_any((t[j] - tmax) * inv_t, tf);
                esum += e;
                cross += double(e) * (double(t[j]) - double(z[j]));
                t[j] = e;
            }
        }
        const float inv = static_cast<float>(1.0 / esum);
#pragma omp simd
        for (int j = 0; j < V; ++j) t[j] *= inv;
        const double lse_q = double(tmax) * inv_t + std::log(esum);
        const double kl = cross / esum * inv_t - lse_q + lse_t;
        stats[r] = static_cast<float>(lse);
        stats[N + r] = static_cast<float>(lse_t);
        const double ce = target == kIgnoreIndex ? 0.0 : lse - double(z[target]);
        losses[r] = target == kIgnoreIndex
                        ? 0.0f
                        : static_cast<float>((1.0 - alpha) * ce + double(alpha) * temperature * temperature * kl);
    }
}

void distill_backward(float * logits_to_dlogits, const float * stats, const float * teacher_probs,
                      const int32_t * targets, int N, int V, float alpha, float temperature, float dloss) {
    MF_ASSERT(temperature > 0.0f && alpha >= 0.0f && alpha <= 1.0f);
    const float inv_t = 1.0f / temperature, w_ce = (1.0f - alpha) * dloss, w_kl = alpha * temperature * dloss;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        float * row = logits_to_dlogits + static_cast<size_t>(r) * V;
        const float * q = teacher_probs + static_cast<size_t>(r) * V;
        const int32_t target = targets[r];
        if (target == kIgnoreIndex) {
#pragma omp simd
            for (int j = 0; j < V; ++j) row[j] = 0.0f;
            continue;
        }
        MF_ASSERT(target >= 0 && target < V);
        const float lse = stats[r], lse_t = stats[N + r];
        const bool finite = std::isfinite(lse) && std::isfinite(lse_t);
        if (finite) {
#pragma omp simd
            for (int j = 0; j < V; ++j)
                row[j] = w_ce * fast_exp(row[j] - lse) + w_kl * (fast_exp(row[j] * inv_t - lse_t) - q[j]);
        } else {
            for (int j = 0; j < V; ++j)
                row[j] = w_ce * std::exp(row[j] - lse) + w_kl * (std::exp(row[j] * inv_t - lse_t) - q[j]);
        }
        row[target] -= w_ce;
    }
}

}  // namespace memfit::cpu

namespace memfit::cpu {

void row_logps(float * out, const float * losses, int B, int T) {
    for (int b = 0; b < B; ++b) out[b] = dpo_row_logp(losses, b, T);
}

void dpo_loss(float * losses, float * scale, float * logps, const float * ref, const int32_t * targets, int B, int T,
              const DpoDesc & d) {
    MF_ASSERT(B % 2 == 0);
    for (int i = 0; i < B / 2; ++i) dpo_pair(i, losses, scale, logps, ref, targets, T, d);
}

}  // namespace memfit::cpu
