// CPU kernels: GELU and the residual add. Contracts are in kernels.h; templated on the storage
// type like kernels_basic.cpp (the float instantiations are the fp32 kernels).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/exp_poly.h"
#include "backend/cpu/kernels.h"

namespace memfit::cpu {

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
    constexpr int32_t kMaxBits = 0x42ae0000;   // bit pattern of 87.0f
    const int32_t mag = std::bit_cast<int32_t>(std::fabs(y));
    const float yc = std::copysign(std::bit_cast<float>(std::min(mag, kMaxBits)), y);
    const float n = (yc * kExpLog2e + kExpRound) - kExpRound;  // round(yc / ln2), in [-126, 126]
    const float r = (yc - n * kExpLn2Hi) - n * kExpLn2Lo;       // |r| <= ln2 / 2
    return exp_reduced(r) * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace

template <class S>
void gelu_forward(S * out, const S * inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float x = to_f32(inp[i]);
        const float two_u = kGeluTwoBeta * (x + kGeluKappa * x * x * x);
        const float s = 1.0f / (1.0f + exp_clamped(-two_u));
        out[i] = from_f32<S>(x * s);
    }
}

template <class S>
void gelu_backward(S * dinp, const S * dout, const S * inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float x = to_f32(inp[i]);
        const float x2 = x * x;
        const float two_u = kGeluTwoBeta * (x + kGeluKappa * x2 * x);
        const float two_du = kGeluTwoBeta * (1.0f + 3.0f * kGeluKappa * x2);
        const float e = exp_clamped(-two_u);
        const float s = 1.0f / (1.0f + e);
        dinp[i] = from_f32<S>(to_f32(dout[i]) * (s + x * ((e * s) * s) * two_du));
    }
}

// ---------------------------------------------------------------------------------------------
// GELU, exact: x Phi(x). Phi(x) = 1 - q for x >= 0 and q for x < 0, q = Phi(-|x|) =
// erfc(z) / 2, z = |x| / sqrt(2), so the small side never comes from a cancellation. erfc is
// the Chebyshev fit of Numerical Recipes (6.2, "erfcc"): erfc(z) = t exp(-z^2 + P(t)), t = 1 /
// (1 + z/2), fractional error below 1.2e-7 for every z >= 0; built on exp_clamped so the loop
// vectorises. Derivative: Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).

namespace {

inline float normal_tail(float x) {   // Phi(-|x|)
    const float z = std::fabs(x) * 0.70710678118654752f;
    const float t = 1.0f / (1.0f + 0.5f * z);
    const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
                    t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
                    t * (-0.82215223f + t * 0.17087277f))))))));
    return 0.5f * t * exp_clamped(p - z * z);
}

inline float normal_cdf(float x) {
    const float q = normal_tail(x);
    return x >= 0.0f ? 1.0f - q : q;
}

}  // namespace

template <class S>
void gelu_erf_forward(S * out, const S * inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float x = to_f32(inp[i]);
        out[i] = from_f32<S>(x * normal_cdf(x));
    }
}

template <class S>
void gelu_erf_backward(S * dinp, const S * dout, const S * inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
        const float x = to_f32(inp[i]);
        const float phi = 0.39894228040143268f * exp_clamped(-0.5f * x * x);
        dinp[i] = from_f32<S>(to_f32(dout[i]) * (normal_cdf(x) + x * phi));
    }
}

// ---------------------------------------------------------------------------------------------
// Residual

template <class S>
void residual_forward(S * out, const S * a, const S * b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) out[i] = from_f32<S>(to_f32(a[i]) + to_f32(b[i]));
}

#define MF_INST(S)                                                       \
    template void gelu_forward<S>(S *, const S *, size_t);               \
    template void gelu_backward<S>(S *, const S *, const S *, size_t);   \
    template void gelu_erf_forward<S>(S *, const S *, size_t);           \
    template void gelu_erf_backward<S>(S *, const S *, const S *, size_t); \
    template void residual_forward<S>(S *, const S *, const S *, size_t);
MF_INST(float)
MF_INST(bf16_t)
MF_INST(f16_t)
#undef MF_INST

}  // namespace memfit::cpu
