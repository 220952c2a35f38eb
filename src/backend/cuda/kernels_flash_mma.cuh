// The tensor-core kernels of flash attention (bf16/f16, head dims 64 and 128): included by
// kernels_flash.cu only, which describes the algorithm and launches them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace memfit::cuda::flash {

constexpr int kThreads = 128;  // 4 warps per block, in every flash kernel
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// mma kernels (S = __nv_bfloat16 or __half). Fragments of mma.m16n8k16 (PTX ISA), with
// g = lane / 4 and c = lane % 4: A (16x16) regs {(g, 2c..2c+1), (g+8, 2c..), (g, 2c+8..),
// (g+8, 2c+8..)}; B (16x8) regs {(k = 2c..2c+1, n = g), (k = 2c+8.., n = g)}; C (16x8) floats
// {(g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)}. The lower index sits in the lower 16 bits.

template <class S>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef MEMFIT_CUDA_EMU   // the CPU emulator of tests/cuda_emu
    ::emu::mma_m16n8k16(std::is_same_v<S, __nv_bfloat16>, d, a, b0, b1);
#else
    if constexpr (std::is_same_v<S, __nv_bfloat16>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <class S> __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo)), h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
    return l | (h << 16);
}
template <> __device__ __forceinline__ uint32_t pack<__half>(float lo, float hi) {
    return uint32_t(__half_as_ushort(__float2half_rn(lo))) | (uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16);
}

template <int LD> struct Frag {
    int g, c;
    // A fragment of rows r0.., columns k0.. of a row-major tile.
    template <class S> __device__ __forceinline__ void a(uint32_t (&f)[4], const S * X, int r0, int k0) const {
        const S * p = X + (r0 + g) * LD + k0 + 2 * c;
        f[0] = *reinterpret_cast<const uint32_t *>(p);
        f[1] = *reinterpret_cast<const uint32_t *>(p + 8 * LD);
        f[2] = *reinterpret_cast<const uint32_t *>(p + 8);
        f[3] = *reinterpret_cast<const uint32_t *>(p + 8 * LD + 8);
    }
    // B = Y^T for a row-major Y [n][k]: columns n0..n0+7, rows k0..k0+15 of B.
    template <class S>
    __device__ __forceinline__ void bt(uint32_t & b0, uint32_t & b1, const S * Y, int n0, int k0) const {
        const S * p = Y + (n0 + g) * LD + k0 + 2 * c;
        b0 = *reinterpret_cast<const uint32_t *>(p);
        b1 = *reinterpret_cast<const uint32_t *>(p + 8);
    }
    // B = Y for a row-major Y [k][n].
    template <class S>
    __device__ __forceinline__ void bn(uint32_t & b0, uint32_t & b1, const S * Y, int k0, int n0) const {
        const uint16_t * p = reinterpret_cast<const uint16_t *>(Y) + (k0 + 2 * c) * LD + n0 + g;
        b0 = uint32_t(p[0]) | (uint32_t(p[LD]) << 16);
        b1 = uint32_t(p[8 * LD]) | (uint32_t(p[9 * LD]) << 16);
    }
};

// A tile of R rows x HD into shared memory (row stride LD), 16 bytes per load; zero rows past nvalid.
template <int HD, int LD, int R, class S>
__device__ __forceinline__ void load_tile(S * dst, const S * src, size_t lds, int nvalid) {
    constexpr int V = HD / 8;
    for (int i = threadIdx.x; i < R * V; i += kThreads) {
        const int r = i / V, d = i % V * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nvalid) v = *reinterpret_cast<const uint4 *>(src + size_t(r) * lds + d);
        *reinterpret_cast<uint4 *>(dst + r * LD + d) = v;
    }
}

