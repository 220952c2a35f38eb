// Context parallelism's attention (kernel_list.h's cp_attention_fwd / cp_attention_bwd): this
// rank's query rows over every position's keys and values, each query's keys the range meta
// gives (its first key .. its own position), grouped KV heads read directly. Rows are computed in
// fp32 from the storage type, keys in blocks of kBlock with an online softmax; the backward
// recomputes the probabilities from the saved log-sum-exp, dq per query and dk, dv per key (one
// task each, a fixed order: deterministic for any thread count).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/convert.h"
#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

constexpr int kBlock = 64;
constexpr int kMaxHd = 256;   // a head's floats, on each task's stack

struct CpShape {
    int B, Tl, T, NH, KVH, hd;
    int64_t qw() const { return int64_t(NH + 2 * KVH) * hd; }   // a qkv row
    int64_t kvw() const { return int64_t(2 * KVH) * hd; }       // a kv row: k | v
    int group() const { return NH / KVH; }
};

template <class S>
void load(float * d, const S * s, int n) {
    for (int i = 0; i < n; ++i) d[i] = to_f32(s[i]);
}

float dot(const float * a, const float * b, int n) {
    float s = 0;
    for (int i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// One query row of head h: out (hd floats) and its log-sum-exp.
template <class S>
float attend_row(float * out, const float * q, const S * kv, const CpShape & c, int b, int kvh, int lo, int hi,
                 float scale) {
    const int hd = c.hd;
    float k[kMaxHd], v[kMaxHd];
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    std::fill(out, out + hd, 0.0f);
    float s[kBlock];
    for (int j0 = lo; j0 <= hi; j0 += kBlock) {
        const int n = std::min(kBlock, hi - j0 + 1);
        float bm = m;
        for (int j = 0; j < n; ++j) {
            load(k, kv + (int64_t(b) * c.T + j0 + j) * c.kvw() + int64_t(kvh) * hd, hd);
            s[j] = dot(q, k, hd) * scale;
            bm = std::max(bm, s[j]);
        }
        const float r = std::exp(m - bm);   // m = -inf at the first block: r = 0, nothing to rescale
        l *= r;
        for (int i = 0; i < hd; ++i) out[i] *= r;
        for (int j = 0; j < n; ++j) {
            const float p = std::exp(s[j] - bm);
            l += p;
            load(v, kv + (int64_t(b) * c.T + j0 + j) * c.kvw() + int64_t(c.KVH + kvh) * hd, hd);
            for (int i = 0; i < hd; ++i) out[i] += p * v[i];
        }
        m = bm;
    }
    for (int i = 0; i < hd; ++i) out[i] /= l;
    return m + std::log(l);
}

template <class S>
void cp_forward(S * out, float * lse, const S * qkv, const S * kv, const int32_t * meta, const CpShape & c) {
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const int64_t rows = int64_t(c.B) * c.Tl;
#pragma omp parallel for schedule(dynamic, 4) collapse(2)
    for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < c.NH; ++h) {
            const int b = int(r / c.Tl), t = int(r % c.Tl);
            float q[kMaxHd], o[kMaxHd];
            load(q, qkv + r * c.qw() + int64_t(h) * c.hd, c.hd);
            const int hi = meta[r], lo = meta[rows + r];
            const float L = attend_row(o, q, kv, c, b, h / c.group(), lo, hi, scale);
            lse[(int64_t(b) * c.NH + h) * c.Tl + t] = L;
            S * dst = out + r * int64_t(c.NH) * c.hd + int64_t(h) * c.hd;
            for (int i = 0; i < c.hd; ++i) dst[i] = from_f32<S>(o[i]);
        }
}

// Per query row and head: D = dout . out (fp32), the softmax's backward term.
template <class S>
void dout_dot_out(float * D, const S * dout, const S * out, const CpShape & c) {
    const int64_t rows = int64_t(c.B) * c.Tl;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float a[kMaxHd], o[kMaxHd];
        for (int h = 0; h < c.NH; ++h) {
            load(a, dout + (r * c.NH + h) * c.hd, c.hd);
            load(o, out + (r * c.NH + h) * c.hd, c.hd);
            D[r * c.NH + h] = dot(a, o, c.hd);
        }
    }
}

