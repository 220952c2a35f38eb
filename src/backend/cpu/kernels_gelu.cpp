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
// Residual

template <class S>
void residual_forward(S * out, const S * a, const S * b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) out[i] = from_f32<S>(to_f32(a[i]) + to_f32(b[i]));
}

#define MF_INST(S)                                                       \
    template void gelu_forward<S>(S *, const S *, size_t);               \
    template void gelu_backward<S>(S *, const S *, const S *, size_t);   \
    template void residual_forward<S>(S *, const S *, const S *, size_t);
MF_INST(float)
MF_INST(bf16_t)
MF_INST(f16_t)
#undef MF_INST

}  // namespace memfit::cpu
