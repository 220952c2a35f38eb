// CPU kernels: causal multi-head attention, forward and backward. Contracts are in kernels.h.
//
// Layout: qkv[b,t,:] = [q | k | v], each C = NH*hs wide, head h at columns h*hs..(h+1)*hs.
// Inner loops run over hs (contiguous) and are vectorised with `omp simd`. Key rows are taken
// four at a time: the four dot products share one pass over the query (four independent
// reductions, whose horizontal sums overlap), and the four axpys into one output row share one
// load/store of it. Keys are visited in a fixed order and each task is computed by one thread,
// so results do not depend on the thread count.
#include "backend/cpu/kernels.h"

#include <cmath>
#include <cstddef>
#include <limits>

#include "core/error.h"

namespace memfit::cpu {

namespace {
constexpr int kKeyBlock = 4;  // keys per inner step; the code below is written out for 4
}  // namespace

void attention_forward(float * out, float * att, const float * qkv, int B, int T, int C, int NH) {
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int tasks = B * NH * T;  // one query row of one head each; writes are disjoint

#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; ++task) {
        const int t = task % T;
        const int h = (task / T) % NH;
        const int b = task / (T * NH);
        const float * base = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        const float * q = base + static_cast<size_t>(t) * C3;
        const float * kbase = base + C;
        const float * vbase = base + 2 * static_cast<size_t>(C);
        float * arow = att + static_cast<size_t>(task) * T;  // task == (b*NH + h)*T + t
        const int nk = t + 1;                                  // causal: keys 0..t
        const int nk4 = nk - nk % kKeyBlock;

        // Scaled scores q . k[t2].
        for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
            const float * k0 = kbase + static_cast<size_t>(t2) * C3;
            const float * k1 = k0 + C3;
            const float * k2 = k1 + C3;
            const float * k3 = k2 + C3;
            float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
            for (int i = 0; i < hs; ++i) {
                const float qi = q[i];
                d0 += qi * k0[i];
                d1 += qi * k1[i];
                d2 += qi * k2[i];
                d3 += qi * k3[i];
            }
            arow[t2] = d0 * scale;
            arow[t2 + 1] = d1 * scale;
            arow[t2 + 2] = d2 * scale;
            arow[t2 + 3] = d3 * scale;
        }
        for (int t2 = nk4; t2 < nk; ++t2) {
            const float * k = kbase + static_cast<size_t>(t2) * C3;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < hs; ++i) d += q[i] * k[i];
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
        for (int t2 = nk; t2 < T; ++t2) arow[t2] = 0.0f;

        // out = att @ v, as row-wise axpys over hs, four value rows per load/store of out.
        float * o = out + (static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs;
#pragma omp simd
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
            const float * v0 = vbase + static_cast<size_t>(t2) * C3;
            const float * v1 = v0 + C3;
            const float * v2 = v1 + C3;
            const float * v3 = v2 + C3;
            const float a0 = arow[t2], a1 = arow[t2 + 1], a2 = arow[t2 + 2], a3 = arow[t2 + 3];
#pragma omp simd
            for (int i = 0; i < hs; ++i) o[i] += a0 * v0[i] + a1 * v1[i] + a2 * v2[i] + a3 * v3[i];
        }
        for (int t2 = nk4; t2 < nk; ++t2) {
            const float * v = vbase + static_cast<size_t>(t2) * C3;
            const float a = arow[t2];
#pragma omp simd
            for (int i = 0; i < hs; ++i) o[i] += a * v[i];
        }
    }
}