template <class S>
void cp_backward(S * dqkv, S * dkv, float * D, const S * dout, const S * out, const S * qkv, const S * kv,
                 const float * lse, const int32_t * meta, const CpShape & c) {
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const int64_t rows = int64_t(c.B) * c.Tl;
    const int hd = c.hd;
    dout_dot_out(D, dout, out, c);
    // dq: per query row and head, over its keys.
#pragma omp parallel for schedule(dynamic, 4) collapse(2)
    for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < c.NH; ++h) {
            const int b = int(r / c.Tl), t = int(r % c.Tl), kvh = h / c.group();
            float q[kMaxHd], g[kMaxHd], k[kMaxHd], v[kMaxHd], dq[kMaxHd] = {};
            load(q, qkv + r * c.qw() + int64_t(h) * hd, hd);
            load(g, dout + (r * c.NH + h) * hd, hd);
            const float L = lse[(int64_t(b) * c.NH + h) * c.Tl + t], Dr = D[r * c.NH + h];
            for (int j = meta[rows + r]; j <= meta[r]; ++j) {
                const S * row = kv + (int64_t(b) * c.T + j) * c.kvw();
                load(k, row + int64_t(kvh) * hd, hd);
                load(v, row + int64_t(c.KVH + kvh) * hd, hd);
                const float p = std::exp(dot(q, k, hd) * scale - L);
                const float ds = p * (dot(g, v, hd) - Dr) * scale;
                for (int i = 0; i < hd; ++i) dq[i] += ds * k[i];
            }
            S * dst = dqkv + r * c.qw();
            for (int i = 0; i < hd; ++i) dst[int64_t(h) * hd + i] = from_f32<S>(dq[i]);
            if (h == 0) std::fill(dst + int64_t(c.NH) * hd, dst + c.qw(), from_f32<S>(0.0f));
        }
    // dk, dv: per position and KV head, over the queries (and the group's heads) that read it.
#pragma omp parallel for schedule(dynamic, 16) collapse(2)
    for (int64_t p = 0; p < int64_t(c.B) * c.T; ++p)
        for (int kvh = 0; kvh < c.KVH; ++kvh) {
            const int b = int(p / c.T), j = int(p % c.T);
            float k[kMaxHd], v[kMaxHd], q[kMaxHd], g[kMaxHd], dk[kMaxHd] = {}, dv[kMaxHd] = {};
            load(k, kv + p * c.kvw() + int64_t(kvh) * hd, hd);
            load(v, kv + p * c.kvw() + int64_t(c.KVH + kvh) * hd, hd);
            for (int t = 0; t < c.Tl; ++t) {
                const int64_t r = int64_t(b) * c.Tl + t;
                if (j < meta[rows + r] || j > meta[r]) continue;
                for (int h = kvh * c.group(); h < (kvh + 1) * c.group(); ++h) {
                    load(q, qkv + r * c.qw() + int64_t(h) * hd, hd);
                    load(g, dout + (r * c.NH + h) * hd, hd);
                    const float pr = std::exp(dot(q, k, hd) * scale - lse[(int64_t(b) * c.NH + h) * c.Tl + t]);
                    const float ds = pr * (dot(g, v, hd) - D[r * c.NH + h]) * scale;
                    for (int i = 0; i < hd; ++i) {
                        dk[i] += ds * q[i];
                        dv[i] += pr * g[i];
                    }
                }
            }
            S * dst = dkv + p * c.kvw();
            for (int i = 0; i < hd; ++i) {
                dst[int64_t(kvh) * hd + i] = from_f32<S>(dk[i]);
                dst[int64_t(c.KVH + kvh) * hd + i] = from_f32<S>(dv[i]);
            }
        }
}

}  // namespace

template <class S>
void cp_attention_forward(S * out, float * lse, const S * qkv, const S * kv, const int32_t * meta, int B, int Tl,
                          int T, int NH, int KVH, int hd) {
    MF_ASSERT(hd <= kMaxHd && NH % KVH == 0);
    cp_forward(out, lse, qkv, kv, meta, CpShape{B, Tl, T, NH, KVH, hd});
}

template <class S>
void cp_attention_backward(S * dqkv, S * dkv, float * scratch, const S * dout, const S * out, const S * qkv,
                           const S * kv, const float * lse, const int32_t * meta, int B, int Tl, int T, int NH,
                           int KVH, int hd) {
    MF_ASSERT(hd <= kMaxHd && NH % KVH == 0);
    cp_backward(dqkv, dkv, scratch, dout, out, qkv, kv, lse, meta, CpShape{B, Tl, T, NH, KVH, hd});
}

