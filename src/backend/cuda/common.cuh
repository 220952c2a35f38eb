// Device-side helpers shared by the CUDA kernels (included by .cu files only).
//
// Storage types: float, __nv_bfloat16 and __half. Kernels load with ld() (to fp32), compute in
// fp32 and store with st<T>() (round to nearest even, as the CPU backend's from_f32), so a
// kernel's result differs from the CPU backend's only by fp32 summation order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "core/tensor.h"

namespace memfit::cuda {

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }

template <class T> __device__ __forceinline__ T st(float f);
template <> __device__ __forceinline__ float st<float>(float f) { return f; }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
template <> __device__ __forceinline__ __half st<__half>(float f) { return __float2half_rn(f); }

// Calls f(T{}) with T the storage type of dtype t (f32, bf16, f16); other dtypes abort.
template <class F> void dispatch_float(DType t, F && f) {
    switch (t) {
        case DType::f32: f(float{}); return;
        case DType::bf16: f(__nv_bfloat16{}); return;
        case DType::f16: f(__half{}); return;
        default: MF_ASSERT(false && "float tensor expected (f32, bf16 or f16)");
    }
}

template <class T> T * ptr(const Tensor & t) { return static_cast<T *>(t.data); }

inline unsigned grid_for(int64_t n, int threads) {
    const int64_t g = (n + threads - 1) / threads;
    return unsigned(g < 1 ? 1 : (g > 2147483647 ? 2147483647 : g));
}

// Sum over the 32 lanes of a warp (every lane gets it).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
// `shared` holds 32 floats. Contains __syncthreads: call from every thread of the block.
__device__ __forceinline__ float block_sum(float v, float * shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();   // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(v);
}

}  // namespace memfit::cuda
