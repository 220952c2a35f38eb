// CPU kernel: attention of new tokens over a KV cache (generation). Contract in kernels.h.
//
// The new keys and values are appended to the caches first (a ring under a sliding window:
// position p in row p % cap); then each (b, head, new token) task scores its query against every
// cached key up to its own position (the last `window` of them), takes the softmax and
// sums the cached values, in fp32 (per-thread score and output rows), rounding once as it
// stores. Grouped-query heads read KV head h / (NH / KVH) directly: nothing is repeated.
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace memfit::cpu {

template <class S>
void cached_attention_forward(S * out, S * kcache, S * vcache, const S * qkv, int B, int Tn, int pos0, int cap,
                              int NH, int KVH, int hd, int window) {
    MF_ASSERT(NH % KVH == 0 && pos0 >= 0 && (pos0 + Tn <= cap || (window > 0 && Tn + window - 1 <= cap)));
    const size_t KV = size_t(KVH) * hd, Q = size_t(NH) * hd, row = Q + 2 * KV;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tn; ++t) {
            const S * src = qkv + (size_t(b) * Tn + t) * row;
            const size_t dst = (size_t(b) * cap + size_t((pos0 + t) % cap)) * KV;
            std::memcpy(kcache + dst, src + Q, KV * sizeof(S));
            std::memcpy(vcache + dst, src + Q + KV, KV * sizeof(S));
        }
    const int group = NH / KVH, tasks = B * NH * Tn;
    const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel
    {
        const int most = window > 0 ? std::min(pos0 + Tn, window) : pos0 + Tn;   // keys one task reads
        std::vector<float> score(static_cast<size_t>(most)), acc(static_cast<size_t>(hd));
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int t = task % Tn, h = (task / Tn) % NH, b = task / (Tn * NH);
            const S * q = qkv + (size_t(b) * Tn + t) * row + size_t(h) * hd;
            const size_t head = size_t(h / group) * hd;
            const S * kb = kcache + size_t(b) * cap * KV + head;
            const S * vb = vcache + size_t(b) * cap * KV + head;
            // Causal: cached positions lo .. pos0 + t (a window's last W), position p in row p % cap.
            const int lo = window > 0 ? std::max(0, pos0 + t - window + 1) : 0, nk = pos0 + t + 1 - lo;
            float maxv = -INFINITY;
            for (int s = 0; s < nk; ++s) {
                const S * k = kb + size_t((lo + s) % cap) * KV;
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int i = 0; i < hd; ++i) d += to_f32(q[i]) * to_f32(k[i]);
                score[size_t(s)] = d * scale;
                maxv = std::max(maxv, d * scale);
            }
            float sum = 0.0f;
            for (int s = 0; s < nk; ++s) sum += (score[size_t(s)] = std::exp(score[size_t(s)] - maxv));
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int s = 0; s < nk; ++s) {
                const S * v = vb + size_t((lo + s) % cap) * KV;
                const float p = score[size_t(s)] / sum;
                float * a = acc.data();
#pragma omp simd
                for (int i = 0; i < hd; ++i) a[i] += p * to_f32(v[i]);
            }
            S * o = out + (size_t(b) * Tn + t) * Q + size_t(h) * hd;
            for (int i = 0; i < hd; ++i) o[i] = from_f32<S>(acc[size_t(i)]);
        }
    }
}

template void cached_attention_forward<float>(float *, float *, float *, const float *, int, int, int, int, int, int,
                                              int, int);
template void cached_attention_forward<bf16_t>(bf16_t *, bf16_t *, bf16_t *, const bf16_t *, int, int, int, int, int,
                                               int, int, int);
template void cached_attention_forward<f16_t>(f16_t *, f16_t *, f16_t *, const f16_t *, int, int, int, int, int, int,
                                              int, int);

}  // namespace memfit::cpu
