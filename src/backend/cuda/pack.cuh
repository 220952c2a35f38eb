// 16-byte packed loads and stores, and the elementwise launcher built on them (kernels_*.cu).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "backend/cuda/common.cuh"

namespace memfit::cuda {

// V elements of T, loaded or stored with one access.
template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };
template <int V, class T> __device__ __forceinline__ Pack<T, V> ldp(const T * p) {
    return *reinterpret_cast<const Pack<T, V> *>(p);
}
template <int V, class T> __device__ __forceinline__ void stp(T * p, const Pack<T, V> & q) {
    *reinterpret_cast<Pack<T, V> *>(p) = q;
}

inline bool aligned16(std::initializer_list<const void *> ps) {
    for (const void * p : ps)
        if (reinterpret_cast<uintptr_t>(p) & 15u) return false;
    return true;
}

// f.run<V>(i) handles elements i .. i+V-1 (whole packs); the tail of n goes through run<1>.
template <int V, class F> __global__ void map_kernel(int64_t n, F f) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
    for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
        if (i + V <= n) f.template run<V>(i);
        else
            for (int64_t k = i; k < n; ++k) f.template run<1>(k);
    }
}

// Launches f over n elements with packs of 16 / sizeof(T) elements when `vec`, else singly.
template <class T, class F> void launch_map(cudaStream_t s, int64_t n, bool vec, const F & f) {
    constexpr int threads = 256;
    if (n <= 0) return;
    constexpr int V = int(16 / sizeof(T));
    if (vec) map_kernel<V><<<grid_for((n + V - 1) / V, threads), threads, 0, s>>>(n, f);
    else map_kernel<1><<<grid_for(n, threads), threads, 0, s>>>(n, f);
    MF_CUDA_LAUNCHED();
}

}  // namespace memfit::cuda
