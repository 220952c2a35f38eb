// The exp kernel shared by the vectorised exp functions (flash attention's fast_exp, GELU's
// exp_clamped): exp(r) for |r| <= ln2/2 by the Cephes expf polynomial, after the caller's
// Cody-Waite reduction x = n ln2 + r. Each caller keeps its own handling of the range ends.
#pragma once

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

}  // namespace memfit::cpu
