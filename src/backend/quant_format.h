// Exact byte counts of the packed frozen-weight formats (QuantFormat, backend/backend.h), shared
// by the engine, which declares the packed buffers, and the planner, which predicts them. The
// layouts themselves are the CPU backend's (backend/cpu/quant.h):
//   int8    per output channel absmax: out*in int8 codes + out fp32 scales
//   nf4     4-bit NormalFloat, absmax per block of 64: n/2 code bytes + n/64 fp32 absmaxes
//   nf4_dq  nf4 with the absmaxes quantized again (int8, blocks of 256, one fp32 scale each, plus
//           one fp32 mean): n/2 + n/64 + 4*ceil(n/64/256) + 4
// NF4 needs n = out*in to be a multiple of 64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace memfit {

// Dettmers et al. 2023 (QLoRA), appendix E: the NF4 data type's values, ascending; code = index.
inline constexpr float kNf4Levels[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};
constexpr int64_t kNf4Block = 64;          // elements per absmax block
constexpr int64_t kNf4ScaleBlock = 256;    // absmaxes per second-level block (double quant)

constexpr size_t quant_bytes(const QuantDesc & q) {
    const size_t n = size_t(q.out) * size_t(q.in);
    switch (q.format) {
        case QuantFormat::int8: return n + size_t(q.out) * 4;
        case QuantFormat::nf4: return n / 2 + n / 64 * 4;
        case QuantFormat::nf4_dq: return n / 2 + n / 64 + 4 * ((n / 64 + 255) / 256) + 4;
    }
    return 0;
}

inline const char * quant_format_name(QuantFormat f) {
    switch (f) {
        case QuantFormat::int8: return "int8";
        case QuantFormat::nf4: return "nf4";
        case QuantFormat::nf4_dq: return "nf4+dq";
    }
    return "?";
}

}  // namespace memfit
