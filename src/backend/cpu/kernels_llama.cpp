// CPU kernels of the LLaMA family: RMSNorm, rotary position embeddings, SwiGLU and the
// grouped-query repeat of K/V heads. Contracts are in kernels.h; templated on the storage type
// like kernels_basic.cpp (loads through to_f32, compute in fp32, one rounding per store; the
// float instantiations are the fp32 kernels). Every parallel loop uses a static schedule and
// every reduction a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/exp_poly.h"
#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

// Output columns per task for the weight gradient's reduction over rows (as kernels_basic.cpp).
constexpr int kColBlock = 32;

// g = round(g + acc): the one rounded add of a gradient element (a plain += for float).
template <class G>
inline void add_to(G & g, float acc) { g = from_f32<G>(to_f32(g) + acc); }

// exp(y) with |y| clamped to 87 (result in [1.6e-38, 6.1e37]), about 1.5 ulp: the shared
// polynomial (exp_poly.h) after a Cody-Waite reduction, branch-free so `omp simd` loops vectorise
// (glibc's expf does not). The clamp keeps 2^n in the normal range: silu(g) for g < -87 comes out
// as g * 1.6e-38 instead of g * exp(g), both negligible.
inline float exp_clamped(float y) {
    constexpr int32_t kMaxBits = 0x42ae0000;   // bit pattern of 87.0f
    const int32_t mag = std::bit_cast<int32_t>(std::fabs(y));
    const float yc = std::copysign(std::bit_cast<float>(std::min(mag, kMaxBits)), y);
    const float n = (yc * kExpLog2e + kExpRound) - kExpRound;  // round(yc / ln2)
    const float r = (yc - n * kExpLn2Hi) - n * kExpLn2Lo;
    return exp_reduced(r) * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// Rotates the q and k heads of every row by the position's angles; sign = +1 forward, -1 for
// the inverse rotation (the backward; with longrope's magnitude m the backward of m R is m R^T).
// Only each head's first rotary_dims turn. inv_freq (half doubles) is shared; each thread keeps
// the half cos/sin pairs of its current row.
template <class S>
void rope_apply(S * x, int B, int T, int NH, int KVH, int hd, const Rope & rope, int pos0, float sign,
                const int32_t * doc_start) {
    const int rot = rope.rotary_dims(hd);
    MF_ASSERT(hd > 0 && rot > 0 && rot % 2 == 0 && rot <= hd && NH > 0 && KVH > 0);
    const int half = rot / 2;
    const int width = (NH + 2 * KVH) * hd;
    const int heads = NH + KVH;  // rotated heads per row: q then k, contiguous
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i)
        inv_freq[static_cast<size_t>(i)] = rope.inv_freq(i, hd);
    const float mag = rope.magnitude();
    const int rows = B * T;
#pragma omp parallel
    {
        std::vector<float> cs(static_cast<size_t>(rot));  // [cos (half) | sign * sin (half)]
#pragma omp for schedule(static)
        for (int r = 0; r < rows; ++r) {
            const double pos = static_cast<double>(pos0) + static_cast<double>(token_position(doc_start, r, T));
            float * cosv = cs.data();
            float * sinv = cs.data() + half;
            for (int i = 0; i < half; ++i) {
                const double a = pos * inv_freq[static_cast<size_t>(i)];
                cosv[i] = mag * static_cast<float>(std::cos(a));
                sinv[i] = sign * mag * static_cast<float>(std::sin(a));
            }
            S * row = x + static_cast<size_t>(r) * width;
            for (int h = 0; h < heads; ++h) {
                S * lo = row + static_cast<size_t>(h) * hd;
                S * hi = lo + half;
#pragma omp simd
                for (int i = 0; i < half; ++i) {
                    const float x0 = to_f32(lo[i]), x1 = to_f32(hi[i]);
                    lo[i] = from_f32<S>(x0 * cosv[i] - x1 * sinv[i]);
                    hi[i] = from_f32<S>(x1 * cosv[i] + x0 * sinv[i]);
                }
            }
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RMSNorm

template <class S>
void rmsnorm_forward(S * out, float * rstd, const S * inp, const S * weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const S * x = inp + static_cast<size_t>(i) * C;
        S * o = out + static_cast<size_t>(i) * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; ++c) {
            const float v = to_f32(x[c]);
            ss += v * v;
        }
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = from_f32<S>(to_f32(x[c]) * r * to_f32(weight[c]));
        rstd[i] = r;
    }
}

// y = w * n, n = x * r, r = (mean(x^2) + eps)^(-1/2):
//   dx = r * (dn - n * mean(dn * n)),  dn = w * dy;   dw = sum over rows of dy * n.
template <class G, class S>
void rmsnorm_backward(S * dinp, G * dweight, const S * dout, const S * inp, const S * weight, const float * rstd,
                      int N, int C) {
    const float inv_c = 1.0f / static_cast<float>(C);
    // dinp: independent rows.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const size_t off = static_cast<size_t>(i) * C;
        const S * x = inp + off;
        const S * g = dout + off;
        S * dx = dinp + off;
        const float r = rstd[i];
        float sum_dnn = 0.0f;
#pragma omp simd reduction(+ : sum_dnn)
        for (int c = 0; c < C; ++c) sum_dnn += to_f32(weight[c]) * to_f32(g[c]) * (to_f32(x[c]) * r);
        const float mean_dnn = sum_dnn * inv_c;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
            const float n = to_f32(x[c]) * r;
            const float dn = to_f32(weight[c]) * to_f32(g[c]);
            add_to(dx[c], r * (dn - n * mean_dnn));
        }
    }
    // dweight: a reduction over rows, parallel over column blocks, each summing its rows in order
    // (none for a frozen norm).
    if (!dweight) return;
    const int nblk = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, C - c0);
        float dw[kColBlock] = {};
        for (int i = 0; i < N; ++i) {
            const size_t off = static_cast<size_t>(i) * C + c0;
            const S * x = inp + off;
            const S * g = dout + off;
            const float r = rstd[i];
#pragma omp simd
            for (int c = 0; c < nc; ++c) dw[c] += to_f32(g[c]) * (to_f32(x[c]) * r);
        }
        for (int c = 0; c < nc; ++c) add_to(dweight[c0 + c], dw[c]);
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary position embeddings

