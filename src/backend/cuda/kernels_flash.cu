// CUDA kernels: FlashAttention-2 style causal attention that never stores T x T. Contracts in
// backend/backend.h; reference: backend/cpu/kernels_flash.cpp (same qkv layout, scale 1/sqrt(hd),
// lse[b,h,t] = m + log l of the scaled scores, D_t = dout_t . out_t).
//
// Two implementations of the same three steps, both deterministic (no atomics: every output
// element is summed by one thread in a fixed order, so equal inputs give equal bits):
//   forward       one block per (query tile, head, batch): online softmax over key tiles 0..diag;
//   backward dQ   one block per (query tile, head, batch): recompute P and dS over key tiles,
//                 dQ += dS K (FA2 without its atomics, like the CPU's low-precision pass B);
//   backward dKdV one block per (key tile, head, batch): over query tiles from the diagonal,
//                 dV += P^T dO, dK += dS^T Q.
// The backward thus computes S and dP twice (7 tile products per pair instead of FA2's 5) and
// needs only D = rowsum(dO * O) in its scratch (cuda_flash_attention_workspace).
//
// Packed documents (doc_start, i32 [B,T]; null: one document per row): query q sees keys
// doc[q] .. q. doc_start is non-decreasing along a row, so a query tile's earliest key is its
// first query's document start: the forward and dQ start their key loop at that key's tile, and
// dKdV stops at the first query tile whose first query's document starts after the block's last
// key. Within the tile pairs left, keys before a query's document start are masked (in dKdV:
// queries after the end of the key's document, doc_end in common.cuh); a forward
// row that has seen no key yet (running max -inf) takes a tile as a no-op (no NaN). The
// no-document path computes exactly what it did before (the masks add nothing, the skips none).
//
// * mma: bf16/f16 with head dim 64 or 128 and 16-byte aligned tensors. 4 warps; each warp owns
//   16 rows of its block's 64 and multiplies with mma.sync.m16n8k16 (bf16/f16 in, fp32
//   accumulators); softmax statistics in fp32 registers (exp2 with log2(e) folded into the
//   scale). Tiles in shared memory, rows padded by 8 elements (conflict-free fragment loads).
//   P and dS are rounded to bf16/f16 as tensor-core operands (the CPU keeps them fp32).
// * simt: every other case (f32; bf16/f16 with other head dims or alignment), head dims 32, 64,
//   96, 128; fp32 CUDA cores. 4 warps; a warp owns 4 rows of the block's 16 and a tile of 32
//   columns holds one column per lane; the other operand is read from shared memory.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_flash_mma.cuh"
#include "backend/cuda_sizing.h"

