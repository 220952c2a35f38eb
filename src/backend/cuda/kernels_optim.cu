// CUDA kernels: the gradients' sum of squares and the optimizers' steps (contracts: backend.h and
// backend/optimizer.h; the per-element arithmetic is backend/update_rules.h's, which the CPU's
// kernels, cpu/kernels_optim.cpp, compile as well).
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
#include "backend/update_rules.h"

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

// ---- The optimizers ---------------------------------------------------------------------------

// The weights' storage W: float, or (bf16-sr) bf16 bits rounded stochastically.
__device__ __forceinline__ float ldw(float p) { return p; }
__device__ __forceinline__ float ldw(uint16_t p) { return bf16_bits_to_f32(p); }
__device__ __forceinline__ void stw(float & w, float p, const UpdateConsts &, int64_t) { w = p; }
__device__ __forceinline__ void stw(uint16_t & w, float p, const UpdateConsts & a, int64_t i) {
    w = sr_bf16_bits(p, a.sr_seed, a.sr_at + uint64_t(i));
}

// One AdamW element: the rule, on the stored gradient times the step's scale.
__device__ __forceinline__ void adam_step(const UpdateConsts & a, float & p, float & m, float & v, float graw,
                                          float scale) {
    p = adamw_rule(a, p, graw * scale, m, v, a.keep_zeros && p == 0.0f);
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
                                                    int64_t n, const float * norm_sq, UpdateConsts a) {
    static_assert(!Vec || std::is_same_v<W, float>, "the vector path takes fp32 weights");
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
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

// --optimizer sgd: one element per thread. Grid grid_for(n, 256).
template <class G, class P, class W>
__global__ void __launch_bounds__(256) sgd_kernel(W * param, const G * grad, float * buf, P * copy, int64_t n,
                                                  const float * norm_sq, UpdateConsts a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
    const int64_t nt = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += nt) {
        const float w = ldw(param[i]);
        float b = buf[i];
        const float p = sgd_rule(a, w, ld(grad[i]) * scale, b, a.keep_zeros && w == 0.0f);
        buf[i] = b;
        stw(param[i], p, a, i);
        if constexpr (!std::is_same_v<P, float>) copy[i] = st<P>(p);
    }
}

// ---- Adafactor (update_rules.h), an R x C view in four passes: the statistics (rows: a block
// per row; columns: a thread per column over the rows in order; a vector: a thread per element),
// the rows' mean, u's sum of squares (kAfBlocks partials, added in order by every block of the
// step), the step. The sums are in double, each in a fixed order. Like sum_squares, the
// partials are global state: one Adafactor step at a time per device.
constexpr int kAfBlocks = 256;
__device__ double g_af_partials[kAfBlocks];
__device__ float g_af_row_mean[1];

template <class G>
__global__ void __launch_bounds__(256) af_rows_kernel(const G * grad, float * row, int64_t C, const float * norm_sq,
                                                      UpdateConsts a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
    const int64_t i = blockIdx.x;
    double s = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        const float g = ld(grad[i * C + j]) * scale;
        s += double(g * g + a.eps1);
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) row[i] = adafactor_stat(a, row[i], s / double(C));
}

// Columns (R rows, in order) when R rows and C columns are factored; else every element of n.
template <class G>
__global__ void __launch_bounds__(256) af_cols_kernel(const G * grad, float * stat, int64_t R, int64_t C,
                                                      bool factored, const float * norm_sq, UpdateConsts a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (!factored) {
        if (j >= R * C) return;
        const float g = ld(grad[j]) * scale;
        stat[j] = adafactor_stat(a, stat[j], double(g * g + a.eps1));
        return;
    }
    if (j >= C) return;
    double s = 0;
    for (int64_t i = 0; i < R; ++i) {
        const float g = ld(grad[i * C + j]) * scale;
        s += double(g * g + a.eps1);
    }
    stat[R + j] = adafactor_stat(a, stat[R + j], s / double(R));
}

// Grid 1, block 256: the row statistics' mean.
__global__ void __launch_bounds__(256) af_row_mean_kernel(const float * row, int64_t R, const float * norm_sq,
                                                          UpdateConsts a) {
    if (rule_skips(a, norm_sq ? *norm_sq : 0.0f)) return;
    double s = 0;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x) s += double(row[i]);
    s = block_sum_d(s);
    if (threadIdx.x == 0) g_af_row_mean[0] = float(s / double(R));
}

