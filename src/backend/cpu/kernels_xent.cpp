// CPU kernels: softmax cross-entropy, forward and backward (in place). Contracts are in
// kernels.h. Rows are independent, so both kernels parallelise over rows. Rows whose target is
// the ignore index (-100) still get their softmax in the forward (loss 0); the backward zeroes
// them. The row sum of exponentials is accumulated in double (the loop is scalar anyway: glibc's
// expf does not vectorise without -ffast-math).
#include "backend/cpu/kernels.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"

namespace memfit::cpu {

namespace {
constexpr int32_t kIgnoreIndex = -100;
}  // namespace

void crossentropy_forward(float * losses, float * logits_to_probs, const int32_t * targets,
                          int N, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        float * row = logits_to_probs + static_cast<size_t>(r) * V;
        const int32_t target = targets[r];
        MF_ASSERT(target == kIgnoreIndex || (target >= 0 && target < V));

        float maxv = row[0];
#pragma omp simd reduction(max : maxv)
        for (int j = 0; j < V; ++j) maxv = row[j] > maxv ? row[j] : maxv;

        // Read the target logit before the row is overwritten with probabilities.
        const float target_logit = target == kIgnoreIndex ? 0.0f : row[target];
        double sum = 0.0;
        for (int j = 0; j < V; ++j) {
            const float e = std::exp(row[j] - maxv);
            row[j] = e;
            sum += e;
        }
        const double lse = static_cast<double>(maxv) + std::log(sum);
        losses[r] = target == kIgnoreIndex ? 0.0f
                                           : static_cast<float>(lse - static_cast<double>(target_logit));
        const float inv = static_cast<float>(1.0 / sum);
#pragma omp simd
        for (int j = 0; j < V; ++j) row[j] *= inv;
    }
}

void crossentropy_backward(float * probs_to_dlogits, const int32_t * targets, float dloss,
                           int N, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; ++r) {
        float * row = probs_to_dlogits + static_cast<size_t>(r) * V;
        const int32_t target = targets[r];
        if (target == kIgnoreIndex) {
#pragma omp simd
            for (int j = 0; j < V; ++j) row[j] = 0.0f;
            continue;
        }
        MF_ASSERT(target >= 0 && target < V);
        const float p_target = row[target];
#pragma omp simd
        for (int j = 0; j < V; ++j) row[j] *= dloss;
        row[target] = (p_target - 1.0f) * dloss;
    }
}

}  // namespace memfit::cpu