template <class S>
void rope_forward(S * qkv, int B, int T, int NH, int KVH, int hd, const Rope & rope, int pos0, const int32_t * doc_start) {
    rope_apply(qkv, B, T, NH, KVH, hd, rope, pos0, 1.0f, doc_start);
}

template <class S>
void rope_backward(S * dqkv, int B, int T, int NH, int KVH, int hd, const Rope & rope, int pos0,
                   const int32_t * doc_start) {
    rope_apply(dqkv, B, T, NH, KVH, hd, rope, pos0, -1.0f, doc_start);
}

// ---------------------------------------------------------------------------------------------
// Gated MLP activations: out = act(g) * u, per row [gate | up]; backward d/du = act(g), d/dg = u
// act'(g). A Gate gives act and act':
//   SwiGLU  act(g) = silu(g) = g s, s = sigmoid(g) = 1 / (1 + e), e = exp(-g); act' = s + g e s^2
//   GeGLU   act(g) = GELU's tanh form g s2, s2 = sigmoid(2u) = 1 / (1 + e2), e2 = exp(-2u), 2u =
//           2 sqrt(2/pi) (g + 0.044715 g^3) (kernels_gelu.cpp's arithmetic); act' = s2 + g e2 s2^2 2u'

namespace {
struct SiluGate {
    static float act(float g) { return g * (1.0f / (1.0f + exp_clamped(-g))); }
    static float deriv(float g) {
        const float e = exp_clamped(-g), s = 1.0f / (1.0f + e);
        return s + g * ((e * s) * s);
    }
};
struct GeluTanhGate {
    static constexpr float kTwoBeta = 1.5957691216057308f, kKappa = 0.044715f;   // 2 sqrt(2/pi)
    static float act(float g) { return g * (1.0f / (1.0f + exp_clamped(-kTwoBeta * (g + kKappa * g * g * g)))); }
    static float deriv(float g) {
        const float g2 = g * g, e = exp_clamped(-kTwoBeta * (g + kKappa * g2 * g)), s = 1.0f / (1.0f + e);
        return s + g * ((e * s) * s) * (kTwoBeta * (1.0f + 3.0f * kKappa * g2));
    }
};

template <class S, class Gate>
void glu_forward(S * out, const S * inp, int N, int I) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const S * gate = inp + static_cast<size_t>(i) * 2 * I;
        const S * up = gate + I;
        S * o = out + static_cast<size_t>(i) * I;
#pragma omp simd
        for (int c = 0; c < I; ++c) o[c] = from_f32<S>(Gate::act(to_f32(gate[c])) * to_f32(up[c]));
    }
}

template <class S, class Gate>
void glu_backward(S * dinp, const S * dout, const S * inp, int N, int I) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const S * gate = inp + static_cast<size_t>(i) * 2 * I;
        const S * up = gate + I;
        const S * d = dout + static_cast<size_t>(i) * I;
        S * dgate = dinp + static_cast<size_t>(i) * 2 * I;
        S * dup = dgate + I;