#define MF_CP_INSTANTIATE(S)                                                                                    \
    template void cp_attention_forward<S>(S *, float *, const S *, const S *, const int32_t *, int, int, int, int, \
                                          int, int);                                                             \
    template void cp_attention_backward<S>(S *, S *, float *, const S *, const S *, const S *, const S *,          \
                                           const float *, const int32_t *, int, int, int, int, int, int);
MF_CP_INSTANTIATE(float)
MF_CP_INSTANTIATE(bf16_t)
MF_CP_INSTANTIATE(f16_t)
#undef MF_CP_INSTANTIATE

}  // namespace memfit::cpu

// ---- The ring (kernel_list.h's cp_block_fwd / cp_block_bwd / cp_qkv_grad): one visiting block
// of Tl key rows at a time, each with its position (kpos), merged into fp32 accumulators.
namespace memfit::cpu {

namespace {

template <class S>
void block_forward(float * acc, float * acc_lse, const S * qkv, const S * kv, const int32_t * kpos,
                   const int32_t * meta, const CpShape & c, bool first) {
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const int64_t rows = int64_t(c.B) * c.Tl;
    const int hd = c.hd;
#pragma omp parallel for schedule(dynamic, 4) collapse(2)
    for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < c.NH; ++h) {
            const int b = int(r / c.Tl), t = int(r % c.Tl), kvh = h / c.group();
            const int pos = meta[r], lo = meta[rows + r];
            float q[kMaxHd], k[kMaxHd], v[kMaxHd], o[kMaxHd] = {};
            load(q, qkv + r * c.qw() + int64_t(h) * hd, hd);
            float m = -std::numeric_limits<float>::infinity(), l = 0;
            for (int j = 0; j < c.T; ++j) {   // the block's rows (c.T = Tl here), in row order
                if (kpos[j] < lo || kpos[j] > pos) continue;
                const S * row = kv + (int64_t(b) * c.T + j) * c.kvw();
                load(k, row + int64_t(kvh) * hd, hd);
                const float s = dot(q, k, hd) * scale, nm = std::max(m, s), cr = std::exp(m - nm), p = std::exp(s - nm);
                l = l * cr + p;
                load(v, row + int64_t(c.KVH + kvh) * hd, hd);
                for (int i = 0; i < hd; ++i) o[i] = o[i] * cr + p * v[i];
                m = nm;
            }
            float * L = acc_lse + (int64_t(b) * c.NH + h) * c.Tl + t;
            float * a = acc + (r * c.NH + h) * hd;
            if (first) {   // the accumulators start here (a query's own block holds its own key)
                for (int i = 0; i < hd; ++i) a[i] = l > 0 ? o[i] / l : 0.0f;
                *L = l > 0 ? m + std::log(l) : -std::numeric_limits<float>::infinity();
                continue;
            }
            if (l == 0) continue;   // no key of this block is this query's
            const float lb = m + std::log(l), la = *L, nl = la > lb ? la + std::log1p(std::exp(lb - la))
                                                                     : lb + std::log1p(std::exp(la - lb));
            const float wa = std::exp(la - nl), wb = std::exp(lb - nl) / l;
            for (int i = 0; i < hd; ++i) a[i] = a[i] * wa + o[i] * wb;
            *L = nl;
        }
}

template <class S>
void block_backward(float * dq, float * dkv, float * D, const S * dout, const S * out, const S * qkv, const S * kv,
                    const float * lse, const int32_t * kpos, const int32_t * meta, const CpShape & c) {
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const int64_t rows = int64_t(c.B) * c.Tl;
    const int hd = c.hd;
    dout_dot_out(D, dout, out, c);
#pragma omp parallel for schedule(dynamic, 4) collapse(2)
    for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < c.NH; ++h) {
            const int b = int(r / c.Tl), t = int(r % c.Tl), kvh = h / c.group();
            const int pos = meta[r], lo = meta[rows + r];
            float q[kMaxHd], g[kMaxHd], k[kMaxHd], v[kMaxHd];
            load(q, qkv + r * c.qw() + int64_t(h) * hd, hd);
            load(g, dout + (r * c.NH + h) * hd, hd);
            const float L = lse[(int64_t(b) * c.NH + h) * c.Tl + t], Dr = D[r * c.NH + h];
            float * d = dq + (r * c.NH + h) * hd;
            for (int j = 0; j < c.T; ++j) {
                if (kpos[j] < lo || kpos[j] > pos) continue;
                const S * row = kv + (int64_t(b) * c.T + j) * c.kvw();
                load(k, row + int64_t(kvh) * hd, hd);
                load(v, row + int64_t(c.KVH + kvh) * hd, hd);
                const float p = std::exp(dot(q, k, hd) * scale - L), ds = p * (dot(g, v, hd) - Dr) * scale;
                for (int i = 0; i < hd; ++i) d[i] += ds * k[i];
            }
        }
#pragma omp parallel for schedule(dynamic, 16) collapse(2)
    for (int64_t p = 0; p < int64_t(c.B) * c.T; ++p)
        for (int kvh = 0; kvh < c.KVH; ++kvh) {
            const int b = int(p / c.T), j = int(p % c.T);
            float k[kMaxHd], v[kMaxHd], q[kMaxHd], g[kMaxHd];
            load(k, kv + p * c.kvw() + int64_t(kvh) * hd, hd);
            load(v, kv + p * c.kvw() + int64_t(c.KVH + kvh) * hd, hd);
            float * dk = dkv + p * c.kvw() + int64_t(kvh) * hd;
            float * dv = dkv + p * c.kvw() + int64_t(c.KVH + kvh) * hd;
            for (int t = 0; t < c.Tl; ++t) {
                const int64_t r = int64_t(b) * c.Tl + t;
                if (kpos[j] < meta[rows + r] || kpos[j] > meta[r]) continue;
                for (int h = kvh * c.group(); h < (kvh + 1) * c.group(); ++h) {
                    load(q, qkv + r * c.qw() + int64_t(h) * hd, hd);
                    load(g, dout + (r * c.NH + h) * hd, hd);
                    const float pr = std::exp(dot(q, k, hd) * scale - lse[(int64_t(b) * c.NH + h) * c.Tl + t]);
                    const float ds = pr * (dot(g, v, hd) - D[r * c.NH + h]) * scale;
                    for (int i = 0; i < hd; ++i) {
                        dk[i] += ds * q[i];
                        dv[i] += pr * g[i];
                    }
                }
            }
        }
}

}  // namespace

