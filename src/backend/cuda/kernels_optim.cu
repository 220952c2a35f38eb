// CUDA kernels: the gradients' sum of squares and the fused AdamW update (contracts: backend.h;
// the reference is backend/cpu/kernels_basic.cpp, sum_squares and adamw_impl).
//
// sum_squares is deterministic: a fixed grid (kSsqBlocks blocks, whatever the device) writes one
// double partial per block into a static device array, then a single block adds the partials in
// a fixed order. The partials are global state: two sum_squares on one stream are ordered and
// safe; two on different streams of one device at the same time are not.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/moments8.h"
#include "backend/stochastic_round.h"

namespace memfit::cuda {

namespace {

constexpr int kSsqBlocks = 1024, kSsqThreads = 256;
__device__ double g_ssq_partials[kSsqBlocks];

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); the result is valid in thread 0.
__device__ double block_sum_d(double v) {
    __shared__ double sh[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum_d(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) v = warp_sum_d(lane < int(blockDim.x / 32) ? sh[lane] : 0.0);
    return v;
}

// Grid kSsqBlocks, block kSsqThreads: 16-byte loads (a scalar head to the first 16-byte boundary
// and a scalar tail), squares accumulated in double per thread; one partial per block.
template <class T> __global__ void __launch_bounds__(kSsqThreads) ssq_partial_kernel(const T * x, int64_t n) {
    constexpr int kPer = 16 / sizeof(T);
    const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, nt = int64_t(gridDim.x) * blockDim.x;
    const auto mis = unsigned(reinterpret_cast<uintptr_t>(x) & 15u);
    const int64_t head = min(n, int64_t(((16u - mis) & 15u) / sizeof(T)));
    const int64_t nvec = (n - head) / kPer;
    const uint4 * v = reinterpret_cast<const uint4 *>(x + head);
    double acc = 0.0;
#pragma unroll 4
    for (int64_t k = tid; k < nvec; k += nt) {
        const uint4 u = v[k];
        const T * e = reinterpret_cast<const T *>(&u);
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const double d = double(ld(e[i]));
            acc += d * d;
        }
    }
    for (int64_t i = tid; i < head; i += nt) {
        const double d = double(ld(x[i]));
        acc += d * d;
    }
    for (int64_t i = head + nvec * kPer + tid; i < n; i += nt) {
        const double d = double(ld(x[i]));
        acc += d * d;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) g_ssq_partials[blockIdx.x] = acc;
}

// Grid 1, block kSsqBlocks: out[0] = the partials' sum, in a fixed order.
__global__ void __launch_bounds__(kSsqBlocks) ssq_final_kernel(float * out) {
    const double total = block_sum_d(g_ssq_partials[threadIdx.x]);
    if (threadIdx.x == 0) out[0] = float(total);
}

// ---- AdamW ----------------------------------------------------------------------------------

struct AdamArgs {
    float lr, beta1, beta2, eps, inv_bc1, inv_bc2, decay, one_m_b1, one_m_b2;
    float clip, grad_scale, skip_above_norm_sq;
    bool skip_nonfinite;
    bool keep_zeros;           // AdamWHyper::keep_zeros: a zero weight stays 0, its moments become 0
    uint64_t sr_seed, sr_at;   // bf16-sr weights (W = uint16_t): backend/stochastic_round.h's draws
};

// The weights' storage W: float, or (bf16-sr) bf16 bits rounded stochastically.
__device__ __forceinline__ float ldw(float p) { return p; }
__device__ __forceinline__ float ldw(uint16_t p) { return bf16_bits_to_f32(p); }
__device__ __forceinline__ void stw(float & w, float p, const AdamArgs &, int64_t) { w = p; }
__device__ __forceinline__ void stw(uint16_t & w, float p, const AdamArgs & a, int64_t i) {
    w = sr_bf16_bits(p, a.sr_seed, a.sr_at + uint64_t(i));
}

// update_scale() of backend.h, on the device.
__device__ __forceinline__ float device_update_scale(const AdamArgs & a, float norm_sq) {
    if (!(a.clip > 0)) return a.grad_scale;
    const float norm = sqrtf(norm_sq) * a.grad_scale;
    return norm > a.clip ? a.grad_scale * (a.clip / norm) : a.grad_scale;
}

// One element, in adamw_impl's order.
__device__ __forceinline__ float adam_step(const AdamArgs & a, float & p, float & m, float & v, float graw,
                                           float scale) {
    if (a.keep_zeros && p == 0.0f) {   // a kept zero (N:M sparsity): moments 0, weight unchanged
        m = 0.0f, v = 0.0f;
        return p;
    }
    const float g = graw * scale;
    m = a.beta1 * m + a.one_m_b1 * g;
    v = a.beta2 * v + a.one_m_b2 * g * g;
    const float mhat = m * a.inv_bc1, vhat = v * a.inv_bc2;
    p = p * a.decay - a.lr * mhat / (sqrtf(vhat) + a.eps);
    return p;
}

// Four consecutive elements of T as float4 (8- or 16-byte aligned loads), and back.
template <class T> __device__ __forceinline__ float4 load4(const T * p, int64_t k) {
    if constexpr (std::is_same_v<T, float>) {
        return reinterpret_cast<const float4 *>(p)[k];
    } else {
        const uint2 u = reinterpret_cast<const uint2 *>(p)[k];
        const T * e = reinterpret_cast<const T *>(&u);
        return make_float4(ld(e[0]), ld(e[1]), ld(e[2]), ld(e[3]));
    }
}
template <class T> __device__ __forceinline__ void store4(T * p, int64_t k, float4 f) {
    if constexpr (std::is_same_v<T, float>) {
        reinterpret_cast<float4 *>(p)[k] = f;
    } else {
        uint2 u;
        T * e = reinterpret_cast<T *>(&u);
        e[0] = st<T>(f.x), e[1] = st<T>(f.y), e[2] = st<T>(f.z), e[3] = st<T>(f.w);
        reinterpret_cast<uint2 *>(p)[k] = u;
    }
}

// Grid-stride over groups of 4 elements when Vec (every pointer aligned to its 4 elements), then
// the n % 4 tail; over single elements otherwise. norm_sq (device memory, or null: 0) is read by
// every thread. P = float means no param_copy; M: the moments' storage (float, or bf16 rounded
// to nearest even as the host's from_f32). Grid grid_for(n / 4 or n, 256), block 256.
template <class G, class P, class M, bool Vec, class W = float>
__global__ void __launch_bounds__(256) adamw_kernel(W * param, const G * grad, M * m, M * v, P * copy,
                                                    int64_t n, const float * norm_sq, AdamArgs a) {
    static_assert(!Vec || std::is_same_v<W, float>, "the vector path takes fp32 weights");
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (a.skip_nonfinite && !isfinite(nsq)) return;   // skips_update() of backend.h
    if (a.skip_above_norm_sq > 0 && nsq > a.skip_above_norm_sq) return;
    const float scale = device_update_scale(a, nsq);
    const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, nt = int64_t(gridDim.x) * blockDim.x;
    int64_t done = 0;
    if constexpr (Vec) {
        const int64_t nvec = n / 4;
        for (int64_t k = tid; k < nvec; k += nt) {
            float4 p = reinterpret_cast<float4 *>(param)[k], mm = load4(m, k), vv = load4(v, k);
            const float4 g = load4(grad, k);
            adam_step(a, p.x, mm.x, vv.x, g.x, scale);
            adam_step(a, p.y, mm.y, vv.y, g.y, scale);
            adam_step(a, p.z, mm.z, vv.z, g.z, scale);
            adam_step(a, p.w, mm.w, vv.w, g.w, scale);
            reinterpret_cast<float4 *>(param)[k] = p;
            store4(m, k, mm);
            store4(v, k, vv);
            if constexpr (!std::is_same_v<P, float>) store4(copy, k, p);
        }
        done = nvec * 4;
    }
    for (int64_t i = done + tid; i < n; i += nt) {
        float p = ldw(param[i]), mi = ld(m[i]), vi = ld(v[i]);
        adam_step(a, p, mi, vi, ld(grad[i]), scale);
        stw(param[i], p, a, i), m[i] = st<M>(mi), v[i] = st<M>(vi);
        if constexpr (!std::is_same_v<P, float>) copy[i] = st<P>(p);
    }
}

// --optimizer sgd, in sgd_update's order (backend/cpu/kernels_basic.cpp). Grid grid_for(n, 256).
template <class G, class P, class W>
__global__ void __launch_bounds__(256) sgd_kernel(W * param, const G * grad, float * buf, P * copy, int64_t n,
                                                  const float * norm_sq, AdamArgs a, float momentum, float wd) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (a.skip_nonfinite && !isfinite(nsq)) return;   // skips_update() of backend.h
    if (a.skip_above_norm_sq > 0 && nsq > a.skip_above_norm_sq) return;
    const float scale = device_update_scale(a, nsq);
    const int64_t nt = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += nt) {
        const float w = ldw(param[i]);
        const bool frozen = a.keep_zeros && w == 0.0f;   // a kept zero: no momentum, no step
        const float g = ld(grad[i]) * scale + wd * w;
        const float b = frozen ? 0.0f : momentum * buf[i] + g;
        buf[i] = b;
        const float p = frozen ? w : w - a.lr * b;
        stw(param[i], p, a, i);
        if constexpr (!std::is_same_v<P, float>) copy[i] = st<P>(p);
    }
}

