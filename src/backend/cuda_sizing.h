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

// cuBLASLt's workspace per gemm (NVIDIA recommends 32 MiB on Hopper); 0 for tiny gemms.
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
