// CPU kernels: encoder, layernorm, GELU, residual, bias gradient, sum of squares, AdamW.
// Contracts are in kernels.h. Every parallel loop uses a static schedule, and every reduction
// has a fixed order that does not depend on how iterations are split among threads: reductions
// over rows (parameter gradients) are parallelised over blocks of output columns, each block
// summing its rows in order.
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/error.h"

namespace memfit::cpu {

namespace {

// Output columns per task for reductions over rows: 32 floats = two cache lines per row.
constexpr int kColBlock = 32;

int col_blocks(int cols) { return (cols + kColBlock - 1) / kColBlock; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Encoder

void encoder_forward(float * out, const int32_t * tokens, const float * wte, const float * wpe,
                     int B, int T, int C) {
    const int rows = B * T;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) {
        const int t = r % T;
        const int32_t tok = tokens[r];
        MF_ASSERT(tok >= 0);
        float * o = out + static_cast<size_t>(r) * C;
        const float * e = wte + static_cast<size_t>(tok) * C;
        const float * p = wpe + static_cast<size_t>(t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
}

void encoder_backward(float * dwte, float * dwpe, const float * dout, const int32_t * tokens,
                      int B, int T, int C) {
    // Tokens repeat, so rows of dwte collide: parallelise over column blocks instead; each block
    // visits the (b,t) rows in order, which also fixes the summation order.
    const int nblk = col_blocks(C);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, C - c0);
        for (int b = 0; b < B; ++b) {
            for (int t = 0; t < T; ++t) {
                const size_t r = static_cast<size_t>(b) * T + t;
                const int32_t tok = tokens[r];
                MF_ASSERT(tok >= 0);
                const float * d = dout + r * C + c0;
                float * ge = dwte + static_cast<size_t>(tok) * C + c0;
                float * gp = dwpe + static_cast<size_t>(t) * C + c0;
#pragma omp simd
                for (int c = 0; c < nc; ++c) {
                    ge[c] += d[c];
                    gp[c] += d[c];
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

void layernorm_forward(float * out, float * mean, float * rstd, const float * inp,
                       const float * weight, const float * bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const float * x = inp + static_cast<size_t>(i) * C;
        float * o = out + static_cast<size_t>(i) * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; ++c) s += x[c];
        const float m = s / static_cast<float>(C);
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; ++c) {
            const float d = x[c] - m;
            v += d * d;
        }
        v /= static_cast<float>(C);
        const float r = 1.0f / std::sqrt(v + eps);
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = r;
    }
}

void layernorm_backward(float * dinp, float * dweight, float * dbias, const float * dout,
                        const float * inp, const float * weight, const float * mean,
                        const float * rstd, int N, int C) {
    const float inv_c = 1.0f / static_cast<float>(C);
    // dinp: independent rows.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const size_t off = static_cast<size_t>(i) * C;
        const float * x = inp + off;
        const float * g = dout + off;
        float * dx = dinp + off;
        const float m = mean[i];
        const float r = rstd[i];
        float sum_dn = 0.0f;
        float sum_dnn = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dnn)
        for (int c = 0; c < C; ++c) {
            const float n = (x[c] - m) * r;
            const float dn = weight[c] * g[c];
            sum_dn += dn;
            sum_dnn += dn * n;
        }
        const float mean_dn = sum_dn * inv_c;
        const float mean_dnn = sum_dnn * inv_c;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
            const float n = (x[c] - m) * r;
            const float dn = weight[c] * g[c];
            dx[c] += r * (dn - mean_dn - n * mean_dnn);
        }
    }
    // dweight, dbias: reductions over rows, parallel over column blocks.
    const int nblk = col_blocks(C);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, C - c0);
        float dw[kColBlock] = {};
        float db[kColBlock] = {};
        for (int i = 0; i < N; ++i) {
            const size_t off = static_cast<size_t>(i) * C + c0;
            const float * x = inp + off;
            const float * g = dout + off;
            const float m = mean[i];
            const float r = rstd[i];
#pragma omp simd
            for (int c = 0; c < nc; ++c) {
                dw[c] += g[c] * ((x[c] - m) * r);
                db[c] += g[c];
            }
        }
        for (int c = 0; c < nc; ++c) {
            dweight[c0 + c] += dw[c];
            dbias[c0 + c] += db[c];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation ("gelu_new"): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
//
// Evaluated through the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)), which is
// the same function without the cancellation in 1 + tanh(u) for negative x, and which needs only
// exp. glibc's tanhf/expf do not vectorise (we do not build with -ffast-math), and a scalar tanhf
// made GELU about 15x slower than this, so exp is computed inline (exp_clamped below).
// Derivative: s + x s (1 - s) 2u', with s = sigmoid(2u), s (1 - s) = e s^2, e = exp(-2u).
// exp_clamped floors e at 1.6e-38, so for |x| beyond ~1e10 the derivative on the right is not
// exactly 1 (activations never come near that).

namespace {

constexpr float kGeluTwoBeta = 1.5957691216057308f;  // 2 sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

// exp(y) with |y| clamped to 87 (so the result lies in [1.6e-38, 6.1e37]); max relative error
// about 1.5 ulp. Cody-Waite range reduction, Cephes expf polynomial, 2^n built in the exponent
// bits. Written without branches or FP compares (the clamp is an integer min on the bit pattern
// of |y|), so that GCC if-converts and vectorises it inside `omp simd` loops.
inline float exp_clamped(float y) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f;
    constexpr float kLn2Lo = -2.12194440e-4f;
    constexpr float kRound = 12582912.0f;      // 1.5 * 2^23: adding it rounds to an integer
    constexpr int32_t kMaxBits = 0x42ae0000;   // bit pattern of 87.0f
    const int32_t mag = std::bit_cast<int32_t>(std::fabs(y));
    const float yc = std::copysign(std::bit_cast<float>(std::min(mag, kMaxBits)), y);
    const float n = (yc * kLog2e + kRound) - kRound;  // round(yc / ln2), in [-126, 126]
    const float r = (yc - n * kLn2Hi) - n * kLn2Lo;   // |r| <= ln2 / 2
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace

void gelu_forward(float * out, const float * inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float x = inp[i];
        const float two_u = kGeluTwoBeta * (x + kGeluKappa * x * x * x);
        const float s = 1.0f / (1.0f + exp_clamped(-two_u));
        out[i] = x * s;
    }
}

void gelu_backward(float * dinp, const float * dout, const float * inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float x = inp[i];
        const float x2 = x * x;
        const float two_u = kGeluTwoBeta * (x + kGeluKappa * x2 * x);
        const float two_du = kGeluTwoBeta * (1.0f + 3.0f * kGeluKappa * x2);
        const float e = exp_clamped(-two_u);
        const float s = 1.0f / (1.0f + e);
        dinp[i] = dout[i] * (s + x * ((e * s) * s) * two_du);
    }
}

// ---------------------------------------------------------------------------------------------
// Residual, bias gradient, sum of squares

void residual_forward(float * out, const float * a, const float * b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void bias_backward(float * dbias, const float * dout, int N, int OC) {
    const int nblk = col_blocks(OC);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, OC - c0);
        float acc[kColBlock] = {};
        for (int i = 0; i < N; ++i) {
            const float * g = dout + static_cast<size_t>(i) * OC + c0;
#pragma omp simd
            for (int c = 0; c < nc; ++c) acc[c] += g[c];
        }
        for (int c = 0; c < nc; ++c) dbias[c0 + c] += acc[c];
    }
}

