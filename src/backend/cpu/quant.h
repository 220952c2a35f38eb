// Frozen-weight quantization for QLoRA-style fine-tuning: the base weights W [out, in] (row =
// output channel, the LLaMA layout) are stored packed in caller-provided buffers of exactly
// *_bytes() bytes, and the matmuls dequantize them tile by tile (tile_rows output rows at a time)
// into an fp32 workspace tile, never materialising the whole dequantized weight.
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
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/dnnl_gemm.h"
#include "backend/quant_format.h"

namespace memfit::cpu {

// kNf4Levels, kNf4Block and kNf4ScaleBlock: backend/quant_format.h (shared with the CUDA backend).

// Exact packed sizes in bytes.
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

// Y[M, out] = X[M, in] · W'^T and dX[M, in] (+)= dY[M, out] · W', W' = the dequantized W, all
// fp32 row-major. W is dequantized tile_rows output rows at a time into the workspace (the
// last tile may be smaller) and each tile multiplied by oneDNN's fp32 matmul: Y's columns of the
// tile are written in place (row stride out); dX accumulates over the tiles (written by the
// first tile unless accumulate). No weight gradient: the base weight is frozen.
// Workspace: [fp32 tile: tile_rows*in floats, rounded up to 64 bytes][oneDNN scratchpad], the
// largest scratchpad of the tile shapes of both directions.
size_t gemm_dequant_workspace(DnnlGemm & gemm, int64_t M, int64_t out, int64_t in, int64_t tile_rows);

template <class Q>
void gemm_dequant_forward(DnnlGemm & gemm, float * Y, const float * X, const Q & q, const uint8_t * packed,
                          int64_t M, int64_t tile_rows, void * workspace);
template <class Q>
void gemm_dequant_backward(DnnlGemm & gemm, float * dX, const float * dY, const Q & q, const uint8_t * packed,
                           int64_t M, int64_t tile_rows, void * workspace, bool accumulate = false);

// The tiling of the CPU backend's quantized gemms over activations (qgemm.cpp,
// Backend::qgemm_fwd/bwd): bf16/f16 activations are processed kQgemmRowChunk rows at a time, and W
// is dequantized qgemm_tile_rows(out, in) output rows per tile (a function of the shape alone).
constexpr int64_t kQgemmRowChunk = 128;
int64_t qgemm_tile_rows(int64_t out, int64_t in);

}  // namespace memfit::cpu
