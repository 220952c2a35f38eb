// CPU kernels: attention of new tokens over a KV cache (generation), contiguous or paged.
// Contracts in kernels.h.
//
// The new keys and values are written to the cache first (contiguous: a ring under a sliding
// window, position p in row p % cap; paged: the row its block table names); then each
// (token, head) task scores its query against every cached key up to its own position (the last
// `window` of them), takes the softmax and sums the cached values, in fp32 (per-thread score and
// output rows), rounding once as it stores. Grouped-query heads read KV head h / (NH / KVH)
// directly: nothing is repeated. A task reads keys in position order whatever the cache's layout
// or the other tokens of the step, so a token's output does not depend on the batch it runs in.
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace memfit::cpu {

namespace {

// out[hd] = softmax(q . k_s / sqrt(hd)) . v_s over keys s = 0 .. nk-1, key s at row_of(s) of
// the cache (an element offset); score and acc are the task's scratch (nk and hd floats).
template <class S, class RowOf>
void attend(S * o, const S * q, const S * kb, const S * vb, int nk, int hd, RowOf row_of, float * score, float * acc) {
    const float scale = 1.0f / std::sqrt(float(hd));
    float maxv = -INFINITY;
    for (int s = 0; s < nk; ++s) {
        const S * k = kb + row_of(s);
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int i = 0; i < hd; ++i) d += to_f32(q[i]) * to_f32(k[i]);
        score[s] = d * scale;
        maxv = std::max(maxv, d * scale);
    }
    float sum = 0.0f;
    for (int s = 0; s < nk; ++s) sum += (score[s] = std::exp(score[s] - maxv));
    std::fill(acc, acc + hd, 0.0f);
    for (int s = 0; s < nk; ++s) {
        const S * v = vb + row_of(s);
        const float p = score[s] / sum;
#pragma omp simd
        for (int i = 0; i < hd; ++i) acc[i] += p * to_f32(v[i]);
    }
    for (int i = 0; i < hd; ++i) o[i] = from_f32<S>(acc[i]);
}

}  // namespace

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
#pragma omp parallel
    {
        const int most = window > 0 ? std::min(pos0 + Tn, window) : pos0 + Tn;   // keys one task reads
        std::vector<float> score(static_cast<size_t>(most)), acc(static_cast<size_t>(hd));
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int t = task % Tn, h = (task / Tn) % NH, b = task / (Tn * NH);
            const size_t head = size_t(h / group) * hd, base = size_t(b) * cap * KV + head;
            // Causal: cached positions lo .. pos0 + t (a window's last W), position p in row p % cap.
            const int lo = window > 0 ? std::max(0, pos0 + t - window + 1) : 0, nk = pos0 + t + 1 - lo;
            attend(out + (size_t(b) * Tn + t) * Q + size_t(h) * hd, qkv + (size_t(b) * Tn + t) * row + size_t(h) * hd,
                   kcache + base, vcache + base, nk, hd, [&](int s) { return size_t((lo + s) % cap) * KV; },
                   score.data(), acc.data());
        }
    }
}

template <class S>
void paged_attention_forward(S * out, S * kpool, S * vpool, const S * qkv, const int32_t * meta, const PagedKv & kv,
                             int n, int NH, int KVH, int hd, int window) {
    MF_ASSERT(NH % KVH == 0 && n <= kv.tokens && kv.enabled());
    const size_t KV = size_t(KVH) * hd, Q = size_t(NH) * hd, row = Q + 2 * KV;
    const int32_t * seq = meta + kv.seq_at();
    const int32_t * pos = meta + kv.pos_at();
    const int32_t * table = meta + kv.table_at();
    auto table_row = [&](int i) { return table + int64_t(seq[i]) * kv.max_blocks; };
    int most = 1;   // keys one task reads at most
    for (int i = 0; i < n; ++i) {
        if (seq[i] < 0) continue;
        MF_ASSERT(seq[i] < kv.seqs && pos[i] >= 0 && pos[i] / kv.block < kv.max_blocks);
        const int64_t slot = paged_slot(table_row(i), kv.block, pos[i]);
        MF_ASSERT(slot >= 0 && slot < kv.pool_rows() && "a paged step's token has no block");
        std::memcpy(kpool + size_t(slot) * KV, qkv + size_t(i) * row + Q, KV * sizeof(S));
        std::memcpy(vpool + size_t(slot) * KV, qkv + size_t(i) * row + Q + KV, KV * sizeof(S));
        most = std::max(most, window > 0 ? std::min(pos[i] + 1, window) : pos[i] + 1);
    }
    const int group = NH / KVH, tasks = n * NH;
#pragma omp parallel
    {
        std::vector<float> score(static_cast<size_t>(most)), acc(static_cast<size_t>(hd));
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int i = task / NH, h = task % NH;
            S * o = out + size_t(i) * Q + size_t(h) * hd;
            if (seq[i] < 0) {
                std::fill(o, o + hd, from_f32<S>(0.0f));
                continue;
            }
            const int32_t * blocks = table_row(i);
            const int lo = window > 0 ? std::max(0, pos[i] - window + 1) : 0, nk = pos[i] + 1 - lo;
            const size_t head = size_t(h / group) * hd;
            attend(o, qkv + size_t(i) * row + size_t(h) * hd, kpool + head, vpool + head, nk, hd,
                   [&](int s) { return size_t(paged_slot(blocks, kv.block, lo + s)) * KV; }, score.data(), acc.data());
        }
    }
}

#define MF_DECODE_KERNELS(S)                                                                                        \
    template void cached_attention_forward<S>(S *, S *, S *, const S *, int, int, int, int, int, int, int, int);      \
    template void paged_attention_forward<S>(S *, S *, S *, const S *, const int32_t *, const PagedKv &, int, int, int, \
                                             int, int);
MF_DECODE_KERNELS(float)
MF_DECODE_KERNELS(bf16_t)
MF_DECODE_KERNELS(f16_t)

}  // namespace memfit::cpu
