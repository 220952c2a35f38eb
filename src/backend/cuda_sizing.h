// The CUDA backend's scratch sizes as pure functions of the shapes, compiled in every build (no
// CUDA header): the CUDA backend answers its workspace queries with them, and the planner
// records GPU plans with the sizing backend below, so a plan for a GPU is exact for the CUDA
// engine even where memfit was built without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace memfit {

// A gemm whose operands mix fp32 with bf16 or f16 (the LM head's backward: fp32 logit gradients
// against 16-bit weights and inputs) has no cuBLASLt kernel. The fp32 operand is rounded to the
// other's dtype block by block (`block` rows of op(A), or columns of op(B), at a time; the last
// block may be shorter) into the front of the workspace, `ld` elements a row (16-byte aligned), and
// each block is one tensor-core gemm: 16-bit products summed in fp32, as autocast computes it.
struct CudaGemmNarrowing {
    bool    applies = false;
    bool    a_is_f32 = false;   // which operand is rounded: A (blocks of M) or B (blocks of N)
    DType   to = DType::bf16;   // the dtype it is rounded to (the other operand's)
    int64_t block = 0;          // rows of op(A) or columns of op(B) per block
    int64_t ld = 0;             // the rounded block's row stride, in elements
    size_t  bytes = 0;          // the rounded block's bytes (256-aligned): the workspace's front
};
CudaGemmNarrowing cuda_gemm_narrowing(const GemmDesc & d);
// The most bytes a rounded block takes (128 MiB); tests set it small to run several blocks.
int64_t cuda_gemm_narrow_cap();
void set_cuda_gemm_narrow_cap(int64_t bytes);

// cuBLASLt's workspace per gemm (NVIDIA recommends 32 MiB on Hopper), after a narrowed block's
// bytes where cuda_gemm_narrowing applies.
size_t cuda_gemm_workspace(const GemmDesc & d);
// flash_attention_bwd's scratch.
size_t cuda_flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH);
// qgemm's scratch: one tile of cuda_qgemm_tile_rows(q) rows of the dequantized weight W' [out, in]
// in the activations' dtype (the product runs tile by tile, never on the whole W').
size_t cuda_qgemm_workspace(const QuantDesc & q, int64_t M, DType act);
int64_t cuda_qgemm_tile_rows(const QuantDesc & q);
// The flash kernels' head dimensions (kernels_flash.cu instantiates these): 32, 64, 96, 128.
std::string cuda_flash_attention_refusal(int head_dim);

// A backend that answers the workspace queries as CudaBackend does and computes nothing (its ops
// abort): the planner's sizing for GPU hardware.
std::unique_ptr<Backend> make_cuda_sizing_backend();

}  // namespace memfit
