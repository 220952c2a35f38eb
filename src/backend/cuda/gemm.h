// Gemms on the CUDA backend: cuBLASLt (fp32 compute, no TF32) with the bias epilogue; an fp32
// operand beside a 16-bit one rounded to 16 bits block by block (cuda_gemm_narrowing); a plain
// kernel for the other dtype mixes cuBLASLt does not take.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "backend/backend.h"

namespace memfit::cuda {

class Gemm {
public:
    Gemm();
    ~Gemm();
    Gemm(const Gemm &) = delete;
    Gemm & operator=(const Gemm &) = delete;
    // GemmDesc's contract (backend.h), row-major. workspace may be invalid (no split-K). A's rows
    // are d.lda apart when set, C's ldc apart when not 0 (a column slice of a wider matrix).
    void run(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace,
             int64_t ldc = 0);

private:
    // cuda_gemm_narrowing's blocks: the fp32 operand rounded block by block, each block one run().
    void run_narrowed(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor workspace, int64_t ldc);
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// dst[i * ld_dst + j] = src[i * ld_src + j] rounded to `to` (bf16 or f16), for rows x cols.
void narrow_block(cudaStream_t s, void * dst, DType to, int64_t ld_dst, const float * src, int64_t ld_src,
                  int64_t rows, int64_t cols);

// C (+)= op(A) op(B) (+ bias) by one thread per element of C, any float dtypes: the fallback.
void gemm_simple(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, int64_t ldc = 0);

}  // namespace memfit::cuda
