// Element types and conversions. Kernels compute in fp32; bf16/f16 are storage types, converted
// as they are loaded and rounded to nearest even as they are stored (conversions here).
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


// ---------------------------------------------------------------------------------------------
// Storage types for kernels templated on the element type: distinct wrappers of the 16 bits, so
// that templates tell bf16 from f16 (float is used as itself).
struct bf16_t { uint16_t bits; };
struct f16_t  { uint16_t bits; };

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16_t>() { return DType::f16; }

// to_f32(x) and from_f32<T>(f): the load and the rounding store of every kernel. Written with
// integer masks instead of branches (and without _Float16, whose conversions GCC 12 does not
// vectorise), so that loops calling them vectorise under `omp simd`. Same values as
// f32_to_bf16 above and IEEE conversions (f32_to_f16 / f16_to_f32 below are these); NaN stays NaN (f16 stores give the canonical
// quiet NaN 0x7e00). float instantiations are the identity.
inline float to_f32(float x) { return x; }
inline float to_f32(bf16_t x) { return bits_f32(uint32_t(x.bits) << 16); }
inline float to_f32(f16_t x) {
    const uint32_t em = x.bits & 0x7fffu;                    // exponent and mantissa
    const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
    const uint32_t normal = (em << 13) + (112u << 23);       // rebias the exponent 15 -> 127
    const uint32_t infnan = normal + (112u << 23);           // exponent 31 -> 255, payload kept
    // zero and subnormals (em < 0x400): m * 2^-24 = (1 + m/1024) 2^-14 - 2^-14, exact.
    const uint32_t sub = f32_bits(bits_f32((em << 13) + (113u << 23)) - bits_f32(113u << 23));
    const uint32_t is_infnan = 0u - uint32_t(em >= 0x7c00u), is_sub = 0u - uint32_t(em < 0x400u);
    const uint32_t r = (is_infnan & infnan) | (is_sub & sub) | (~(is_infnan | is_sub) & normal);
    return bits_f32(r | sign);
}

template <class T> T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline bf16_t from_f32<bf16_t>(float f) {
    const uint32_t u = f32_bits(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    return bf16_t{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}
template <> inline f16_t from_f32<f16_t>(float f) {
    const uint32_t u0 = f32_bits(f);
    const uint32_t sign = (u0 >> 16) & 0x8000u;
    const uint32_t u = u0 & 0x7fffffffu;
    // |f| >= 65536 (the rounding boundary is handled by the normal path's carry): inf, or NaN.
    const uint32_t big = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    // |f| < 2^-14: the result is subnormal or zero; adding 0.5 lets the FPU round the bits.
    constexpr uint32_t kHalf = 126u << 23;
    const uint32_t sub = f32_bits(bits_f32(u) + bits_f32(kHalf)) - kHalf;
    // normal: rebias 127 -> 15 and round the 13 dropped bits to nearest even.
    const uint32_t normal = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
    const uint32_t is_big = 0u - uint32_t(u >= (143u << 23)), is_sub = 0u - uint32_t(u < (113u << 23));
    const uint32_t r = (is_big & big) | (is_sub & sub) | (~(is_big | is_sub) & normal);
    return f16_t{uint16_t(r | sign)};
}

// IEEE half precision on raw bits (round to nearest even; NaN stores as 0x7e00).
inline uint16_t f32_to_f16(float f) { return from_f32<f16_t>(f).bits; }
inline float f16_to_f32(uint16_t u) { return to_f32(f16_t{u}); }

// n fp32 values stored as `t` (f32, bf16 or f16) into dst (n * dtype_size(t) bytes), rounded
// as the kernels round; and back, widened exactly. Host memory: what a device upload is made of.
inline void narrow_f32(void * dst, const float * src, size_t n, DType t) {
    if (t == DType::f32) {
        std::memcpy(dst, src, n * 4);
        return;
    }
    auto * d = static_cast<uint16_t *>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = t == DType::bf16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}
inline void widen_to_f32(float * dst, const void * src, size_t n, DType t) {
    if (t == DType::f32) {
        std::memcpy(dst, src, n * 4);
        return;
    }
    const auto * s = static_cast<const uint16_t *>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = t == DType::bf16 ? bf16_to_f32(s[i]) : f16_to_f32(s[i]);
}

}  // namespace memfit
