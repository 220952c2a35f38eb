// The checked macros for CUDA runtime and cuBLASLt calls (error tier 2, core/error.h; NCCL's,
// MF_NCCL, is in comm/nccl_communicator.cpp, the only file that includes nccl.h).
// A failed vendor call is a broken invariant (a bad argument, a kernel fault) and aborts with
// file, line, the call and the library's message, except running out of device memory, which
// is an expected failure: cudaMalloc goes through cuda_backend.cpp's DeviceAllocator, which throws OutOfMemory.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace memfit::cuda {

[[noreturn]] void fail(const char * file, int line, const char * library, const char * call, int code,
                       const char * message);

}  // namespace memfit::cuda

#define MF_CUDA(...)                                                                                  \
    do {                                                                                              \
        const cudaError_t mf_cuda_e_ = (__VA_ARGS__);                                                 \
        if (mf_cuda_e_ != cudaSuccess)                                                                \
            ::memfit::cuda::fail(__FILE__, __LINE__, "CUDA", #__VA_ARGS__, int(mf_cuda_e_),           \
                                 cudaGetErrorString(mf_cuda_e_));                                     \
    } while (0)

// After a kernel launch: a bad launch configuration shows here, a fault at the next sync.
#define MF_CUDA_LAUNCHED() MF_CUDA(cudaGetLastError())

#define MF_CUBLAS(...)                                                                                \
    do {                                                                                              \
        const cublasStatus_t mf_cublas_s_ = (__VA_ARGS__);                                            \
        if (mf_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            ::memfit::cuda::fail(__FILE__, __LINE__, "cuBLASLt", #__VA_ARGS__, int(mf_cublas_s_),     \
                                 cublasLtGetStatusString(mf_cublas_s_));                              \
    } while (0)
