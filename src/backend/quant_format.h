// The packed frozen-weight formats (QuantFormat, backend/backend.h) for QLoRA-style fine-tuning:
// their exact byte counts, shared by the engine, which declares the packed buffers, and the
// planner, which predicts them; and the host code that packs and unpacks them, shared by the CPU
// backend (backend/cpu/quant.h: the dequantizing matmuls) and the CUDA backend (which packs on the
// host and dequantizes on the device, backend/cuda/kernels_quant.cu).
//
// The base weights W [out, in] (row = output channel, the LLaMA layout) are stored packed in
// caller-provided buffers of exactly *_bytes() bytes.
//
// Formats (all multi-byte fields are stored unaligned, read and written through memcpy):
//   int8, per output channel absmax:  [q: out*in int8][scale: out fp32]
//       scale[o] = max|W[o,:]| / 127, q = round(W / scale) clamped to [-127, 127], W' = q * scale.
//   NF4 (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", sec. 3):
//       blocks of 64 consecutive elements of the flattened row-major W, absmax per block; each
//       element gets the code of the nearest of the 16 NormalFloat levels (kNf4Levels) to
//       x / absmax; two codes per byte (element 2j in the low nibble of byte j, 2j+1 in the high).
//       W' = level[code] * absmax.
//     without double quantization: [codes: n/2][absmax: n/64 fp32]
//     with double quantization (the paper's "Double Quantization", simplified to a symmetric
//       int8 absmax quantizer; the paper uses 8-bit floats): the block absmaxes c2 have their
//       mean subtracted and are quantized to int8 in blocks of 256 with one fp32 scale per
//       256-block: s = max|c2 - mean| / 127, q = round((c2 - mean) / s), c2' = q * s + mean.
//       The codes are chosen against the reconstructed c2' (the absmax the dequantizer uses).
//       [codes: n/2][q: n/64 int8][s: ceil(n/64/256) fp32][mean: fp32]
//     n = out*in must be a multiple of 64 (aborts otherwise); rows need not align with blocks.
// In bytes:
//   int8    per output channel absmax: out*in int8 codes + out fp32 scales
//   nf4     4-bit NormalFloat, absmax per block of 64: n/2 code bytes + n/64 fp32 absmaxes
//   nf4_dq  nf4 with the absmaxes quantized again (int8, blocks of 256, one fp32 scale each, plus
//           one fp32 mean): n/2 + n/64 + 4*ceil(n/64/256) + 4
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

// Exact packed sizes in bytes (quant_bytes()'s formula, checked against the layouts).
size_t int8_bytes(int64_t out, int64_t in);
size_t nf4_bytes(int64_t n, bool double_quant);

// The index of the NF4 level nearest to v (v in [-1, 1]; values beyond are clamped).
uint8_t nf4_code(float v);

// A quantized weight format. The struct carries the shape; the packed bytes live in the
// caller's buffer (bytes() long).
struct Int8Quant {
    int64_t out = 0, in = 0;
    size_t bytes() const { return int8_bytes(out, in); }
    void quantize(uint8_t * packed, const float * W) const;
    // dst[nrows, in] = rows row0 .. row0+nrows-1 of the dequantized W.
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

struct Nf4Quant {
    int64_t out = 0, in = 0;
    bool double_quant = false;
    size_t bytes() const { return nf4_bytes(out * in, double_quant); }
    void quantize(uint8_t * packed, const float * W) const;
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

}  // namespace memfit