// Rounds rows g and g+8 of an accumulator [HD/8][4], times mul0 and mul1, into dst rows row0 and
// row0+8 (row stride lds); rows from T on are not stored.
template <int HD, class S>
__device__ __forceinline__ void store_acc(S * dst, size_t lds, const float (&acc)[HD / 8][4], int row0, int T, int c,
                                          float mul0 = 1.0f, float mul1 = 1.0f) {
    for (int nt = 0; nt < HD / 8; ++nt) {
        const int col = nt * 8 + 2 * c;
        if (row0 < T)
            *reinterpret_cast<uint32_t *>(dst + size_t(row0) * lds + col) =
                pack<S>(acc[nt][0] * mul0, acc[nt][1] * mul0);
        if (row0 + 8 < T)
            *reinterpret_cast<uint32_t *>(dst + size_t(row0 + 8) * lds + col) =
                pack<S>(acc[nt][2] * mul1, acc[nt][3] * mul1);
    }
}

// The A fragment of P (or dS) for k-step kk, from the accumulator of a 16 x (16*steps) product.
template <class S, int N> __device__ __forceinline__ void acc_to_a(uint32_t (&f)[4], const float (&s)[N][4], int kk) {
    f[0] = pack<S>(s[2 * kk][0], s[2 * kk][1]);
    f[1] = pack<S>(s[2 * kk][2], s[2 * kk][3]);
    f[2] = pack<S>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    f[3] = pack<S>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

constexpr int kBlk = 64;  // rows per block (4 warps x 16)

// The document start of query row q of batch b's row (doc: [B, T] or null: 0), 0 past T.
__device__ __forceinline__ int doc_of(const int32_t * doc, int b, int T, int q) {
    return doc && q < T ? doc[size_t(b) * T + q] : 0;
}

// Forward: 64 queries per block, key tiles of 64. Shared: Q, K, V [64][HD+8] (27 KiB at HD 64,
// 51 KiB at 128). Q fragments stay in registers; S, P and O in fp32 accumulators. Packed
// documents: key tiles from the one holding the first query's document start (the earliest of
// the block's: doc_start is non-decreasing); keys before a row's document start are masked, and a
// row that has seen no key yet (running max -inf) takes the tile as a no-op.
template <class S, int HD>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_mma(S * out, float * lse, const S * qkv, int T, int C, int NH, const int32_t * doc) {
    constexpr int LD = HD + 8, KS = HD / 16, NT = kBlk / 8, OT = HD / 8;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    S * Qs = reinterpret_cast<S *>(flash_smem);
    S * Ks = Qs + kBlk * LD;
    S * Vs = Ks + kBlk * LD;
    const int qt = gridDim.x - 1 - blockIdx.x, q0 = qt * kBlk, h = blockIdx.y, b = blockIdx.z;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Frag<LD> fr{lane / 4, lane % 4};
    const size_t C3 = size_t(3) * C;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * HD;
    const float sl2 = kLog2e / sqrtf(float(HD));
    load_tile<HD, LD, kBlk>(Qs, base + q0 * C3, C3, T - q0);
    __syncthreads();
    uint32_t qf[KS][4];
    for (int kk = 0; kk < KS; ++kk) fr.a(qf[kk], Qs, w * 16, kk * 16);
    float o[OT][4] = {}, m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int row0 = q0 + w * 16 + fr.g;
    for (int kt = doc_of(doc, b, T, q0) / kBlk; kt <= qt; ++kt) {
        const int k0 = kt * kBlk;
        __syncthreads();
        load_tile<HD, LD, kBlk>(Ks, base + C + k0 * C3, C3, T - k0);
        load_tile<HD, LD, kBlk>(Vs, base + 2 * size_t(C) + k0 * C3, C3, T - k0);
        __syncthreads();
        // This lane's columns (of 64) nt * 8 + (e & 1) that rows g and g+8 see: from f0, f1 (their
        // documents' starts) to z0, z1 (the diagonal on the last tile). Read per tile, in this
        // form, the document starts keep the registers of the kernel without them.
        const int c0 = k0 + 2 * fr.c;
        const int f0 = doc_of(doc, b, T, row0) - c0, f1 = doc_of(doc, b, T, row0 + 8) - c0;
        const int z0 = kt == qt ? row0 - c0 : kBlk, z1 = kt == qt ? row0 + 8 - c0 : kBlk;
        float s[NT][4] = {};
        for (int kk = 0; kk < KS; ++kk)
            for (int nt = 0; nt < NT; ++nt) {
                uint32_t b0, b1;
                fr.bt(b0, b1, Ks, nt * 8, kk * 16);
                mma<S>(s[nt], qf[kk], b0, b1);
            }
        float mx0 = -INFINITY, mx1 = -INFINITY;
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) {
                const int col = nt * 8 + (e & 1);
                float x = s[nt][e] * sl2;
                if (col > (e < 2 ? z0 : z1) || col < (e < 2 ? f0 : f1)) x = -INFINITY;
                s[nt][e] = x;
                if (e < 2) mx0 = fmaxf(mx0, x); else mx1 = fmaxf(mx1, x);
            }
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {  // the 4 lanes of a quad share rows g and g+8
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        // -inf only for a row with no key of its document yet (never without documents: key 0
        // is in tile 0); it subtracts 0 instead, so that p = 0, alpha = 0 (o and l are 0).
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
        const float a0 = exp2f(m0 - u0), a1 = exp2f(m1 - u1);
        m0 = n0, m1 = n1;
        float sum0 = 0.0f, sum1 = 0.0f;
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[nt][e] - (e < 2 ? u0 : u1));
                s[nt][e] = p;
                if (e < 2) sum0 += p; else sum1 += p;
            }
        l0 = l0 * a0 + sum0;  // partial over this lane's columns; the quad sums at the end
        l1 = l1 * a1 + sum1;
        for (int nt = 0; nt < OT; ++nt) o[nt][0] *= a0, o[nt][1] *= a0, o[nt][2] *= a1, o[nt][3] *= a1;
        for (int kk = 0; kk < kBlk / 16; ++kk) {
            uint32_t pf[4];
            acc_to_a<S>(pf, s, kk);
            for (int nt = 0; nt < OT; ++nt) {
                uint32_t b0, b1;
                fr.bn(b0, b1, Vs, kk * 16, nt * 8);
                mma<S>(o[nt], pf, b0, b1);
            }
        }
    }
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    store_acc<HD>(out + size_t(b) * T * C + size_t(h) * HD, size_t(C), o, row0, T, fr.c, 1.0f / l0, 1.0f / l1);
    float * lrow = lse + (size_t(b) * NH + h) * T;
    if (fr.c == 0 && row0 < T) lrow[row0] = (m0 + log2f(l0)) * kLn2;
    if (fr.c == 0 && row0 + 8 < T) lrow[row0 + 8] = (m1 + log2f(l1)) * kLn2;
}