namespace memfit::cuda {

namespace {

using namespace flash;

template <class K> void allow_smem(K kernel, size_t bytes) {
    if (bytes > (size_t(48) << 10))
        MF_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// D[(b*NH+h)*T+t] = dout_t . out_t over head h: one warp per (b,h,t).
template <class S>
__global__ void flash_d_kernel(float * D, const S * dout, const S * out, int B, int T, int C, int NH) {
    const int64_t task = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (task >= int64_t(B) * NH * T) return;
    const int hs = C / NH, t = int(task % T), h = int(task / T % NH), b = int(task / (int64_t(T) * NH));
    const size_t off = (size_t(b) * T + t) * C + size_t(h) * hs;
    float d = 0.0f;
    for (int i = threadIdx.x % 32; i < hs; i += 32) d += ld(dout[off + i]) * ld(out[off + i]);
    d = warp_sum(d);
    if (threadIdx.x % 32 == 0) D[task] = d;
}

// ---------------------------------------------------------------------------------------------
// simt kernels: R = 4 rows per warp, 16 per block; 32 columns per tile (one per lane).
// Shared: the block's own rows [16][HD] (read by broadcast), the tile's rows [32][HD+1] (odd
// stride: lane j reading row j is conflict-free), P or dS [16][32].

constexpr int kR = 4, kRows = 16, kCols = 32;

// dst[r][d] (row stride ldd, fp32) = src row r (stride lds), zero for r >= nvalid.
template <class S, int HD>
__device__ __forceinline__ void load_f32(float * dst, int ldd, const S * src, size_t lds, int rows, int nvalid) {
    for (int i = threadIdx.x; i < rows * HD; i += kThreads) {
        const int r = i / HD, d = i % HD;
        dst[r * ldd + d] = r < nvalid ? ld(src[size_t(r) * lds + d]) : 0.0f;
    }
}

// Forward. Shared: Q [16][HD], K [32][HD+1], V [32][HD], P [16][32]: 43 KiB at HD = 128.
template <class S, int HD>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_simt(S * out, float * lse, const S * qkv, int T, int C, int NH, const int32_t * doc) {
    constexpr int NC = HD / 32;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    float * Qs = reinterpret_cast<float *>(flash_smem);
    float * Ks = Qs + kRows * HD;
    float * Vs = Ks + kCols * (HD + 1);
    float * Ps = Vs + kCols * HD;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t C3 = size_t(3) * C;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * HD;
    const float scale = 1.0f / sqrtf(float(HD));
    load_f32<S, HD>(Qs, HD, base + q0 * C3, C3, kRows, T - q0);
    float o[kR][NC] = {}, m[kR], l[kR] = {};
    int lo[kR];   // each row's first key (its document start)
    for (int i = 0; i < kR; ++i) m[i] = -INFINITY, lo[i] = doc_of(doc, b, T, q0 + w * kR + i);
    const int qlast = min(q0 + kRows - 1, T - 1);
    for (int k0 = doc_of(doc, b, T, q0) / kCols * kCols; k0 <= qlast; k0 += kCols) {
        __syncthreads();
        load_f32<S, HD>(Ks, HD + 1, base + C + k0 * C3, C3, kCols, T - k0);
        load_f32<S, HD>(Vs, HD, base + 2 * size_t(C) + k0 * C3, C3, kCols, T - k0);
        __syncthreads();
        float s[kR] = {};
#pragma unroll 8
        for (int d = 0; d < HD; ++d) {
            const float kd = Ks[lane * (HD + 1) + d];
            for (int i = 0; i < kR; ++i) s[i] += Qs[(w * kR + i) * HD + d] * kd;
        }
        for (int i = 0; i < kR; ++i) {
            const int key = k0 + lane;
            const float x = key <= q0 + w * kR + i && key >= lo[i] ? s[i] * scale : -INFINITY;
            // -inf only for a row with no key of its document yet (never without documents: key 0
            // is in every row's first tile): subtract 0 instead, so p = 0 and alpha = 0.
            const float mnew = fmaxf(m[i], warp_max(x)), u = mnew == -INFINITY ? 0.0f : mnew;
            const float p = expf(x - u), alpha = expf(m[i] - u);
            l[i] = l[i] * alpha + warp_sum(p);
            m[i] = mnew;
            Ps[(w * kR + i) * kCols + lane] = p;
            for (int c = 0; c < NC; ++c) o[i][c] *= alpha;
        }
        __syncwarp();
        for (int j = 0; j < kCols; ++j)
            for (int c = 0; c < NC; ++c) {
                const float v = Vs[j * HD + lane + 32 * c];
                for (int i = 0; i < kR; ++i) o[i][c] += Ps[(w * kR + i) * kCols + j] * v;
            }
    }
    for (int i = 0; i < kR; ++i) {
        const int q = q0 + w * kR + i;
        if (q >= T) continue;
        const float inv = 1.0f / l[i];
        S * orow = out + (size_t(b) * T + q) * C + size_t(h) * HD;
        for (int c = 0; c < NC; ++c) orow[lane + 32 * c] = st<S>(o[i][c] * inv);
        if (lane == 0) lse[(size_t(b) * NH + h) * T + q] = m[i] + logf(l[i]);
    }
}

// Backward dQ. Shared: Q, dO [16][HD]; K, V [32][HD+1]; dS [16][32]: 51 KiB at HD = 128.
template <class S, int HD>
__global__ void __launch_bounds__(kThreads)
flash_dq_simt(S * dqkv, const float * D, const S * dout, const S * qkv, const float * lse, int T, int C, int NH,
              const int32_t * doc) {
    constexpr int NC = HD / 32;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    float * Qs = reinterpret_cast<float *>(flash_smem);
    float * Gs = Qs + kRows * HD;
    float * Ks = Gs + kRows * HD;
    float * Vs = Ks + kCols * (HD + 1);
    float * Ps = Vs + kCols * (HD + 1);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t C3 = size_t(3) * C, bh = size_t(b) * NH + h;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * HD;
    const float scale = 1.0f / sqrtf(float(HD));
    load_f32<S, HD>(Qs, HD, base + q0 * C3, C3, kRows, T - q0);
    load_f32<S, HD>(Gs, HD, dout + (size_t(b) * T + q0) * C + size_t(h) * HD, size_t(C), kRows, T - q0);
    float lr[kR], dr[kR], dq[kR][NC] = {};
    int lo[kR];
    for (int i = 0; i < kR; ++i) {
        const int q = q0 + w * kR + i;
        lr[i] = q < T ? lse[bh * T + q] : 0.0f;
        dr[i] = q < T ? D[bh * T + q] : 0.0f;
        lo[i] = doc_of(doc, b, T, q);
    }
    const int qlast = min(q0 + kRows - 1, T - 1);
    for (int k0 = doc_of(doc, b, T, q0) / kCols * kCols; k0 <= qlast; k0 += kCols) {
        __syncthreads();
        load_f32<S, HD>(Ks, HD + 1, base + C + k0 * C3, C3, kCols, T - k0);
        load_f32<S, HD>(Vs, HD + 1, base + 2 * size_t(C) + k0 * C3, C3, kCols, T - k0);
        __syncthreads();
        float s[kR] = {}, dp[kR] = {};
#pragma unroll 8
        for (int d = 0; d < HD; ++d) {
            const float kd = Ks[lane * (HD + 1) + d], vd = Vs[lane * (HD + 1) + d];
            for (int i = 0; i < kR; ++i) {
                s[i] += Qs[(w * kR + i) * HD + d] * kd;
                dp[i] += Gs[(w * kR + i) * HD + d] * vd;
            }
        }
        for (int i = 0; i < kR; ++i) {
            const int key = k0 + lane;
            const float p = key <= q0 + w * kR + i && key >= lo[i] ? expf(s[i] * scale - lr[i]) : 0.0f;
            Ps[(w * kR + i) * kCols + lane] = p * (dp[i] - dr[i]) * scale;
        }
        __syncwarp();
        for (int j = 0; j < kCols; ++j)
            for (int c = 0; c < NC; ++c) {
                const float kv = Ks[j * (HD + 1) + lane + 32 * c];
                for (int i = 0; i < kR; ++i) dq[i][c] += Ps[(w * kR + i) * kCols + j] * kv;
            }
    }
    for (int i = 0; i < kR; ++i) {
        const int q = q0 + w * kR + i;
        if (q >= T) continue;
        S * drow = dqkv + (size_t(b) * T + q) * C3 + size_t(h) * HD;
        for (int c = 0; c < NC; ++c) drow[lane + 32 * c] = st<S>(dq[i][c]);
    }
}

// Backward dK, dV: rows are keys, tile columns queries. Shared: K, V [16][HD]; Q, dO [32][HD+1];
// lse, D [32]; P, dS [16][32]: 54 KiB at HD = 128.
template <class S, int HD>
__global__ void __launch_bounds__(kThreads)
flash_dkdv_simt(S * dqkv, const float * D, const S * dout, const S * qkv, const float * lse, int T, int C, int NH,
                const int32_t * doc) {
    constexpr int NC = HD / 32;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    float * Ks = reinterpret_cast<float *>(flash_smem);
    float * Vs = Ks + kRows * HD;
    float * Qs = Vs + kRows * HD;
    float * Gs = Qs + kCols * (HD + 1);
    float * Ls = Gs + kCols * (HD + 1);
    float * Ds = Ls + kCols;
    float * Ps = Ds + kCols;
    float * Ss = Ps + kRows * kCols;
    const int k0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;  // longest rows first
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t C3 = size_t(3) * C, bh = size_t(b) * NH + h;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * HD;
    const S * gbase = dout + size_t(b) * T * C + size_t(h) * HD;
    const float scale = 1.0f / sqrtf(float(HD));
    load_f32<S, HD>(Ks, HD, base + C + k0 * C3, C3, kRows, T - k0);
    load_f32<S, HD>(Vs, HD, base + 2 * size_t(C) + k0 * C3, C3, kRows, T - k0);
    float dk[kR][NC] = {}, dv[kR][NC] = {};
    int end[kR];   // each key's queries end at its document's end (T without documents)
    for (int i = 0; i < kR; ++i) end[i] = doc_end(doc, b, T, k0 + w * kR + i);
    const int klast = min(k0 + kRows, T) - 1;
    for (int q0 = k0 / kCols * kCols; q0 < T; q0 += kCols) {
        if (doc_of(doc, b, T, q0) > klast) break;   // uniform over the block
        __syncthreads();
        load_f32<S, HD>(Qs, HD + 1, base + q0 * C3, C3, kCols, T - q0);
        load_f32<S, HD>(Gs, HD + 1, gbase + size_t(q0) * C, size_t(C), kCols, T - q0);
        if (threadIdx.x < kCols) {
            const int q = q0 + threadIdx.x;
            Ls[threadIdx.x] = q < T ? lse[bh * T + q] : 0.0f;
            Ds[threadIdx.x] = q < T ? D[bh * T + q] : 0.0f;
        }
        __syncthreads();
        float s[kR] = {}, dp[kR] = {};
#pragma unroll 8
        for (int d = 0; d < HD; ++d) {
            const float qd = Qs[lane * (HD + 1) + d], gd = Gs[lane * (HD + 1) + d];
            for (int i = 0; i < kR; ++i) {
                s[i] += Ks[(w * kR + i) * HD + d] * qd;
                dp[i] += Vs[(w * kR + i) * HD + d] * gd;
            }
        }
        const int q = q0 + lane;
        for (int i = 0; i < kR; ++i) {
            const bool on = q >= k0 + w * kR + i && q < end[i];
            const float p = on ? expf(s[i] * scale - Ls[lane]) : 0.0f;
            Ps[(w * kR + i) * kCols + lane] = p;
            Ss[(w * kR + i) * kCols + lane] = p * (dp[i] - Ds[lane]) * scale;
        }
        __syncwarp();
        for (int j = 0; j < kCols; ++j)
            for (int c = 0; c < NC; ++c) {
                const float qv = Qs[j * (HD + 1) + lane + 32 * c], gv = Gs[j * (HD + 1) + lane + 32 * c];
                for (int i = 0; i < kR; ++i) {
                    dv[i][c] += Ps[(w * kR + i) * kCols + j] * gv;
                    dk[i][c] += Ss[(w * kR + i) * kCols + j] * qv;
                }
            }
    }
    for (int i = 0; i < kR; ++i) {
        const int key = k0 + w * kR + i;
        if (key >= T) continue;
        S * row = dqkv + (size_t(b) * T + key) * C3 + size_t(h) * HD;
        for (int c = 0; c < NC; ++c) {
            row[C + lane + 32 * c] = st<S>(dk[i][c]);
            row[2 * size_t(C) + lane + 32 * c] = st<S>(dv[i][c]);
        }
    }
}

size_t simt_smem(int kind, int HD) {  // kind 0 forward, 1 dQ, 2 dKdV; in bytes
    const int a = kRows * HD, bb = kCols * (HD + 1);
    const int n = kind == 0 ? a + bb + kCols * HD + kRows * kCols
                : kind == 1 ? 2 * a + 2 * bb + kRows * kCols
                            : 2 * a + 2 * bb + 2 * kCols + 2 * kRows * kCols;
    return size_t(n) * sizeof(float);
}

// ---------------------------------------------------------------------------------------------
// Launchers: the mma kernels where they apply, the simt kernels otherwise.

template <class F> void with_hd(int hd, F && f) {
    switch (hd) {
        case 32: f(std::integral_constant<int, 32>{}); return;
        case 64: f(std::integral_constant<int, 64>{}); return;
        case 96: f(std::integral_constant<int, 96>{}); return;
        case 128: f(std::integral_constant<int, 128>{}); return;
        default: MF_ASSERT(false && "flash attention supports head dims 32, 64, 96 and 128");
    }
}

template <class S, int HD> constexpr bool kMma = !std::is_same_v<S, float> && (HD == 64 || HD == 128);

bool aligned16(const void * p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int tiles(int T, int n) { return (T + n - 1) / n; }

}  // namespace

void flash_attention_fwd(cudaStream_t s, Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start) {
    MF_ASSERT(out.dtype == qkv.dtype && lse.dtype == DType::f32);
    const int B = int(qkv.dim(0)), T = int(qkv.dim(1)), C = int(out.cols());
    MF_ASSERT(NH > 0 && C % NH == 0 && qkv.cols() == 3 * int64_t(C) && lse.numel() == int64_t(B) * NH * T);
    const int32_t * doc = docs(doc_start, int64_t(B) * T);
    if (int64_t(B) * T == 0) return;
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        with_hd(C / NH, [&](auto hdc) {
            constexpr int HD = decltype(hdc)::value;
            if constexpr (kMma<S, HD>) {
                if (aligned16(qkv.data) && aligned16(out.data)) {
                    const size_t sm = size_t(3) * kBlk * (HD + 8) * sizeof(S);
                    allow_smem(flash_fwd_mma<S, HD>, sm);
                    flash_fwd_mma<S, HD><<<dim3(tiles(T, kBlk), NH, B), kThreads, sm, s>>>(ptr<S>(out), lse.f32(),
                                                                                           ptr<S>(qkv), T, C, NH, doc);
                    MF_CUDA_LAUNCHED();
                    return;
                }
            }
            const size_t sm = simt_smem(0, HD);
            allow_smem(flash_fwd_simt<S, HD>, sm);
            flash_fwd_simt<S, HD><<<dim3(tiles(T, kRows), NH, B), kThreads, sm, s>>>(ptr<S>(out), lse.f32(),
                                                                                     ptr<S>(qkv), T, C, NH, doc);
            MF_CUDA_LAUNCHED();
        });
    });
}

void flash_attention_bwd(cudaStream_t s, Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv,
                         Tensor lse, int NH, Tensor doc_start) {
    MF_ASSERT(dqkv.dtype == qkv.dtype && dout.dtype == qkv.dtype && out.dtype == qkv.dtype && lse.dtype == DType::f32);
    const int B = int(qkv.dim(0)), T = int(qkv.dim(1)), C = int(dout.cols());
    MF_ASSERT(NH > 0 && C % NH == 0 && qkv.cols() == 3 * int64_t(C) && dqkv.numel() == qkv.numel());
    MF_ASSERT(lse.numel() == int64_t(B) * NH * T && out.numel() == dout.numel());
    MF_ASSERT(scratch.nbytes() >= cuda_flash_attention_workspace(B, T, C, NH));
    const int32_t * doc = docs(doc_start, int64_t(B) * T);
    if (int64_t(B) * T == 0) return;
    float * D = static_cast<float *>(scratch.data);  // [B, NH, T]
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        flash_d_kernel<S><<<grid_for(int64_t(B) * NH * T * 32, 256), 256, 0, s>>>(D, ptr<S>(dout), ptr<S>(out), B, T,
                                                                                  C, NH);
        MF_CUDA_LAUNCHED();
        with_hd(C / NH, [&](auto hdc) {
            constexpr int HD = decltype(hdc)::value;
            const auto args = [&](auto kernel, int rows, size_t sm) {
                allow_smem(kernel, sm);
                kernel<<<dim3(tiles(T, rows), NH, B), kThreads, sm, s>>>(ptr<S>(dqkv), D, ptr<S>(dout), ptr<S>(qkv),
                                                                         lse.f32(), T, C, NH, doc);
                MF_CUDA_LAUNCHED();
            };
            if constexpr (kMma<S, HD>) {
                if (aligned16(qkv.data) && aligned16(dout.data) && aligned16(dqkv.data)) {
                    constexpr int LD = HD + 8, BT = HD == 128 ? 32 : 64;
                    const size_t tiles_bytes = size_t(2) * (kBlk + BT) * LD * sizeof(S);
                    args(flash_dq_mma<S, HD>, kBlk, tiles_bytes);
                    args(flash_dkdv_mma<S, HD>, kBlk, tiles_bytes + 2 * BT * sizeof(float));
                    return;
                }
            }
            args(flash_dq_simt<S, HD>, kRows, simt_smem(1, HD));
            args(flash_dkdv_simt<S, HD>, kRows, simt_smem(2, HD));
        });
    });
}

}  // namespace memfit::cuda
