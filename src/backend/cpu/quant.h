// The dequantizing matmuls of QLoRA-style fine-tuning on the CPU: the frozen base weights are
// stored packed (the formats, their sizes and the host quantizer: backend/quant_format.h, shared
// with the CUDA backend), and the matmuls dequantize them tile by tile (tile_rows output rows at
// a time) into an fp32 workspace tile, never materialising the whole dequantized weight.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/dnnl_gemm.h"
#include "backend/quant_format.h"

namespace memfit::cpu {

// Int8Quant, Nf4Quant (the format structs the gemms below take), int8_bytes, nf4_bytes, nf4_code,
// kNf4Levels, kNf4Block and kNf4ScaleBlock: backend/quant_format.h.

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
