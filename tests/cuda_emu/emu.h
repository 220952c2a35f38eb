// The CUDA emulator's device side: what a kernel source needs, beyond C++, to run on the CPU.
// Force-included (-include) into the CUDA sources after cu2cpp has rewritten their launches.
//
// A launch runs its blocks one after another on each OpenMP thread; a block runs its threads as
// fibers (a stack switch of its own) on that thread, switching (straight to the next ready
// thread) only at a barrier or a warp operation, so every thread of a block sees the others'
// shared-memory writes in program order. __shared__ variables are thread_local statics: each
// OpenMP thread holds one copy, used by one block at a time.
// Checked where hardware would misbehave silently: a warp operation whose lanes have not all
// arrived (exited lanes, divergent barriers: a deadlock the scheduler reports), a launch over the
// hardware's limits, dynamic shared memory over the opt-in limit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#undef __shared__
#define __shared__ static thread_local
#define __launch_bounds__(...)

namespace emu {

const uint3 & thread_idx();
const uint3 & block_idx();
const dim3 & block_dim();
const dim3 & grid_dim();
void * dynamic_shared();

void launch_fn(const std::function<void()> & body, dim3 grid, dim3 block, size_t smem, cudaStream_t stream);
// Runs the stream's deferred copies (fake_cudart.cpp): every other kind of work on a stream
// comes after them.
void flush_stream(cudaStream_t stream);
template <class F> void launch(F && body, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
    launch_fn(std::function<void()>(std::ref(body)), grid, block, smem, stream);
}

// Block barrier; returns the OR of `pred` over the block's live threads.
int block_barrier(int pred);
// Warp exchange: every lane of the full mask gives v and gets lane src's v (src out of
// range: its own). Also the warp barrier; the ballot gives a bit per lane of pred != 0.
uint64_t warp_exchange(unsigned mask, uint64_t v, int src);
unsigned warp_ballot(unsigned mask, int pred);
int lane_id();

// The m16n8k16 tensor-core product D += A B with A, B bf16 (S = __nv_bfloat16) or f16
// (__half), D f32, in the PTX ISA's fragment layout for one warp (each lane gives its
// fragments; the warp's product is computed once all 32 have arrived).
void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <class T> uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
}
template <class T> T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

}  // namespace emu

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

// The device functions the kernels use (and only those).
inline void __syncthreads() { (void) ::emu::block_barrier(0); }
inline int __syncthreads_or(int p) { return ::emu::block_barrier(p != 0); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void) ::emu::warp_exchange(mask, 0, 0); }
inline unsigned __ballot_sync(unsigned mask, int p) { return ::emu::warp_ballot(mask, p); }
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    return ::emu::from_bits<T>(::emu::warp_exchange(mask, ::emu::to_bits(v), ::emu::lane_id() ^ lane_mask));
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __int_as_float(int x) { return ::emu::from_bits<float>(uint32_t(x)); }
inline float __uint_as_float(unsigned x) { return ::emu::from_bits<float>(x); }
// CUDA's device overloads of min/max (mixed integer types take their common type).
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) {
    return b < a ? std::common_type_t<A, B>(b) : std::common_type_t<A, B>(a);
}
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? std::common_type_t<A, B>(b) : std::common_type_t<A, B>(a);
}
using std::isfinite;
// The runtime's kernel-attribute call takes the kernel itself.
template <class... A> cudaError_t cudaFuncSetAttribute(void (*kernel)(A...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel), attr, value);
}
