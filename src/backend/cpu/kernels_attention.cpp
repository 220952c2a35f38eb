// CPU kernels: causal multi-head attention, forward and backward. Contracts are in kernels.h.
//
// Layout: qkv[b,t,:] = [q | k | v], each C = NH*hs wide, head h at columns h*hs..(h+1)*hs.
// Inner loops run over hs (contiguous) and are vectorised with `omp simd`. Key rows are taken
// four at a time: the four dot products share one pass over the query (four independent
// reductions, whose horizontal sums overlap), and the four axpys into one output row share one
// load/store of it. Keys are visited in a fixed order and each task is computed by one thread,
// so results do not depend on the thread count.
//
// Templated on the storage type S (kernels.h). q, k, v, dout and the saved probabilities are
// converted as they are loaded. For S = float the probabilities, outputs and gradients are
// accumulated in place, as ever; for bf16/f16 they are accumulated in per-thread fp32 buffers
// (forward: one row of T scores and one of hs outputs; backward: dk and dv of one head, T x hs
// each, and one dq row) and rounded once into att, out and dqkv.
#include "backend/cpu/kernels.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/convert.h"

#include "core/error.h"

namespace memfit::cpu {

namespace {
constexpr int kKeyBlock = 4;  // keys per inner step; the code below is written out for 4
}  // namespace

template <class S>
void attention_forward(S * out, S * att, const S * qkv, int B, int T, int C, int NH, const int32_t * doc_start) {
    constexpr bool kF32 = std::is_same_v<S, float>;
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int tasks = B * NH * T;  // one query row of one head each; writes are disjoint

#pragma omp parallel
    {
        // Low precision: this thread's fp32 score row and output row.
        std::vector<float> abuf(kF32 ? 0 : static_cast<size_t>(T)), obuf(kF32 ? 0 : static_cast<size_t>(hs));
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int t = task % T;
            const int h = (task / T) % NH;
            const int b = task / (T * NH);
            const S * base = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
            const S * q = base + static_cast<size_t>(t) * C3;
            const S * kbase = base + C;
            const S * vbase = base + 2 * static_cast<size_t>(C);
            S * att_row = att + static_cast<size_t>(task) * T;  // task == (b*NH + h)*T + t
            S * out_row = out + (static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs;
            float * row_all = nullptr;
            float * o = nullptr;
            if constexpr (kF32) {
                row_all = att_row;
                o = out_row;
            } else {
                row_all = abuf.data();
                o = obuf.data();
            }
            // Keys lo..t (causal, within the document): the row and the keys from lo on.
            const int lo = doc_start ? doc_start[static_cast<size_t>(b) * T + t] : 0;
            for (int t2 = 0; t2 < lo; ++t2) row_all[t2] = 0.0f;
            float * arow = row_all + lo;
            kbase += static_cast<size_t>(lo) * C3;
            vbase += static_cast<size_t>(lo) * C3;
            const int nk = t + 1 - lo;
            const int nk4 = nk - nk % kKeyBlock;

            // Scaled scores q . k[t2].
            for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
                const S * k0 = kbase + static_cast<size_t>(t2) * C3;
                const S * k1 = k0 + C3;
                const S * k2 = k1 + C3;
                const S * k3 = k2 + C3;
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
                for (int i = 0; i < hs; ++i) {
                    const float qi = to_f32(q[i]);
                    d0 += qi * to_f32(k0[i]);
                    d1 += qi * to_f32(k1[i]);
                    d2 += qi * to_f32(k2[i]);
                    d3 += qi * to_f32(k3[i]);
                }
                arow[t2] = d0 * scale;
                arow[t2 + 1] = d1 * scale;
                arow[t2 + 2] = d2 * scale;
                arow[t2 + 3] = d3 * scale;
            }
            for (int t2 = nk4; t2 < nk; ++t2) {
                const S * k = kbase + static_cast<size_t>(t2) * C3;
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int i = 0; i < hs; ++i) d += to_f32(q[i]) * to_f32(k[i]);
                arow[t2] = d * scale;
            }

            // Softmax with the max subtracted; masked tail written as zeros.
            float maxv = arow[0];
#pragma omp simd reduction(max : maxv)
            for (int t2 = 0; t2 < nk; ++t2) maxv = arow[t2] > maxv ? arow[t2] : maxv;
            float sum = 0.0f;
            for (int t2 = 0; t2 < nk; ++t2) {
                const float e = std::exp(arow[t2] - maxv);
                arow[t2] = e;
                sum += e;
            }
            const float inv = 1.0f / sum;
#pragma omp simd
            for (int t2 = 0; t2 < nk; ++t2) arow[t2] *= inv;
            for (int t2 = nk; t2 < T - lo; ++t2) arow[t2] = 0.0f;

            // out = att @ v, as row-wise axpys over hs, four value rows per load/store of out.
#pragma omp simd
            for (int i = 0; i < hs; ++i) o[i] = 0.0f;
            for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
                const S * v0 = vbase + static_cast<size_t>(t2) * C3;
                const S * v1 = v0 + C3;
                const S * v2 = v1 + C3;
                const S * v3 = v2 + C3;
                const float a0 = arow[t2], a1 = arow[t2 + 1], a2 = arow[t2 + 2], a3 = arow[t2 + 3];
#pragma omp simd
                for (int i = 0; i < hs; ++i)
                    o[i] += a0 * to_f32(v0[i]) + a1 * to_f32(v1[i]) + a2 * to_f32(v2[i]) + a3 * to_f32(v3[i]);
            }
            for (int t2 = nk4; t2 < nk; ++t2) {
                const S * v = vbase + static_cast<size_t>(t2) * C3;
                const float a = arow[t2];
#pragma omp simd
                for (int i = 0; i < hs; ++i) o[i] += a * to_f32(v[i]);
            }
            if constexpr (!kF32) {
                from_f32_row(att_row, row_all, static_cast<size_t>(T));
                from_f32_row(out_row, o, static_cast<size_t>(hs));
            }
        }
    }
}

