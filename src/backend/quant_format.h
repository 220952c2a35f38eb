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
//   sparse24, 2:4 structured sparsity (NVIDIA's sparse tensor cores' pattern; model/sparsity.h
//       trains it): each group of 4 consecutive inputs of a row keeps its 2 largest |w| (ties: the
//       lower index), in index order, as bf16 (round to nearest even), with their positions
//       (0..3) as two 2-bit fields: first | second << 2, one nibble per group, group 2j in the low
//       nibble of byte j. Packing a 2:4 weight loses only the bf16 rounding.
//       [values: n/2 bf16 (group g's at 2g, 2g+1)][positions: n/8]
//     in must be a multiple of 4 and n of 8 (aborts otherwise).
// In bytes:
//   int8    per output channel absmax: out*in int8 codes + out fp32 scales
//   nf4     4-bit NormalFloat, absmax per block of 64: n/2 code bytes + n/64 fp32 absmaxes
//   nf4_dq  nf4 with the absmaxes quantized again (int8, blocks of 256, one fp32 scale each, plus
//           one fp32 mean): n/2 + n/64 + 4*ceil(n/64/256) + 4
//   sparse24  n bytes of bf16 values + n/8 of positions: 9/16 = 0.5625 of bf16's 2n
#pragma once

#include <cmath>
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
        case QuantFormat::sparse24: return n + n / 8;
    }
    return 0;
}

inline const char * quant_format_name(QuantFormat f) {
    switch (f) {
        case QuantFormat::int8: return "int8";
        case QuantFormat::nf4: return "nf4";
        case QuantFormat::nf4_dq: return "nf4+dq";
        case QuantFormat::sparse24: return "sparse24";
    }
    return "?";
}

// Exact packed sizes in bytes (quant_bytes()'s formula, checked against the layouts).
size_t int8_bytes(int64_t out, int64_t in);
size_t nf4_bytes(int64_t n, bool double_quant);
size_t sparse24_bytes(int64_t out, int64_t in);

// Magnitude pruning's choice within one group of m values x[0], x[stride], .., x[(m-1)*stride]:
// keep[j] for the n largest |x| (ties: the lower index). One rule for the N:M pruner
// (model/sparsity.h) and the sparse24 packer, so packing a pruned weight keeps what pruning kept.
inline void nm_keep(const float * x, size_t stride, int n, int m, bool * keep) {
    for (int j = 0; j < m; ++j) {
        const float a = std::fabs(x[size_t(j) * stride]);
        int beaten = 0;   // others that come first: larger, or as large at a lower index
        for (int k = 0; k < m; ++k) {
            const float b = std::fabs(x[size_t(k) * stride]);
            beaten += b > a || (b == a && k < j);
        }
        keep[j] = beaten < n;
    }
}

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

struct Sparse24Quant {
    int64_t out = 0, in = 0;
    size_t bytes() const { return sparse24_bytes(out, in); }
    void quantize(uint8_t * packed, const float * W) const;
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

// f(Q) with Q the format struct of q: the one dispatch of every backend's host code.
template <class F>
void with_quant(const QuantDesc & q, F && f) {
    switch (q.format) {
        case QuantFormat::int8: f(Int8Quant{q.out, q.in}); return;
        case QuantFormat::nf4: f(Nf4Quant{q.out, q.in, false}); return;
        case QuantFormat::nf4_dq: f(Nf4Quant{q.out, q.in, true}); return;
        case QuantFormat::sparse24: f(Sparse24Quant{q.out, q.in}); return;
    }
    MF_UNREACHABLE();
}

}  // namespace memfit