double sum_squares(const float * x, size_t n) {
    // Fixed-size chunks summed in parallel, then combined in chunk order: the result does not
    // depend on the thread count.
    constexpr size_t kChunk = size_t{1} << 16;
    const size_t nchunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(nchunks, 0.0);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; ++k) {
        const size_t lo = k * kChunk;
        const size_t hi = std::min(n, lo + kChunk);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; ++i) {
            const double d = static_cast<double>(x[i]);
            s += d * d;
        }
        partial[k] = s;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

// ---------------------------------------------------------------------------------------------
// AdamW, as torch.optim.AdamW (non-amsgrad, non-fused):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)

void adamw_update(float * param, const float * grad, float * m, float * v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
    MF_ASSERT(t >= 1);
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
    const float inv_bc1 = static_cast<float>(1.0 / bc1);
    const float inv_bc2 = static_cast<float>(1.0 / bc2);
    const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
    const float one_m_b1 = 1.0f - beta1;
    const float one_m_b2 = 1.0f - beta2;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + one_m_b1 * g;
        const float vi = beta2 * v[i] + one_m_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi * inv_bc1;
        const float vhat = vi * inv_bc2;
        param[i] = param[i] * decay - lr * mhat / (std::sqrt(vhat) + eps);
    }
}

}  // namespace memfit::cpu
