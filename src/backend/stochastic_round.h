// Stochastic rounding to bf16 (--master-weights bf16-sr): AdamW updates bf16 weights in place, with
// no fp32 master copy, and rounds each result up with probability (dropped 16 bits) / 2^16, so
// the rounding is unbiased in expectation and small updates are not lost (Gupta et al. 2015;
// llm.c and torchao do the same). The 16-bit draw is a splitmix64 hash of (seed, element), the
// element counted in the flat parameter buffer: any split of the update into views (ZeRO shards,
// offload units) draws the same numbers, and the CPU and the CUDA kernels (this header is
// compiled into both) round alike, bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MF_HOST_DEVICE __host__ __device__
#else
#define MF_HOST_DEVICE
#endif

namespace memfit {

MF_HOST_DEVICE inline uint32_t sr_draw16(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return uint32_t(z >> 48);
}

// The bf16 bits of f, rounded up with probability (f's low 16 bits) / 2^16 (toward zero in
// magnitude otherwise); inf and NaN as they are (a NaN stays a NaN).
MF_HOST_DEVICE inline uint16_t sr_bf16_bits(float f, uint64_t seed, uint64_t i) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return uint16_t((u >> 16) | ((u & 0x007fffffu) ? 0x0040u : 0u));
    return uint16_t((u + sr_draw16(seed, i)) >> 16);
}

MF_HOST_DEVICE inline float bf16_bits_to_f32(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace memfit
