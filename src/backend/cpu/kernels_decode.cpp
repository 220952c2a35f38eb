// CPU kernels: attention of new tokens over a KV cache (generation), contiguous or paged.
// Contracts in kernels.h.
//
// The new keys and values are written to the cache first (contiguous: a ring under a sliding
// window, position p in row p % cap; paged: the row its block table names); then each
// (token, KV head) task scores the queries of the heads that read that KV head (h / (NH / KVH):
// grouped-query attention, nothing repeated) against every cached key up to the token's position
// (the last `window` of them), reading each key and value once for them all, takes the softmaxes
// and sums the cached values, in fp32 (per-thread score and output rows), rounding once as it
// stores. A task reads keys in position order whatever the cache's layout or the other tokens of
// the step, so a token's output does not depend on the batch it runs in.
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace memfit::cpu {

namespace {

// A cached element as fp32: the compute dtype's value, or an int8 code.
template <class T>
float widen(T x) {
    if constexpr (std::is_same_v<T, int8_t>) return float(x);
    else return to_f32(x);
}

// q . k over hd elements: in 8 lanes, each summing every 8th product in order, then the lanes
// pairwise (a fixed order, vectorized without reassociating); hd not a multiple of 8: in order.
template <class T>
float dot(const float * q, const T * k, int hd) {
    if (hd % 8 != 0) {
        float d = 0.0f;
        for (int i = 0; i < hd; ++i) d += q[i] * widen(k[i]);
        return d;
    }
    float lane[8] = {};
    for (int i = 0; i < hd; i += 8)
        for (int l = 0; l < 8; ++l) lane[l] += q[i + l] * widen(k[i + l]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// For the G query heads that read one KV head (grouped-query attention; G = 1 otherwise), heads
// q + j hd -> o + j hd: out = softmax(q . k_s / sqrt(hd)) . v_s over keys s = 0 .. nk-1, read
// through `rows`: rows.k(s), rows.v(s) the key's and value's head (hd elements of any storage),
// rows.ks(s), rows.vs(s) their scales (1 for plain rows: then every product below is the unscaled
// one exactly). Each key and value row is read once for all G heads; each head's operations are
// the ones it would do alone, in the same order. score (G nk floats) and acc (2 G hd floats) are
// the task's scratch.
template <class S, class Rows>
void attend(S * o, const S * q, int G, int nk, int hd, const Rows & rows, float * score, float * acc) {
    const float scale = 1.0f / std::sqrt(float(hd));
    const size_t gh = size_t(G) * size_t(hd);
    float * qf = acc + gh;
    for (size_t i = 0; i < gh; ++i) qf[i] = to_f32(q[i]);
    for (int s = 0; s < nk; ++s) {
        const auto * k = rows.k(s);
        const float ks = rows.ks(s);
        for (int j = 0; j < G; ++j) score[size_t(j) * nk + s] = dot(qf + size_t(j) * hd, k, hd) * ks * scale;
    }
    for (int j = 0; j < G; ++j) {   // each head's probabilities, the value's scale folded in
        float * sc = score + size_t(j) * nk;
        float maxv = -INFINITY, sum = 0.0f;
        for (int s = 0; s < nk; ++s) maxv = std::max(maxv, sc[s]);
        for (int s = 0; s < nk; ++s) sum += (sc[s] = std::exp(sc[s] - maxv));
        for (int s = 0; s < nk; ++s) sc[s] = sc[s] / sum * rows.vs(s);
    }
    std::fill(acc, acc + gh, 0.0f);
    for (int s = 0; s < nk; ++s) {
        const auto * v = rows.v(s);
        for (int j = 0; j < G; ++j) {
            const float p = score[size_t(j) * nk + s];
            float * a = acc + size_t(j) * hd;
#pragma omp simd
            for (int i = 0; i < hd; ++i) a[i] += p * widen(v[i]);
        }
    }
    for (size_t i = 0; i < gh; ++i) o[i] = from_f32<S>(acc[i]);
}

// Rows of a cache in the compute dtype: key s at element offset row_of(s) of kb and vb.
template <class S, class RowOf>
struct PlainRows {
    const S * kb;
    const S * vb;
    RowOf row_of;
    const S * k(int s) const { return kb + row_of(s); }
    const S * v(int s) const { return vb + row_of(s); }
    float ks(int) const { return 1.0f; }
    float vs(int) const { return 1.0f; }
};

// An int8 pool's rows (paged_kv.h): codes of KV head h at byte h * hd of the row, its scale the
// h-th float after the row's KV codes.
struct Int8Pool {
    const uint8_t * base;
    int64_t row_bytes, KV;
    const int8_t * codes(int64_t row, int64_t head) const {
        return reinterpret_cast<const int8_t *>(base + row * row_bytes) + head;
    }
    float scale(int64_t row, int kvh) const {
        float s;
        std::memcpy(&s, base + row * row_bytes + KV + 4 * kvh, 4);
        return s;
    }
};

template <class RowOf>
struct Int8Rows {
    Int8Pool kp, vp;
    int64_t head;   // the KV head's first element
    int kvh;
    RowOf row_of;   // key s's pool row
    const int8_t * k(int s) const { return kp.codes(row_of(s), head); }
    const int8_t * v(int s) const { return vp.codes(row_of(s), head); }
    float ks(int s) const { return kp.scale(row_of(s), kvh); }
    float vs(int s) const { return vp.scale(row_of(s), kvh); }
};

// One row's KVH heads of hd values into int8 codes and scales (paged_kv.h's rounding).
template <class S>
void store_int8_row(uint8_t * dst, const S * src, int KVH, int hd) {
    for (int h = 0; h < KVH; ++h) {
        float amax = 0.0f;
        for (int i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(to_f32(src[h * hd + i])));
        const float s = amax / 127.0f;
        for (int i = 0; i < hd; ++i) {
            const float c = s > 0.0f ? std::nearbyint(to_f32(src[h * hd + i]) / s) : 0.0f;
            dst[h * hd + i] = uint8_t(int8_t(std::max(-127.0f, std::min(127.0f, c))));
        }
        std::memcpy(dst + int64_t(KVH) * hd + 4 * h, &s, 4);
    }
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
    const int group = NH / KVH, tasks = B * KVH * Tn;   // a task: one KV head's group of query heads
#pragma omp parallel
    {
        const int most = window > 0 ? std::min(pos0 + Tn, window) : pos0 + Tn;   // keys one task reads
        std::vector<float> score(size_t(group) * size_t(most)), acc(2 * size_t(group) * size_t(hd));
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int t = task % Tn, g = (task / Tn) % KVH, b = task / (Tn * KVH);
            const size_t base = size_t(b) * cap * KV + size_t(g) * hd, h0 = size_t(g) * group * hd;
            // Causal: cached positions lo .. pos0 + t (a window's last W), position p in row p % cap.
            const int lo = window > 0 ? std::max(0, pos0 + t - window + 1) : 0, nk = pos0 + t + 1 - lo;
            auto row_of = [&](int s) { return size_t((lo + s) % cap) * KV; };
            attend(out + (size_t(b) * Tn + t) * Q + h0, qkv + (size_t(b) * Tn + t) * row + h0, group, nk, hd,
                   PlainRows<S, decltype(row_of)>{kcache + base, vcache + base, row_of}, score.data(), acc.data());
        }
    }
}

template <class S>
void paged_attention_forward(S * out, void * kpool, void * vpool, const S * qkv, const int32_t * meta, const PagedKv & kv,
                             int n, int NH, int KVH, int hd, int window) {
    MF_ASSERT(NH % KVH == 0 && n <= kv.tokens && kv.enabled());
    const size_t KV = size_t(KVH) * hd, Q = size_t(NH) * hd, row = Q + 2 * KV;
    const int64_t row_bytes = paged_row_bytes(kv, KVH, hd, sizeof(S));
    auto * kp = static_cast<uint8_t *>(kpool);
    auto * vp = static_cast<uint8_t *>(vpool);
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
        const S * src = qkv + size_t(i) * row + Q;
        if (kv.int8) {
            store_int8_row(kp + slot * row_bytes, src, KVH, hd);
            store_int8_row(vp + slot * row_bytes, src + KV, KVH, hd);
        } else {
            std::memcpy(kp + slot * row_bytes, src, KV * sizeof(S));
            std::memcpy(vp + slot * row_bytes, src + KV, KV * sizeof(S));
        }
        most = std::max(most, window > 0 ? std::min(pos[i] + 1, window) : pos[i] + 1);
    }
    const int group = NH / KVH, tasks = n * KVH;   // a task: one KV head's group of query heads
#pragma omp parallel
    {
        std::vector<float> score(size_t(group) * size_t(most)), acc(2 * size_t(group) * size_t(hd));
        std::vector<int64_t> slots(static_cast<size_t>(most));
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int i = task / KVH, kvh = task % KVH;
            const size_t h0 = size_t(kvh) * group * hd;
            S * o = out + size_t(i) * Q + h0;
            if (seq[i] < 0) {
                std::fill(o, o + size_t(group) * hd, from_f32<S>(0.0f));
                continue;
            }
            const int32_t * blocks = table_row(i);
            const int lo = window > 0 ? std::max(0, pos[i] - window + 1) : 0, nk = pos[i] + 1 - lo;
            const S * q = qkv + size_t(i) * row + h0;
            // Keys lo .. pos in order, block by block (their pool rows, found once per task).
            for (int s = 0, b = lo / kv.block, off = lo % kv.block; s < nk; ++s) {
                slots[size_t(s)] = int64_t(blocks[b]) * kv.block + off;
                if (++off == kv.block) off = 0, ++b;
            }
            auto slot = [&](int s) { return slots[size_t(s)]; };
            if (kv.int8) {
                const Int8Pool k8{kp, row_bytes, int64_t(KV)}, v8{vp, row_bytes, int64_t(KV)};
                attend(o, q, group, nk, hd, Int8Rows<decltype(slot)>{k8, v8, int64_t(kvh) * hd, kvh, slot},
                       score.data(), acc.data());
            } else {
                auto row_of = [&](int s) { return size_t(slot(s)) * KV; };
                attend(o, q, group, nk, hd,
                       PlainRows<S, decltype(row_of)>{reinterpret_cast<const S *>(kp) + size_t(kvh) * hd,
                                                      reinterpret_cast<const S *>(vp) + size_t(kvh) * hd, row_of},
                       score.data(), acc.data());
            }
        }
    }
}

#define MF_DECODE_KERNELS(S)                                                                                        \
    template void cached_attention_forward<S>(S *, S *, S *, const S *, int, int, int, int, int, int, int, int);      \
    template void paged_attention_forward<S>(S *, void *, void *, const S *, const int32_t *, const PagedKv &, int,    \
                                             int, int, int, int);
MF_DECODE_KERNELS(float)
MF_DECODE_KERNELS(bf16_t)
MF_DECODE_KERNELS(f16_t)

}  // namespace memfit::cpu
