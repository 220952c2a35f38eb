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
__device__ __forceinline__ float ld(int8_t x) { return float(x); }   // an int8 KV cache's code

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

// Packed documents: doc_start's data (i32, one per token of the B x T batch: `tokens` = B*T), or
// null for an invalid doc_start (one document per row).
inline const int32_t * docs(const Tensor & doc_start, int64_t tokens) {
    if (!doc_start.valid()) return nullptr;
    MF_ASSERT(doc_start.dtype == DType::i32 && doc_start.numel() == tokens);
    return static_cast<const int32_t *>(doc_start.data);
}

// Packed documents (doc: i32 [B, T], each token's document start in its row; null: one document
// per row): the end of key `key`'s document in row b, i.e. the first query t > key with
// doc[b*T+t] > key, or T. doc_start is non-decreasing along a row, so the queries that see the
// key are exactly key .. end-1 (binary search). T when doc is null or key >= T.
__device__ __forceinline__ int doc_end(const int32_t * doc, int b, int T, int key) {
    if (!doc || key >= T) return T;
    const int32_t * row = doc + size_t(b) * T;
    int lo = key + 1, hi = T;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (row[mid] > key) hi = mid; else lo = mid + 1;
    }
    return lo;
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
