// Element types and conversions. Compute kernels in this issue are fp32; bf16/f16 are storage
// types the mixed-precision work builds on (round-to-nearest-even conversions here).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace memfit {

enum class DType : uint8_t { f32, bf16, f16, i32, u16, u8 };

constexpr size_t dtype_size(DType t) {
    switch (t) {
        case DType::f32: case DType::i32: return 4;
        case DType::bf16: case DType::f16: case DType::u16: return 2;
        case DType::u8: return 1;
    }
    return 0;
}

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "f32";  case DType::bf16: return "bf16";
        case DType::f16: return "f16";  case DType::i32: return "i32";
        case DType::u16: return "u16";  case DType::u8: return "u8";
    }
    return "?";
}

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16: the upper 16 bits of an f32, rounded to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// IEEE half precision, via the compiler's _Float16 (x86-64 GCC 12 supports it).
inline uint16_t f32_to_f16(float f) { _Float16 h = (_Float16) f; uint16_t u; std::memcpy(&u, &h, 2); return u; }
inline float f16_to_f32(uint16_t u) { _Float16 h; std::memcpy(&h, &u, 2); return (float) h; }

}  // namespace memfit