bool aligned(const void * p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// backend/moments8.h's codes, on the device (the same arithmetic, in the same order).
__device__ __forceinline__ float dec_m8(uint8_t code, float scale) {
    const int c = int(int8_t(code));
    const float r = float(c < 0 ? -c : c) / 127.0f;
    return (c < 0 ? -scale : scale) * r * r;
}
__device__ __forceinline__ uint8_t enc_m8(float m, float scale) {
    if (!(scale > 0)) return 0;
    const int c = int(rintf(127.0f * sqrtf(fminf(1.0f, fabsf(m) / scale))));
    return uint8_t(int8_t(m < 0 ? -c : c));
}
__device__ __forceinline__ float dec_v8(uint8_t code, float scale) {
    const float r = float(code) / 255.0f, r2 = r * r;
    return scale * r2 * r2;
}
__device__ __forceinline__ uint8_t enc_v8(float v, float scale) {
    if (!(scale > 0) || !(v > 0)) return 0;
    const int c = int(rintf(255.0f * sqrtf(sqrtf(fminf(1.0f, v / scale)))));
    return uint8_t(c < 1 ? 1 : c);
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// 8-bit moments: grid = the view's blocks of kMoments8Block, block kMoments8Block threads, one
// element each. Every thread decodes with the old scales, updates, and the block's new scales
// (the largest |m| and v) are reduced before any thread encodes or thread 0 stores them.
template <class G, class P, class W = float>
__global__ void __launch_bounds__(kMoments8Block) adamw8_kernel(W * param, const G * grad, uint8_t * m,
                                                                uint8_t * v, float * m_scale, float * v_scale,
                                                                P * copy, int64_t n, const float * norm_sq,
                                                                AdamArgs a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (a.skip_nonfinite && !isfinite(nsq)) return;   // skips_update() of backend.h
    if (a.skip_above_norm_sq > 0 && nsq > a.skip_above_norm_sq) return;
    const float scale = device_update_scale(a, nsq);
    const int64_t b = blockIdx.x, i = b * int64_t(kMoments8Block) + threadIdx.x;
    float mi = 0, vi = 0;
    if (i < n) {
        float p = ldw(param[i]);
        mi = dec_m8(m[i], m_scale[b]), vi = dec_v8(v[i], v_scale[b]);
        adam_step(a, p, mi, vi, ld(grad[i]), scale);
        stw(param[i], p, a, i);
        if constexpr (!std::is_same_v<P, float>) copy[i] = st<P>(p);
    }
    __shared__ float sm[kMoments8Block / 32], sv[kMoments8Block / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float wm = warp_max(fabsf(mi)), wv = warp_max(vi);
    if (lane == 0) sm[warp] = wm, sv[warp] = wv;
    __syncthreads();
    float bm = 0, bv = 0;
    for (int w = 0; w < int(kMoments8Block / 32); ++w) bm = fmaxf(bm, sm[w]), bv = fmaxf(bv, sv[w]);
    if (threadIdx.x == 0) m_scale[b] = bm, v_scale[b] = bv;
    if (i < n) m[i] = enc_m8(mi, bm), v[i] = enc_v8(vi, bv);
}

// The constants exactly as adamw_impl forms them on the host.
AdamArgs adam_args(const AdamWHyper & h) {
    AdamArgs a;
    a.lr = h.lr, a.beta1 = h.beta1, a.beta2 = h.beta2, a.eps = h.eps;
    a.inv_bc1 = float(1.0 / (1.0 - std::pow(double(h.beta1), h.t)));
    a.inv_bc2 = float(1.0 / (1.0 - std::pow(double(h.beta2), h.t)));
    a.decay = float(1.0 - double(h.lr) * h.weight_decay);
    a.one_m_b1 = 1.0f - h.beta1, a.one_m_b2 = 1.0f - h.beta2;
    a.clip = h.clip, a.grad_scale = h.grad_scale, a.skip_nonfinite = h.skip_nonfinite;
    a.skip_above_norm_sq = h.skip_above_norm_sq;
    a.sr_seed = h.sr_seed, a.sr_at = h.sr_at;
    a.keep_zeros = h.keep_zeros;
    return a;
}

}  // namespace

namespace {

// f(G * grad, P * param_copy) for the gradients' and the compute copy's storage (P = float and a
// null copy when there is none).
template <class F>
void with_grad_and_copy(Tensor grad, Tensor param_copy, F && f) {
    dispatch_float(grad.dtype, [&](auto gz) {
        using G = decltype(gz);
        dispatch_float(param_copy.valid() ? param_copy.dtype : DType::f32, [&](auto pz) {
            using P = decltype(pz);
            f(ptr<G>(grad), param_copy.valid() ? ptr<P>(param_copy) : static_cast<P *>(nullptr));
        });
    });
}

}  // namespace

void sum_squares(cudaStream_t s, Tensor out, Tensor x) {
    MF_ASSERT(out.dtype == DType::f32 && out.numel() >= 1);
    dispatch_float(x.dtype, [&](auto z) {
        using T = decltype(z);
        ssq_partial_kernel<T><<<kSsqBlocks, kSsqThreads, 0, s>>>(ptr<T>(x), x.numel());
        MF_CUDA_LAUNCHED();
    });
    ssq_final_kernel<<<1, kSsqBlocks, 0, s>>>(out.f32());
    MF_CUDA_LAUNCHED();
}

void adamw(cudaStream_t s, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor norm_sq, Tensor param_copy,
           const AdamWHyper & h) {
    const int64_t n = param.numel();
    MF_ASSERT(m.dtype == v.dtype && (m.dtype == DType::f32 || m.dtype == DType::bf16));
    const bool sr = sr_weights(param, param_copy, h);
    MF_ASSERT(grad.numel() == n && m.numel() == n && v.numel() == n && h.t >= 1);
    MF_ASSERT(!norm_sq.valid() || norm_sq.dtype == DType::f32);
    if (param_copy.valid())
        MF_ASSERT(param_copy.numel() == n && (param_copy.dtype == DType::bf16 || param_copy.dtype == DType::f16));
    if (n == 0) return;
    const AdamArgs a = adam_args(h);
    const float * nsq = norm_sq.valid() ? norm_sq.f32() : nullptr;
    with_grad_and_copy(grad, param_copy, [&](auto * g, auto * copy) {
        using G = std::remove_pointer_t<decltype(g)>;
        using P = std::remove_pointer_t<decltype(copy)>;
        auto launch = [&](auto * mm, auto * vv) {
            using M = std::remove_pointer_t<decltype(mm)>;
            const bool vec = aligned(param.data, 16) && aligned(mm, 4 * sizeof(M)) && aligned(vv, 4 * sizeof(M)) &&
                             aligned(g, 4 * sizeof(G)) && (!copy || aligned(copy, 4 * sizeof(P)));
            if (sr)   // bf16-sr: one element per thread
                adamw_kernel<G, P, M, false, uint16_t><<<grid_for(n, 256), 256, 0, s>>>(ptr<uint16_t>(param), g, mm,
                                                                                        vv, copy, n, nsq, a);
            else if (vec)
                adamw_kernel<G, P, M, true><<<grid_for(n / 4 > 0 ? n / 4 : n, 256), 256, 0, s>>>(param.f32(), g, mm,
                                                                                               vv, copy, n, nsq, a);
            else
                adamw_kernel<G, P, M, false><<<grid_for(n, 256), 256, 0, s>>>(param.f32(), g, mm, vv, copy, n, nsq, a);
            MF_CUDA_LAUNCHED();
        };
        if (m.dtype == DType::bf16) launch(ptr<__nv_bfloat16>(m), ptr<__nv_bfloat16>(v));
        else launch(m.f32(), v.f32());
    });
}

void sgd(cudaStream_t s, Tensor param, Tensor grad, Tensor buf, Tensor norm_sq, Tensor param_copy, const AdamWHyper & h) {
    const int64_t n = param.numel();
    MF_ASSERT(buf.dtype == DType::f32 && grad.numel() == n && buf.numel() == n);
    const bool sr = sr_weights(param, param_copy, h);
    if (n == 0) return;
    const AdamArgs a = adam_args(h);
    const float * nsq = norm_sq.valid() ? norm_sq.f32() : nullptr;
    with_grad_and_copy(grad, param_copy, [&](auto * g, auto * copy) {
        using G = std::remove_pointer_t<decltype(g)>;
        using P = std::remove_pointer_t<decltype(copy)>;
        if (sr)
            sgd_kernel<G, P, uint16_t><<<grid_for(n, 256), 256, 0, s>>>(ptr<uint16_t>(param), g, buf.f32(), copy, n, nsq,
                                                                        a, h.momentum, h.weight_decay);
        else
            sgd_kernel<G, P, float><<<grid_for(n, 256), 256, 0, s>>>(param.f32(), g, buf.f32(), copy, n, nsq, a,
                                                                     h.momentum, h.weight_decay);
        MF_CUDA_LAUNCHED();
    });
}

void adamw_8bit(cudaStream_t s, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor m_scale, Tensor v_scale,
                Tensor norm_sq, Tensor param_copy, const AdamWHyper & h) {
    const int64_t n = param.numel(), blocks = int64_t(moments8_blocks(size_t(n)));
    MF_ASSERT(m.dtype == DType::u8 && v.dtype == DType::u8);
    const bool sr = sr_weights(param, param_copy, h);
    MF_ASSERT(grad.numel() == n && m.numel() == n && v.numel() == n && h.t >= 1);
    MF_ASSERT(m_scale.numel() == blocks && v_scale.numel() == blocks);
    if (n == 0) return;
    const AdamArgs a = adam_args(h);
    const float * nsq = norm_sq.valid() ? norm_sq.f32() : nullptr;
    with_grad_and_copy(grad, param_copy, [&](auto * g, auto * copy) {
        using G = std::remove_pointer_t<decltype(g)>;
        using P = std::remove_pointer_t<decltype(copy)>;
        if (sr)   // bf16-sr
            adamw8_kernel<G, P, uint16_t><<<unsigned(blocks), unsigned(kMoments8Block), 0, s>>>(
                ptr<uint16_t>(param), g, ptr<uint8_t>(m), ptr<uint8_t>(v), m_scale.f32(), v_scale.f32(), copy, n, nsq, a);
        else
            adamw8_kernel<G, P><<<unsigned(blocks), unsigned(kMoments8Block), 0, s>>>(
                param.f32(), g, ptr<uint8_t>(m), ptr<uint8_t>(v), m_scale.f32(), v_scale.f32(), copy, n, nsq, a);
        MF_CUDA_LAUNCHED();
    });
}

}  // namespace memfit::cuda