void attention_backward(float * dqkv, float * scratch, const float * dout, const float * qkv,
                        const float * att, int B, int T, int C, int NH) {
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int tasks = B * NH;  // one (b,h) each: its dq, dk, dv columns are disjoint from others

#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; ++task) {
        const int h = task % NH;
        const int b = task / NH;
        const size_t head_off = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        const float * base = qkv + head_off;
        const float * kbase = base + C;
        const float * vbase = base + 2 * static_cast<size_t>(C);
        float * dbase = dqkv + head_off;
        float * dkbase = dbase + C;
        float * dvbase = dbase + 2 * static_cast<size_t>(C);
        float * buf = scratch + static_cast<size_t>(task) * T;  // datt, then dpreatt, of row t

        // Zero this head's q, k, v gradient columns in every row of batch element b.
        for (int t = 0; t < T; ++t) {
            float * d = dbase + static_cast<size_t>(t) * C3;
            for (int part = 0; part < 3; ++part) {
                float * dp = d + static_cast<size_t>(part) * C;
#pragma omp simd
                for (int i = 0; i < hs; ++i) dp[i] = 0.0f;
            }
        }

        for (int t = 0; t < T; ++t) {
            const float * arow = att + (static_cast<size_t>(task) * T + t) * T;
            const float * go = dout + (static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs;
            const float * q = base + static_cast<size_t>(t) * C3;
            float * dq = dbase + static_cast<size_t>(t) * C3;
            const int nk = t + 1;
            const int nk4 = nk - nk % kKeyBlock;

            // datt[t2] = dout_t . v[t2];  dv[t2] += att[t,t2] * dout_t
            for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
                const size_t off = static_cast<size_t>(t2) * C3;
                const float * v0 = vbase + off;
                const float * v1 = v0 + C3;
                const float * v2 = v1 + C3;
                const float * v3 = v2 + C3;
                float * dv0 = dvbase + off;
                float * dv1 = dv0 + C3;
                float * dv2 = dv1 + C3;
                float * dv3 = dv2 + C3;
                const float a0 = arow[t2], a1 = arow[t2 + 1], a2 = arow[t2 + 2], a3 = arow[t2 + 3];
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
                for (int i = 0; i < hs; ++i) {
                    const float g = go[i];
                    d0 += g * v0[i];
                    d1 += g * v1[i];
                    d2 += g * v2[i];
                    d3 += g * v3[i];
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
                const size_t off = static_cast<size_t>(t2) * C3;
                const float * v = vbase + off;
                float * dv = dvbase + off;
                const float a = arow[t2];
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int i = 0; i < hs; ++i) {
                    d += go[i] * v[i];
                    dv[i] += a * go[i];
                }
                buf[t2] = d;
            }

            // Softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j]), with the
            // score scale folded in.
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int t2 = 0; t2 < nk; ++t2) s += arow[t2] * buf[t2];
#pragma omp simd
            for (int t2 = 0; t2 < nk; ++t2) buf[t2] = arow[t2] * (buf[t2] - s) * scale;

            // dq_t += sum_t2 dpre[t2] k[t2];  dk[t2] += dpre[t2] q_t
            for (int t2 = 0; t2 < nk4; t2 += kKeyBlock) {
                const size_t off = static_cast<size_t>(t2) * C3;
                const float * k0 = kbase + off;
                const float * k1 = k0 + C3;
                const float * k2 = k1 + C3;
                const float * k3 = k2 + C3;
                float * dk0 = dkbase + off;
                float * dk1 = dk0 + C3;
                float * dk2 = dk1 + C3;
                float * dk3 = dk2 + C3;
                const float g0 = buf[t2], g1 = buf[t2 + 1], g2 = buf[t2 + 2], g3 = buf[t2 + 3];
#pragma omp simd
                for (int i = 0; i < hs; ++i) {
                    const float qi = q[i];
                    dq[i] += g0 * k0[i] + g1 * k1[i] + g2 * k2[i] + g3 * k3[i];
                    dk0[i] += g0 * qi;
                    dk1[i] += g1 * qi;
                    dk2[i] += g2 * qi;
                    dk3[i] += g3 * qi;
                }
            }
            for (int t2 = nk4; t2 < nk; ++t2) {
                const size_t off = static_cast<size_t>(t2) * C3;
                const float * k = kbase + off;
                float * dk = dkbase + off;
                const float g = buf[t2];
#pragma omp simd
                for (int i = 0; i < hs; ++i) {
                    dq[i] += g * k[i];
                    dk[i] += g * q[i];
                }
            }
        }
    }
}

}  // namespace memfit::cpu