__device__ __forceinline__ float af_u(const float * stat, int64_t R, int64_t C, bool factored, int64_t k, float g) {
    if (!factored) return adafactor_u(g, 1.0f, adafactor_col_factor(stat[k]));
    return adafactor_u(g, adafactor_row_factor(stat[k / C], g_af_row_mean[0]), adafactor_col_factor(stat[R + k % C]));
}

// Grid kAfBlocks, block 256: one partial of u's sum of squares per block.
template <class G>
__global__ void __launch_bounds__(256) af_usq_kernel(const G * grad, const float * stat, int64_t R, int64_t C,
                                                     bool factored, const float * norm_sq, UpdateConsts a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
    double s = 0;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < R * C; k += int64_t(gridDim.x) * blockDim.x) {
        const float u = af_u(stat, R, C, factored, k, ld(grad[k]) * scale);
        s += double(u) * double(u);
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) g_af_partials[blockIdx.x] = s;
}

template <class G, class P, class W>
__global__ void __launch_bounds__(256) af_apply_kernel(W * param, const G * grad, P * copy, const float * stat,
                                                       float * m, int64_t R, int64_t C, bool factored,
                                                       const float * norm_sq, UpdateConsts a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
    __shared__ float inv;
    if (threadIdx.x == 0) {
        double u = 0;
        for (int b = 0; b < kAfBlocks; ++b) u += g_af_partials[b];
        inv = adafactor_inv_denom(a, u, double(R) * double(C));
    }
    __syncthreads();
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < R * C; k += int64_t(gridDim.x) * blockDim.x) {
        const float w = ldw(param[k]);
        const bool frozen = a.keep_zeros && w == 0.0f;
        const float u = af_u(stat, R, C, factored, k, ld(grad[k]) * scale);
        float p = w;
        if (m) {   // --adafactor-beta1: the averaged update
            p = adafactor_rule_m(a, w, u, inv, m[k]);
            if (frozen) m[k] = 0.0f, p = w;
        } else if (!frozen) {
            p = adafactor_rule(a, w, u, inv);
        }
        stw(param[k], p, a, k);
        if constexpr (!std::is_same_v<P, float>) copy[k] = st<P>(p);
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
                                                                UpdateConsts a) {
    const float nsq = norm_sq ? *norm_sq : 0.0f;
    if (rule_skips(a, nsq)) return;
    const float scale = rule_scale(a, nsq);
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

namespace {

// The rows' launchers: nsq the device's norm_sq (or null), a the step's constants, the storage
// dispatched here. One per backend/optimizer.h row (kSteps below).
using StepFn = void (*)(cudaStream_t s, Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy,
                        const float * nsq, const UpdateConsts & a);

void adamw_step(cudaStream_t s, Tensor param, Tensor grad, const OptimizerStates & st, Tensor param_copy,
                const float * nsq, const UpdateConsts & a) {
    const int64_t n = param.numel();
    const bool sr = param.dtype == DType::bf16;
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
        if (st.t[0].dtype == DType::bf16) launch(ptr<__nv_bfloat16>(st.t[0]), ptr<__nv_bfloat16>(st.t[1]));
        else launch(st.t[0].f32(), st.t[1].f32());
    });
}

void sgd_step(cudaStream_t s, Tensor param, Tensor grad, const OptimizerStates & st, Tensor param_copy,
              const float * nsq, const UpdateConsts & a) {
    const int64_t n = param.numel();
    with_grad_and_copy(grad, param_copy, [&](auto * g, auto * copy) {
        using G = std::remove_pointer_t<decltype(g)>;
        using P = std::remove_pointer_t<decltype(copy)>;
        if (param.dtype == DType::bf16)   // bf16-sr
            sgd_kernel<G, P, uint16_t><<<grid_for(n, 256), 256, 0, s>>>(ptr<uint16_t>(param), g, st.t[0].f32(), copy, n,
                                                                        nsq, a);
        else
            sgd_kernel<G, P, float><<<grid_for(n, 256), 256, 0, s>>>(param.f32(), g, st.t[0].f32(), copy, n, nsq, a);
        MF_CUDA_LAUNCHED();
    });
}