template <class S>
void attention_backward(S * dqkv, float * scratch, const S * dout, const S * qkv, const S * att, int B, int T,
                        int C, int NH, const int32_t * doc_start) {
    constexpr bool kF32 = std::is_same_v<S, float>;
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int tasks = B * NH;  // one (b,h) each: its dq, dk, dv columns are disjoint from others

#pragma omp parallel
    {
        // Low precision: this thread's fp32 dk and dv of one head [T x hs] and dq of one row [hs].
        std::vector<float> acc(kF32 ? 0 : static_cast<size_t>(2 * T + 1) * hs);
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; ++task) {
            const int h = task % NH;
            const int b = task / NH;
            const size_t head_off = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
            const S * base = qkv + head_off;
            const S * kbase_all = base + C;
            const S * vbase_all = base + 2 * static_cast<size_t>(C);
            S * dbase = dqkv + head_off;
            float * buf = scratch + static_cast<size_t>(task) * T;  // datt, then dpreatt, of row t
            // Where the gradients accumulate: dqkv itself for float (row stride 3C), else the fp32
            // buffers (row stride hs; one dq row, rounded into dqkv when the row is done).
            float * dkbase_all = nullptr;
            float * dvbase_all = nullptr;
            float * dqrow = nullptr;
            size_t ld = 0;
            if constexpr (kF32) {
                dkbase_all = dbase + C;
                dvbase_all = dbase + 2 * static_cast<size_t>(C);
                ld = C3;
            } else {
                dkbase_all = acc.data();
                dvbase_all = dkbase_all + static_cast<size_t>(T) * hs;
                dqrow = dvbase_all + static_cast<size_t>(T) * hs;
                ld = static_cast<size_t>(hs);
            }

            // Zero this head's q, k, v gradient columns in every row of batch element b.
            for (int t = 0; t < T; ++t) {
                if constexpr (kF32) {
                    float * d = dbase + static_cast<size_t>(t) * C3;
                    for (int part = 0; part < 3; ++part) {
                        float * dp = d + static_cast<size_t>(part) * C;
#pragma omp simd
                        for (int i = 0; i < hs; ++i) dp[i] = 0.0f;
                    }
                } else {
                    float * dk = dkbase_all + static_cast<size_t>(t) * ld;
                    float * dv = dvbase_all + static_cast<size_t>(t) * ld;
#pragma omp simd
                    for (int i = 0; i < hs; ++i) dk[i] = dv[i] = 0.0f;
                }
            }

            for (int t = 0; t < T; ++t) {
                // Keys lo..t: the probabilities, keys, values and their gradients from lo on.
                const int lo = doc_start ? doc_start[static_cast<size_t>(b) * T + t] : 0;
                const S * arow = att + (static_cast<size_t>(task) * T + t) * T + lo;
                const S * kbase = kbase_all + static_cast<size_t>(lo) * C3;
                const S * vbase = vbase_all + static_cast<size_t>(lo) * C3;
                float * dkbase = dkbase_all + static_cast<size_t>(lo) * ld;
                float * dvbase = dvbase_all + static_cast<size_t>(lo) * ld;
                const S * go = dout + (static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs;
                const S * q = base + static_cast<size_t>(t) * C3;
                float * dq = nullptr;
                if constexpr (kF32) {
                    dq = dbase + static_cast<size_t>(t) * C3;
                } else {
                    dq = dqrow;
#pragma omp simd
                    for (int i = 0; i < hs; ++i) dq[i] = 0.0f;
                }
                const int nk = t + 1 - lo;
                const int nk4 = nk - nk % kKeyBlock;

                // datt[t2] = dout_t . v[t2];  dv[t2] += att[t,t2] * dout_t
                for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
                    const size_t off = static_cast<size_t>(t2) * C3;
                    const S * v0 = vbase + off;
                    const S * v1 = v0 + C3;
                    const S * v2 = v1 + C3;
                    const S * v3 = v2 + C3;
                    float * dv0 = dvbase + static_cast<size_t>(t2) * ld;
                    float * dv1 = dv0 + ld;
                    float * dv2 = dv1 + ld;
                    float * dv3 = dv2 + ld;
                    const float a0 = to_f32(arow[t2]), a1 = to_f32(arow[t2 + 1]), a2 = to_f32(arow[t2 + 2]),
                                a3 = to_f32(arow[t2 + 3]);
                    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
                    for (int i = 0; i < hs; ++i) {
                        const float g = to_f32(go[i]);
                        d0 += g * to_f32(v0[i]);
                        d1 += g * to_f32(v1[i]);
                        d2 += g * to_f32(v2[i]);
                        d3 += g * to_f32(v3[i]);
                        dv0[i] += a0 * g;
                        dv1[i] += a1 * g;
                        dv2[i] += a2 * g;
                        dv3[i] += a3 * g;
                    }
                    buf[t2] = d0;
                    buf[t2 + 1] = d1;
                    buf[t2 + 2] = d2;
                    buf[t2 + 3] = d3;
                }
                for (int t2 = nk4; t2 < nk; ++t2) {
                    const S * v = vbase + static_cast<size_t>(t2) * C3;
                    float * dv = dvbase + static_cast<size_t>(t2) * ld;
                    const float a = to_f32(arow[t2]);
                    float d = 0.0f;
#pragma omp simd reduction(+ : d)
                    for (int i = 0; i < hs; ++i) {
                        d += to_f32(go[i]) * to_f32(v[i]);
                        dv[i] += a * to_f32(go[i]);
                    }
                    buf[t2] = d;
                }

                // Softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j]), with the
                // score scale folded in.
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int t2 = 0; t2 < nk; ++t2) s += to_f32(arow[t2]) * buf[t2];
#pragma omp simd
                for (int t2 = 0; t2 < nk; ++t2) buf[t2] = to_f32(arow[t2]) * (buf[t2] - s) * scale;

                // dq_t += sum_t2 dpre[t2] k[t2];  dk[t2] += dpre[t2] q_t
                for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
                    const size_t off = static_cast<size_t>(t2) * C3;
                    const S * k0 = kbase + off;
                    const S * k1 = k0 + C3;
                    const S * k2 = k1 + C3;
                    const S * k3 = k2 + C3;
                    float * dk0 = dkbase + static_cast<size_t>(t2) * ld;
                    float * dk1 = dk0 + ld;
                    float * dk2 = dk1 + ld;
                    float * dk3 = dk2 + ld;
                    const float g0 = buf[t2], g1 = buf[t2 + 1], g2 = buf[t2 + 2], g3 = buf[t2 + 3];
#pragma omp simd
                    for (int i = 0; i < hs; ++i) {
                        const float qi = to_f32(q[i]);
                        dq[i] += g0 * to_f32(k0[i]) + g1 * to_f32(k1[i]) + g2 * to_f32(k2[i]) + g3 * to_f32(k3[i]);
                        dk0[i] += g0 * qi;
                        dk1[i] += g1 * qi;
                        dk2[i] += g2 * qi;
                        dk3[i] += g3 * qi;
                    }
                }
                for (int t2 = nk4; t2 < nk; ++t2) {
                    const S * k = kbase + static_cast<size_t>(t2) * C3;
                    float * dk = dkbase + static_cast<size_t>(t2) * ld;
                    const float g = buf[t2];
#pragma omp simd
                    for (int i = 0; i < hs; ++i) {
                        dq[i] += g * to_f32(k[i]);
                        dk[i] += g * to_f32(q[i]);
                    }
                }
                if constexpr (!kF32) from_f32_row(dbase + static_cast<size_t>(t) * C3, dq, static_cast<size_t>(hs));
            }
            if constexpr (!kF32) {
                for (int t = 0; t < T; ++t) {
                    S * d = dbase + static_cast<size_t>(t) * C3;
                    from_f32_row(d + C, dkbase_all + static_cast<size_t>(t) * ld, static_cast<size_t>(hs));
                    from_f32_row(d + 2 * static_cast<size_t>(C), dvbase_all + static_cast<size_t>(t) * ld,
                                 static_cast<size_t>(hs));
                }
            }
        }
    }
}

#define MF_INST(S)                                                                                 \
    template void attention_forward<S>(S *, S *, const S *, int, int, int, int, const int32_t *);  \
    template void attention_backward<S>(S *, float *, const S *, const S *, const S *, int, int, int, int, \
                                        const int32_t *);
MF_INST(float)
MF_INST(bf16_t)
MF_INST(f16_t)
#undef MF_INST

}  // namespace memfit::cpu
