// Gemms on the CUDA backend: cuBLASLt (fp32 compute, no TF32) with the bias epilogue, and a
// plain kernel for dtype mixes cuBLASLt does not take (A and B of different dtypes).
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
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// C (+)= op(A) op(B) (+ bias) by one thread per element of C, any float dtypes: the fallback.
void gemm_simple(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, int64_t ldc = 0);

}  // namespace memfit::cuda