void adamw8_step(cudaStream_t s, Tensor param, Tensor grad, const OptimizerStates & st, Tensor param_copy,
                 const float * nsq, const UpdateConsts & a) {
    const int64_t n = param.numel(), blocks = int64_t(moments8_blocks(size_t(n)));
    uint8_t * m = ptr<uint8_t>(st.t[0]), * v = ptr<uint8_t>(st.t[1]);
    float * ms = st.t[2].f32(), * vs = st.t[3].f32();
    with_grad_and_copy(grad, param_copy, [&](auto * g, auto * copy) {
        using G = std::remove_pointer_t<decltype(g)>;
        using P = std::remove_pointer_t<decltype(copy)>;
        if (param.dtype == DType::bf16)   // bf16-sr
            adamw8_kernel<G, P, uint16_t><<<unsigned(blocks), unsigned(kMoments8Block), 0, s>>>(
                ptr<uint16_t>(param), g, m, v, ms, vs, copy, n, nsq, a);
        else
            adamw8_kernel<G, P><<<unsigned(blocks), unsigned(kMoments8Block), 0, s>>>(param.f32(), g, m, v, ms, vs,
                                                                                   copy, n, nsq, a);
        MF_CUDA_LAUNCHED();
    });
}

void adafactor_step(cudaStream_t s, Tensor param, Tensor grad, const OptimizerStates & st, Tensor param_copy,
                    const float * nsq, const UpdateConsts & a) {
    const int64_t R = view_rows(param), C = view_cols(param);
    const bool factored = R >= 2 && C >= 2;
    float * stat = st.t[0].f32();
    float * m = st.t[1].valid() && st.t[1].numel() > 0 ? st.t[1].f32() : nullptr;
    MF_ASSERT((m != nullptr) == (a.af_beta1 > 0));
    with_grad_and_copy(grad, param_copy, [&](auto * g, auto * copy) {
        using G = std::remove_pointer_t<decltype(g)>;
        using P = std::remove_pointer_t<decltype(copy)>;
        if (factored) {
            af_rows_kernel<G><<<unsigned(R), 256, 0, s>>>(g, stat, C, nsq, a);
            MF_CUDA_LAUNCHED();
            af_cols_kernel<G><<<grid_for(C, 256), 256, 0, s>>>(g, stat, R, C, true, nsq, a);
            MF_CUDA_LAUNCHED();
            af_row_mean_kernel<<<1, 256, 0, s>>>(stat, R, nsq, a);
        } else {
            af_cols_kernel<G><<<grid_for(R * C, 256), 256, 0, s>>>(g, stat, R, C, false, nsq, a);
        }
        MF_CUDA_LAUNCHED();
        af_usq_kernel<G><<<kAfBlocks, 256, 0, s>>>(g, stat, R, C, factored, nsq, a);
        MF_CUDA_LAUNCHED();
        if (param.dtype == DType::bf16)   // bf16-sr
            af_apply_kernel<G, P, uint16_t><<<grid_for(R * C, 256), 256, 0, s>>>(ptr<uint16_t>(param), g, copy, stat, m,
                                                                                 R, C, factored, nsq, a);
        else
            af_apply_kernel<G, P, float><<<grid_for(R * C, 256), 256, 0, s>>>(param.f32(), g, copy, stat, m, R, C,
                                                                              factored, nsq, a);
        MF_CUDA_LAUNCHED();
    });
}

// GaLore's projector refresh is an eigen-decomposition this backend does not have yet: the
// trainer refuses the row on CUDA before the step (run/compat.cpp); a step reaching it is a bug.
void galore_step(cudaStream_t, Tensor, Tensor, const OptimizerStates &, Tensor, const float *, const UpdateConsts &) {
    MF_UNREACHABLE();
}

constexpr struct { Optimizer id; StepFn fn; } kSteps[kOptimizerCount] = {
    {Optimizer::adamw, adamw_step},
    {Optimizer::adamw_bf16, adamw_step},
    {Optimizer::sgd, sgd_step},
    {Optimizer::adamw_8bit, adamw8_step},
    {Optimizer::adafactor, adafactor_step},
    {Optimizer::galore_adamw, galore_step},
    {Optimizer::galore_adamw_8bit, galore_step},
};

}  // namespace

void optimizer_step(cudaStream_t s, Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states,
                    Tensor norm_sq, Tensor param_copy, const OptimHyper & h) {
    check_optimizer_view(o, param, grad, states, param_copy, h);
    MF_ASSERT(kSteps[int(o)].id == o && (!norm_sq.valid() || norm_sq.dtype == DType::f32));
    if (param.numel() == 0) return;
    kSteps[int(o)].fn(s, param, grad, states, param_copy, norm_sq.valid() ? norm_sq.f32() : nullptr, update_consts(h));
}

}  // namespace memfit::cuda