#pragma omp simd
        for (int c = 0; c < I; ++c) {
            const float g = to_f32(gate[c]), dy = to_f32(d[c]);
            dgate[c] = from_f32<S>(dy * to_f32(up[c]) * Gate::deriv(g));
            dup[c] = from_f32<S>(dy * Gate::act(g));
        }
    }
}
}  // namespace

template <class S>
void swiglu_forward(S * out, const S * inp, int N, int I) { glu_forward<S, SiluGate>(out, inp, N, I); }
template <class S>
void swiglu_backward(S * dinp, const S * dout, const S * inp, int N, int I) {
    glu_backward<S, SiluGate>(dinp, dout, inp, N, I);
}
template <class S>
void geglu_forward(S * out, const S * inp, int N, int I) { glu_forward<S, GeluTanhGate>(out, inp, N, I); }
template <class S>
void geglu_backward(S * dinp, const S * dout, const S * inp, int N, int I) {
    glu_backward<S, GeluTanhGate>(dinp, dout, inp, N, I);
}

// ---------------------------------------------------------------------------------------------
// Grouped-query attention: repeat K/V heads to the NH-head layout the attention kernels read.

template <class S>
void repeat_kv_forward(S * full, const S * qkv, int N, int NH, int KVH, int hd) {
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && hd > 0);
    const int G = NH / KVH;
    const size_t qw = static_cast<size_t>(NH) * hd, kvw = static_cast<size_t>(KVH) * hd;
    const size_t in_w = qw + 2 * kvw, out_w = 3 * qw;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const S * src = qkv + static_cast<size_t>(i) * in_w;
        S * dst = full + static_cast<size_t>(i) * out_w;
        std::copy(src, src + qw, dst);
        for (int part = 1; part <= 2; ++part) {  // k, then v
            const S * s_part = src + qw + static_cast<size_t>(part - 1) * kvw;
            S * d_part = dst + static_cast<size_t>(part) * qw;
            for (int h = 0; h < NH; ++h) {
                const S * head = s_part + static_cast<size_t>(h / G) * hd;
                std::copy(head, head + hd, d_part + static_cast<size_t>(h) * hd);
            }
        }
    }
}

template <class S>
void repeat_kv_backward(S * dqkv, const S * dfull, int N, int NH, int KVH, int hd) {
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && hd > 0);
    const int G = NH / KVH;
    const size_t qw = static_cast<size_t>(NH) * hd, kvw = static_cast<size_t>(KVH) * hd;
    const size_t out_w = qw + 2 * kvw, in_w = 3 * qw;
