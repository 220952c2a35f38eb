// The exp kernel shared by the vectorised exp functions (fast_exp below, for flash attention
// and the cross-entropy; GELU's and SiLU's exp_clamped): exp(r) for |r| <= ln2/2 by the Cephes
// expf polynomial, after the caller's Cody-Waite reduction x = n ln2 + r. Each caller keeps its
// own handling of the range ends.
#pragma once

#include <bit>
#include <cstdint>

namespace memfit::cpu {

constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = 0.693359375f;      // ln 2 in two parts (Cody-Waite)
constexpr float kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer

inline float exp_reduced(float r) {
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

// exp(x), for x <= 88 (the largest argument here is a rounding error above 0), with relative
// error < 1e-7. Cephes-style: x = n ln2 + r with |r| <= ln2/2, exp(r) by a polynomial, 2^n put
// in the exponent bits.
// Arguments below -87 (results near FLT_MIN and below, and -inf) give 0: the value computed for
// them is garbage and is masked off with integer operations. Free of branches and of float
// comparisons in selects (which GCC does not if-convert under -ftrapping-math), so that
// `omp simd` loops calling it vectorise.
inline float fast_exp(float x) {
    const float t = x * kExpLog2e + kExpRound;
    const float n = t - kExpRound;
    float r = x - n * kExpLn2Hi;
    r = r - n * kExpLn2Lo;
    const float y = exp_reduced(r);
    // bits(t) = bits(kExpRound) + n; 2^n has exponent field n + 127 (>= 1 for x >= -87).
    const uint32_t pow2n = (std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23;
    const float res = y * std::bit_cast<float>(pow2n);
    const uint32_t keep = 0u - static_cast<uint32_t>(x >= -87.0f);  // all ones, or 0 to flush
    return std::bit_cast<float>(std::bit_cast<uint32_t>(res) & keep);
}

}  // namespace memfit::cpu