// Backward dQ: 64 queries per block, key tiles of BC (64, or 32 at HD 128 to bound registers).
// Shared: Q, dO [64][HD+8]; K, V [BC][HD+8] (36 KiB at HD 64, 51 KiB at 128). Packed documents:
// key tiles from the first query's document start's, keys before a row's document masked.
template <class S, int HD>
__global__ void __launch_bounds__(kThreads)
flash_dq_mma(S * dqkv, const float * D, const S * dout, const S * qkv, const float * lse, int T, int C, int NH,
             const int32_t * doc) {
    constexpr int LD = HD + 8, KS = HD / 16, BC = HD == 128 ? 32 : 64, NT = BC / 8, OT = HD / 8;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    S * Qs = reinterpret_cast<S *>(flash_smem);
    S * Gs = Qs + kBlk * LD;
    S * Ks = Gs + kBlk * LD;
    S * Vs = Ks + BC * LD;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBlk, h = blockIdx.y, b = blockIdx.z;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Frag<LD> fr{lane / 4, lane % 4};
    const size_t C3 = size_t(3) * C, bh = size_t(b) * NH + h;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * HD;
    const float scale = 1.0f / sqrtf(float(HD)), sl2 = scale * kLog2e;
    load_tile<HD, LD, kBlk>(Qs, base + q0 * C3, C3, T - q0);
    load_tile<HD, LD, kBlk>(Gs, dout + (size_t(b) * T + q0) * C + size_t(h) * HD, size_t(C), T - q0);
    const int row0 = q0 + w * 16 + fr.g;
    const float L0 = row0 < T ? lse[bh * T + row0] * kLog2e : 0.0f, D0 = row0 < T ? D[bh * T + row0] : 0.0f;
    const float L1 = row0 + 8 < T ? lse[bh * T + row0 + 8] * kLog2e : 0.0f;
    const float D1 = row0 + 8 < T ? D[bh * T + row0 + 8] : 0.0f;
    const int lo0 = doc_of(doc, b, T, row0), lo1 = doc_of(doc, b, T, row0 + 8);
    float dq[OT][4] = {};
    const int qlast = min(q0 + kBlk - 1, T - 1);
    for (int k0 = doc_of(doc, b, T, q0) / BC * BC; k0 <= qlast; k0 += BC) {
        __syncthreads();
        load_tile<HD, LD, BC>(Ks, base + C + k0 * C3, C3, T - k0);
        load_tile<HD, LD, BC>(Vs, base + 2 * size_t(C) + k0 * C3, C3, T - k0);
        __syncthreads();
        float s[NT][4] = {}, dp[NT][4] = {};
        for (int kk = 0; kk < KS; ++kk) {
            uint32_t aq[4], ag[4], b0, b1;
            fr.a(aq, Qs, w * 16, kk * 16);
            fr.a(ag, Gs, w * 16, kk * 16);
            for (int nt = 0; nt < NT; ++nt) {
                fr.bt(b0, b1, Ks, nt * 8, kk * 16);
                mma<S>(s[nt], aq, b0, b1);
                fr.bt(b0, b1, Vs, nt * 8, kk * 16);
                mma<S>(dp[nt], ag, b0, b1);
            }
        }
        const bool diag = k0 + BC - 1 > q0;  // some key of the tile is after some query of the block
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) {
                float p = exp2f(s[nt][e] * sl2 - (e < 2 ? L0 : L1));
                const int key = k0 + nt * 8 + 2 * fr.c + (e & 1);
                if ((diag && key > row0 + (e >> 1) * 8) || key < (e < 2 ? lo0 : lo1)) p = 0.0f;
                s[nt][e] = p * (dp[nt][e] - (e < 2 ? D0 : D1)) * scale;  // dS
            }
        for (int kk = 0; kk < BC / 16; ++kk) {
            uint32_t af[4], b0, b1;
            acc_to_a<S>(af, s, kk);
            for (int nt = 0; nt < OT; ++nt) {
                fr.bn(b0, b1, Ks, kk * 16, nt * 8);
                mma<S>(dq[nt], af, b0, b1);
            }
        }
    }
    store_acc<HD>(dqkv + size_t(b) * T * C3 + size_t(h) * HD, C3, dq, row0, T, fr.c);
}