#pragma omp parallel
    {
        std::vector<float> acc(static_cast<size_t>(hd));
#pragma omp for schedule(static)
        for (int i = 0; i < N; ++i) {
            const S * src = dfull + static_cast<size_t>(i) * in_w;
            S * dst = dqkv + static_cast<size_t>(i) * out_w;
            std::copy(src, src + qw, dst);
            for (int part = 1; part <= 2; ++part) {  // k, then v
                const S * s_part = src + static_cast<size_t>(part) * qw;
                S * d_part = dst + qw + static_cast<size_t>(part - 1) * kvw;
                for (int j = 0; j < KVH; ++j) {
                    float * a = acc.data();
                    std::fill(acc.begin(), acc.end(), 0.0f);
                    for (int g = 0; g < G; ++g) {
                        const S * head = s_part + (static_cast<size_t>(j) * G + g) * hd;
#pragma omp simd
                        for (int c = 0; c < hd; ++c) a[c] += to_f32(head[c]);
                    }
                    S * out = d_part + static_cast<size_t>(j) * hd;
#pragma omp simd
                    for (int c = 0; c < hd; ++c) out[c] = from_f32<S>(a[c]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Qwen3's q and k norms: RMSNorm over each head row (rmsnorm_forward's formulas, C = hd).

template <class S>
void qk_norm_forward(S * qkv, S * raw, float * rstd, const S * wq, const S * wk, int N, int NH, int KVH, int hd,
                     float eps) {
    const int H = NH + KVH;
    const size_t width = size_t(NH + 2 * KVH) * hd;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(N) * H; ++i) {
        const int64_t n = i / H;
        const int h = int(i % H);
        S * x = qkv + size_t(n) * width + size_t(h) * hd;
        S * keep = raw + size_t(i) * hd;
        const S * w = h < NH ? wq : wk;
        float ss = 0.0f;
        for (int c = 0; c < hd; ++c) {
            const float v = to_f32(x[c]);
            ss += v * v;
            keep[c] = x[c];
        }
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
        for (int c = 0; c < hd; ++c) x[c] = from_f32<S>(to_f32(keep[c]) * r * to_f32(w[c]));
        rstd[i] = r;
    }
}

template <class G, class S>
void qk_norm_backward(S * dqkv, G * dwq, G * dwk, const S * raw, const S * wq, const S * wk, const float * rstd, int N,
                      int NH, int KVH, int hd) {
    const int H = NH + KVH;
    const size_t width = size_t(NH + 2 * KVH) * hd;
    // The gains' gradients first (they read d(normed), which the rows then overwrite): sum over
    // rows of dy * x * rstd, per (norm, column block), rows in order.
    if (dwq) {
        const int nblk = (hd + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
        for (int job = 0; job < 2 * nblk; ++job) {
            const bool k = job >= nblk;
            const int c0 = (job % nblk) * kColBlock, nc = std::min(kColBlock, hd - c0);
            const int h0 = k ? NH : 0, h1 = k ? H : NH;
            float dw[kColBlock] = {};
            for (int64_t n = 0; n < N; ++n)
                for (int h = h0; h < h1; ++h) {
                    const int64_t i = n * H + h;
                    const S * g = dqkv + size_t(n) * width + size_t(h) * hd + c0;
                    const S * x = raw + size_t(i) * hd + c0;
                    const float r = rstd[i];
                    for (int c = 0; c < nc; ++c) dw[c] += to_f32(g[c]) * (to_f32(x[c]) * r);
                }
            G * out = (k ? dwk : dwq) + c0;
            for (int c = 0; c < nc; ++c) add_to(out[c], dw[c]);
        }
    }
    const float inv_c = 1.0f / static_cast<float>(hd);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(N) * H; ++i) {
        const int64_t n = i / H;
        const int h = int(i % H);
        S * g = dqkv + size_t(n) * width + size_t(h) * hd;
        const S * x = raw + size_t(i) * hd;
        const S * w = h < NH ? wq : wk;
        const float r = rstd[i];
        float sum_dnn = 0.0f;
        for (int c = 0; c < hd; ++c) sum_dnn += to_f32(w[c]) * to_f32(g[c]) * (to_f32(x[c]) * r);
        const float mean_dnn = sum_dnn * inv_c;
        for (int c = 0; c < hd; ++c) {
            const float nv = to_f32(x[c]) * r;
            const float dn = to_f32(w[c]) * to_f32(g[c]);
            g[c] = from_f32<S>(r * (dn - nv * mean_dnn));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Instantiations: S in {float, bf16_t, f16_t}; the RMSNorm weight gradient float or S.

#define MF_INST(S)                                                                                        \
    template void rmsnorm_forward<S>(S *, float *, const S *, const S *, int, int, float);                \
    template void rmsnorm_backward<float, S>(S *, float *, const S *, const S *, const S *, const float *, \
                                             int, int);                                                   \
    template void qk_norm_forward<S>(S *, S *, float *, const S *, const S *, int, int, int, int, float); \
    template void qk_norm_backward<float, S>(S *, float *, float *, const S *, const S *, const S *,      \
                                             const float *, int, int, int, int);                          \
    template void rope_forward<S>(S *, int, int, int, int, int, const Rope &, int, const int32_t *);            \
    template void rope_backward<S>(S *, int, int, int, int, int, const Rope &, int, const int32_t *);            \
    template void swiglu_forward<S>(S *, const S *, int, int);                                            \
    template void swiglu_backward<S>(S *, const S *, const S *, int, int);                                \
    template void geglu_forward<S>(S *, const S *, int, int);                                             \
    template void geglu_backward<S>(S *, const S *, const S *, int, int);                                 \
    template void repeat_kv_forward<S>(S *, const S *, int, int, int, int);                               \
    template void repeat_kv_backward<S>(S *, const S *, int, int, int, int);
#define MF_INST_LOWP(S)                                                                                   \
    template void rmsnorm_backward<S, S>(S *, S *, const S *, const S *, const S *, const float *, int, int); \
    template void qk_norm_backward<S, S>(S *, S *, S *, const S *, const S *, const S *, const float *, int, int, \
                                         int, int);

MF_INST(float)
MF_INST(bf16_t)
MF_INST(f16_t)
MF_INST_LOWP(bf16_t)
MF_INST_LOWP(f16_t)
#undef MF_INST
#undef MF_INST_LOWP

}  // namespace memfit::cpu
