// --optimizer adamw-8bit: AdamW's two moments stored as one byte per element, in blocks of
// kMoments8Block elements that never straddle two parameter tensors, each block with an f32
// scale (its largest magnitude). The codes follow power maps that spend most of their 256 levels
// near zero, where most moments are (the role of bitsandbytes' dynamic map, in closed form):
//   m (signed):   code c in [-127, 127] (stored as int8),  m = scale * sign(c) * (|c| / 127)^2
//   v (unsigned): code c in [0, 255],                       v = scale * (c / 255)^4
// A nonzero v never rounds to code 0 (a zero second moment beside a nonzero first one would make
// the step m / eps). Decoding then encoding again gives the same codes and scale (the largest
// element is code +-127 or 255, which decodes to the scale exactly), so the host can hold the
// moments as f32 and a checkpoint resumes bit for bit.
//
// Block size 256: the scales cost 2 x 4 / 256 bytes per parameter (2.03 bytes of moments per
// parameter in all, 0.254x of fp32 AdamW's 8), and a block is small enough that one large
// gradient does not flatten its neighbours' codes (torchao's 8-bit AdamW uses 256 as well).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace memfit {

constexpr size_t kMoments8Block = 256;

constexpr size_t moments8_blocks(size_t n) { return (n + kMoments8Block - 1) / kMoments8Block; }

inline float decode_m8(uint8_t code, float scale) {
    const int c = int(int8_t(code));
    const float r = float(c < 0 ? -c : c) / 127.0f;
    return (c < 0 ? -scale : scale) * r * r;
}
inline uint8_t encode_m8(float m, float scale) {
    if (!(scale > 0)) return 0;
    const float a = std::min(1.0f, std::fabs(m) / scale);
    const int c = int(std::nearbyint(127.0f * std::sqrt(a)));
    return uint8_t(int8_t(m < 0 ? -c : c));
}
inline float decode_v8(uint8_t code, float scale) {
    const float r = float(code) / 255.0f, r2 = r * r;
    return scale * r2 * r2;
}
inline uint8_t encode_v8(float v, float scale) {
    if (!(scale > 0) || !(v > 0)) return 0;
    const float a = std::min(1.0f, v / scale);
    const int c = int(std::nearbyint(255.0f * std::sqrt(std::sqrt(a))));
    return uint8_t(c < 1 ? 1 : c);
}

}  // namespace memfit