template <class S>
void cp_block_forward(float * acc, float * acc_lse, const S * qkv, const S * kv, const int32_t * kpos,
                      const int32_t * meta, int B, int Tl, int NH, int KVH, int hd, bool first) {
    MF_ASSERT(hd <= kMaxHd && NH % KVH == 0);
    block_forward(acc, acc_lse, qkv, kv, kpos, meta, CpShape{B, Tl, Tl, NH, KVH, hd}, first);
}

template <class S>
void cp_block_backward(float * dq, float * dkv, float * scratch, const S * dout, const S * out, const S * qkv,
                       const S * kv, const float * lse, const int32_t * kpos, const int32_t * meta, int B, int Tl,
                       int NH, int KVH, int hd) {
    MF_ASSERT(hd <= kMaxHd && NH % KVH == 0);
    block_backward(dq, dkv, scratch, dout, out, qkv, kv, lse, kpos, meta, CpShape{B, Tl, Tl, NH, KVH, hd});
}

template <class S>
void cp_qkv_grad(S * dqkv, const float * dq, const float * dkv, int64_t rows, int NH, int KVH, int hd) {
    const int64_t q = int64_t(NH) * hd, kv = int64_t(2 * KVH) * hd;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        from_f32_row(dqkv + r * (q + kv), dq + r * q, size_t(q));
        from_f32_row(dqkv + r * (q + kv) + q, dkv + r * kv, size_t(kv));
    }
}

#define MF_CP_RING(S)                                                                                          \
    template void cp_block_forward<S>(float *, float *, const S *, const S *, const int32_t *, const int32_t *, \
                                      int, int, int, int, int, bool);                                          \
    template void cp_block_backward<S>(float *, float *, float *, const S *, const S *, const S *, const S *,   \
                                       const float *, const int32_t *, const int32_t *, int, int, int, int, int); \
    template void cp_qkv_grad<S>(S *, const float *, const float *, int64_t, int, int, int);
MF_CP_RING(float)
MF_CP_RING(bf16_t)
MF_CP_RING(f16_t)
#undef MF_CP_RING

}  // namespace memfit::cpu