// Backward dK, dV: 64 keys per block, query tiles of BQ (64, or 32 at HD 128) from the
// diagonal on. Shared: K, V [64][HD+8]; Q, dO [BQ][HD+8]; lse, D [BQ] fp32. Packed documents: a
// key is seen by the queries from it to its document's end (doc_end); the query tiles stop at the
// first whose first query's document starts after the block's last key (it and every later one
// see none: doc_start is non-decreasing).
template <class S, int HD>
__global__ void __launch_bounds__(kThreads)
flash_dkdv_mma(S * dqkv, const float * D, const S * dout, const S * qkv, const float * lse, int T, int C, int NH,
               const int32_t * doc) {
    constexpr int LD = HD + 8, KS = HD / 16, BQ = HD == 128 ? 32 : 64, NT = BQ / 8, OT = HD / 8;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    S * Ks = reinterpret_cast<S *>(flash_smem);
    S * Vs = Ks + kBlk * LD;
    S * Qs = Vs + kBlk * LD;
    S * Gs = Qs + BQ * LD;
    float * Ls = reinterpret_cast<float *>(Gs + BQ * LD);
    float * Ds = Ls + BQ;
    const int k0 = blockIdx.x * kBlk, h = blockIdx.y, b = blockIdx.z;  // longest rows first
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Frag<LD> fr{lane / 4, lane % 4};
    const size_t C3 = size_t(3) * C, bh = size_t(b) * NH + h;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * HD;
    const float scale = 1.0f / sqrtf(float(HD)), sl2 = scale * kLog2e;
    load_tile<HD, LD, kBlk>(Ks, base + C + k0 * C3, C3, T - k0);
    load_tile<HD, LD, kBlk>(Vs, base + 2 * size_t(C) + k0 * C3, C3, T - k0);
    const int key0 = k0 + w * 16 + fr.g;
    const int end0 = doc_end(doc, b, T, key0), end1 = doc_end(doc, b, T, key0 + 8);   // T without documents
    float dk[OT][4] = {}, dv[OT][4] = {};
    const int klast = min(k0 + kBlk, T) - 1;
    for (int q0 = k0; q0 < T; q0 += BQ) {
        if (doc_of(doc, b, T, q0) > klast) break;   // uniform over the block
        __syncthreads();
        load_tile<HD, LD, BQ>(Qs, base + q0 * C3, C3, T - q0);
        load_tile<HD, LD, BQ>(Gs, dout + (size_t(b) * T + q0) * C + size_t(h) * HD, size_t(C), T - q0);
        if (threadIdx.x < BQ) {
            const int q = q0 + threadIdx.x;
            Ls[threadIdx.x] = q < T ? lse[bh * T + q] * kLog2e : 0.0f;
            Ds[threadIdx.x] = q < T ? D[bh * T + q] : 0.0f;
        }
        __syncthreads();
        float s[NT][4] = {}, dp[NT][4] = {};
        for (int kk = 0; kk < KS; ++kk) {
            uint32_t ak[4], av[4], b0, b1;
            fr.a(ak, Ks, w * 16, kk * 16);
            fr.a(av, Vs, w * 16, kk * 16);
            for (int nt = 0; nt < NT; ++nt) {
                fr.bt(b0, b1, Qs, nt * 8, kk * 16);
                mma<S>(s[nt], ak, b0, b1);
                fr.bt(b0, b1, Gs, nt * 8, kk * 16);
                mma<S>(dp[nt], av, b0, b1);
            }
        }
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) {  // rows: keys; columns: queries
                const int qi = nt * 8 + 2 * fr.c + (e & 1), q = q0 + qi;
                const bool on = q >= key0 + (e >> 1) * 8 && q < (e < 2 ? end0 : end1);
                const float p = on ? exp2f(s[nt][e] * sl2 - Ls[qi]) : 0.0f;
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - Ds[qi]) * scale;  // dS^T
            }
        for (int kk = 0; kk < BQ / 16; ++kk) {
            uint32_t ap[4], as[4], b0, b1;
            acc_to_a<S>(ap, s, kk);
            acc_to_a<S>(as, dp, kk);
            for (int nt = 0; nt < OT; ++nt) {
                fr.bn(b0, b1, Gs, kk * 16, nt * 8);
                mma<S>(dv[nt], ap, b0, b1);
                fr.bn(b0, b1, Qs, kk * 16, nt * 8);
                mma<S>(dk[nt], as, b0, b1);
            }
        }
    }
    S * drow = dqkv + size_t(b) * T * C3 + size_t(h) * HD;
    store_acc<HD>(drow + C, C3, dk, key0, T, fr.c);
    store_acc<HD>(drow + 2 * size_t(C), C3, dv, key0, T, fr.c);
}

}  // namespace memfit::cuda::flash
