// Internal to the flash-attention kernels (kernels_flash.cpp, kernels_flash_lowp.cpp): tile
// sizes, the vectorisable exp, the small register-blocked tile gemm, and the packing of K, V, Q
// and dout tiles into contiguous fp32 buffers (converting bf16/f16 rows as they are packed).
// See kernels_flash.cpp for the algorithm.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "backend/cpu/convert.h"
#include "backend/cpu/exp_poly.h"
#include "core/dtype.h"

namespace memfit::cpu::flash {

constexpr int kTile = 64;  // queries per query tile and keys per key tile
// [kTile x hs] buffers per (b, h) in the backward's scratch, at most: fp32 uses five of the six
// it is given, the bf16/f16 backward six in two passes and seven in one (kernels_flash_lowp.cpp).
constexpr int kTileSlots = 7;
// The bf16/f16 backward runs in one pass, holding a head's dQ in fp32 (T x hs floats per (b, h)
// in the scratch), up to this many query tiles (1024 positions); in two passes above, where that
// accumulator would outgrow the rest of the scratch.
constexpr int kOnePassTiles = 16;
constexpr int kMR = 6;     // rows of a register block in tile_gemm

inline int tiles(int T) { return (T + kTile - 1) / kTile; }
inline bool lowp_one_pass(int T) { return tiles(T) <= kOnePassTiles; }

inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Scratch floats per (b, h) pair in the backward: P and dS [kTile x kTile], then the
// [kTile x hs] tile buffers: six (fp32, and the two-pass low-precision backward), or seven and
// the fp32 dQ accumulator [T x hs] (`one_pass`: the one-pass low-precision backward). The
// scratch holds B*NH*T floats of D (rounded up to 16) first.
inline size_t backward_pair_floats(int hs, int T, bool one_pass) {
    const size_t tile = static_cast<size_t>(hs) * kTile;
    return 2 * static_cast<size_t>(kTile) * kTile +
           (one_pass ? kTileSlots * tile + static_cast<size_t>(T) * hs : (kTileSlots - 1) * tile);
}

// One (b, h) pair of the backward: its q, k, v columns of qkv and dqkv (row stride 3C), its
// columns of out and dout (row stride C), its lse and D rows, and its tile buffers.
template <class S>
struct BackwardPair {
    const S * q;
    const S * k;
    const S * v;
    S * dq;
    S * dk;
    S * dv;
    const S * dout;
    const S * out;
    const float * lse;
    float * D;
    float * P;                 // [query][key]
    float * dS;                // [query][key]
    float * slot[kTileSlots];  // [kTile x hs] each; the kernels name their uses
    float * dq_acc;            // [T x hs]: the one-pass low-precision backward's dQ

    BackwardPair(int task, S * dqkv, float * scratch, const S * dout_, const S * out_, const S * qkv,
                 const float * lse_, int B, int T, int C, int NH, bool one_pass = false) {
        const int h = task % NH, b = task / NH, hs = C / NH;
        const size_t C3 = static_cast<size_t>(3) * C;
        const size_t head_off = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        const size_t row_off = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
        q = qkv + head_off;
        k = q + C;
        v = q + 2 * static_cast<size_t>(C);
        dq = dqkv + head_off;
        dk = dq + C;
        dv = dq + 2 * static_cast<size_t>(C);
        dout = dout_ + row_off;
        out = out_ + row_off;
        lse = lse_ + static_cast<size_t>(task) * T;
        D = scratch + static_cast<size_t>(task) * T;
        const size_t tasks = static_cast<size_t>(B) * NH;
        P = scratch + round_up(tasks * T, 16) + static_cast<size_t>(task) * backward_pair_floats(hs, T, one_pass);
        dS = P + kTile * kTile;
        slot[0] = dS + kTile * kTile;
        // The last slot and dq_acc only where the pair's floats hold them (the one-pass backward).
        for (int i = 1; i < kTileSlots; ++i)
            slot[i] = i < kTileSlots - 1 || one_pass ? slot[i - 1] + static_cast<size_t>(hs) * kTile : nullptr;
        dq_acc = one_pass ? slot[kTileSlots - 1] + static_cast<size_t>(hs) * kTile : nullptr;
    }
};

// Which part of a diagonal (causal) tile a product needs, with rows m and the reduction index
// k (or the columns n) counted from the same origin.
enum class Causal {
    kNone,   // full tile
    kKUpTo,  // A(m,k) is zero for k > m: the reduction stops at the block's last row
    kKFrom,  // A(m,k) is zero for k < m: the reduction starts at the block's first row
    kNUpTo,  // only C(m,n) with n <= m are needed (others may be left unwritten)
};

// Eight floats, one AVX register, and sixteen, one AVX-512 register. GCC/Clang vector
// extensions rather than `omp simd` loops: with those, GCC keeps gemm_block's accumulators in
// memory between its three loops and reaches about 3/4 of the speed of this version. Never
// passed by value (that changes the ABI, and warns, where AVX is not enabled).
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
// The widest vector the target has registers for: a register block is two of them wide (kNR
// columns). A target without AVX-512 would split a vf16 into two halves and run out of
// registers for the block's 12 accumulators, so it keeps vf8. The order of every sum is the
// same at either width (one lane per column), so the results are too.
#if defined(__AVX512F__)
typedef vf16 vwide;
#else
typedef vf8 vwide;
#endif
constexpr int kWide = static_cast<int>(sizeof(vwide) / sizeof(float));
constexpr int kNR = 2 * kWide;  // columns of a register block in tile_gemm

// One register block: C[MR x W*NV] (+)= sum_{k in [k0,k1)} A(m,k) B(k,:), W the lanes of V.
template <int MR, int NV, class V>
inline void gemm_block(float * c, size_t ldc, const float * a, size_t sam, size_t sak,
                       const float * b, size_t ldb, int k0, int k1, bool accumulate) {
    constexpr int W = static_cast<int>(sizeof(V) / sizeof(float));
    V acc[MR][NV];
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < NV; ++v) {
            acc[m][v] = V{};
            if (accumulate) std::memcpy(&acc[m][v], c + m * ldc + W * v, sizeof(V));
        }
    for (int k = k0; k < k1; ++k) {
        V bv[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + k * ldb + W * v, sizeof(V));
        const float * acol = a + k * sak;
        for (int m = 0; m < MR; ++m) {
            const float av = acol[m * sam];
            for (int v = 0; v < NV; ++v) acc[m][v] += av * bv[v];
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < NV; ++v) std::memcpy(c + m * ldc + W * v, &acc[m][v], sizeof(V));
}

// C[M x N] (+)= A[M x K] B[K x N] with A(m,k) = a[m*sam + k*sak], B row-major (row stride
// ldb), C row-major (row stride ldc). Each C element is summed over k in increasing order.
inline void tile_gemm(float * c, size_t ldc, const float * a, size_t sam, size_t sak, const float * b,
               size_t ldb, int M, int N, int K, bool accumulate, Causal causal) {
    auto k_range = [&](int m0, int rows, int & k0, int & k1) {
        k0 = 0;
        k1 = K;
        if (causal == Causal::kKUpTo) k1 = std::min(K, m0 + rows);
        if (causal == Causal::kKFrom) k0 = std::min(K, m0);
    };
    // Rows of one column block of NV vectors V: blocks of kMR rows, then 4, 2, 1 (64 = 10*6 + 4).
    auto column_block = [&]<int NV, class V>(int n0) {
        int m0 = 0;
        auto rows = [&]<int R>() {
            for (; m0 + R <= M; m0 += R) {
                if (causal == Causal::kNUpTo && m0 + R <= n0) continue;
                int k0 = 0, k1 = 0;
                k_range(m0, R, k0, k1);
                gemm_block<R, NV, V>(c + m0 * ldc + n0, ldc, a + m0 * sam, sam, sak, b + n0, ldb,
                                     k0, k1, accumulate);
            }
        };
        rows.template operator()<kMR>();
        rows.template operator()<4>();
        rows.template operator()<2>();
        rows.template operator()<1>();
    };
    int n0 = 0;
    for (; n0 + kNR <= N; n0 += kNR) column_block.template operator()<2, vwide>(n0);
    for (; n0 + kWide <= N; n0 += kWide) column_block.template operator()<1, vwide>(n0);
    for (; n0 + 8 <= N; n0 += 8) column_block.template operator()<1, vf8>(n0);
    if (n0 < N) {  // the last (fewer than 8) columns, one row at a time
        const int nt = N - n0;
        for (int m = 0; m < M; ++m) {
            int k0 = 0, k1 = 0;
            k_range(m, 1, k0, k1);
            float * crow = c + m * ldc + n0;
            if (!accumulate)
                for (int n = 0; n < nt; ++n) crow[n] = 0.0f;
            for (int k = k0; k < k1; ++k) {
                const float av = a[m * sam + k * sak];
                const float * brow = b + k * ldb + n0;
                for (int n = 0; n < nt; ++n) crow[n] += av * brow[n];
            }
        }
    }
}

#if defined(__AVX__)
// 8 floats from 8 elements of S (converted).
template <class S>
inline __m256 load8(const S * p) {
    if constexpr (std::is_same_v<S, float>) {
        return _mm256_loadu_ps(p);
    } else {
        alignas(32) float f[8];
        to_f32_row(f, p, 8);
        return _mm256_load_ps(f);
    }
}

// dst[d * ldd + r] = src[r * lds + d] for an 8 x 8 block, in registers (src converted to float).
template <class S>
inline void transpose8x8(float * dst, size_t ldd, const S * src, size_t lds) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = load8(src + i * lds);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);      // column 0 | 4 of four rows
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);  // column 1 | 5
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);  // column 2 | 6
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);  // column 3 | 7
    }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

// dst[d * kTile + r] = src[r * lds + d]: rows r < rows, d < cols (converted to float). 8 x 8
// blocks in registers where AVX is available (about 3x faster than element by element), the
// rest one by one.
template <class S>
inline void transpose_tile(float * dst, const S * src, size_t lds, int rows, int cols) {
    int r8 = 0, c8 = 0;  // rows and columns done in 8 x 8 blocks
#if defined(__AVX__)
    r8 = rows - rows % 8;
    c8 = cols - cols % 8;
    for (int r = 0; r < r8; r += 8)
        for (int d = 0; d < c8; d += 8)
            transpose8x8(dst + d * kTile + r, kTile, src + r * lds + d, lds);
#endif
    for (int r = 0; r < rows; ++r) {
        const S * s = src + r * lds;
        for (int d = r < r8 ? c8 : 0; d < cols; ++d) dst[d * kTile + r] = to_f32(s[d]);
    }
}

// dst[r * ldd + d] = src[r * lds + d]: rows r < rows, d < cols. Packs a tile of rows strided
// by 3C or C into contiguous rows: B operands read from contiguous rows run about 35% faster
// (rows 3C floats apart fall into a few L1 sets). Converts low-precision rows to float.
template <class S>
inline void copy_tile(float * dst, size_t ldd, const S * src, size_t lds, int rows, int cols) {
    for (int r = 0; r < rows; ++r) {
        if constexpr (std::is_same_v<S, float>)
            std::memcpy(dst + r * ldd, src + r * lds, cols * sizeof(float));
        else
            to_f32_row(dst + r * ldd, src + r * lds, static_cast<size_t>(cols));
    }
}

// Packed documents (doc_start, kernels.h): the first key column of a tile pair each query row
// sees, first[r] = clamp(doc_start[q0 + r] - k0, 0, bc); all 0 without documents. doc_start is
// non-decreasing along a row, so a query tile's earliest key is its first row's document start.
inline void first_keys(int * first, const int32_t * doc_start, int q0, int br, int k0, int bc) {
    for (int r = 0; r < br; ++r) first[r] = doc_start ? std::clamp(doc_start[q0 + r] - k0, 0, bc) : 0;
}
// The first key tile any query of the tile at q0 attends to, and whether key tile kj is wholly
// before every query's document (skipped).
inline int first_key_tile(const int32_t * doc_start, int q0) { return doc_start ? doc_start[q0] / kTile : 0; }
inline bool tile_before_documents(const int32_t * doc_start, int q0, int k0, int bc) {
    return doc_start && doc_start[q0] >= k0 + bc;
}

// The elementwise step of the backward, for one tile pair (rows = queries, columns = keys):
// P = exp(S * scale - lse) over S in P, dS = P (dP - D) * scale over dP in dS, zero where masked
// (on the diagonal tile, keys after the query; with documents, keys before first[r]). lse and D
// are the tile's query rows.
inline void softmax_backward_tile(float * P, float * dS, int br, int bc, bool diag, const float * lse,
                                  const float * D, float scale, const int * first) {
    for (int r = 0; r < br; ++r) {
        float * prow = P + r * kTile;
        float * dsrow = dS + r * kTile;
        const int nv = diag ? r + 1 : bc;
        const int c0 = std::min(first[r], nv);
        const float l = lse[r];
        const float Dr = D[r];
        for (int c = 0; c < c0; ++c) {
            prow[c] = 0.0f;
            dsrow[c] = 0.0f;
        }
#pragma omp simd
        for (int c = c0; c < nv; ++c) {
            const float p = fast_exp(prow[c] * scale - l);
            prow[c] = p;
            dsrow[c] = p * (dsrow[c] - Dr) * scale;
        }
        for (int c = nv; c < bc; ++c) {
            prow[c] = 0.0f;
            dsrow[c] = 0.0f;
        }
    }
}


}  // namespace memfit::cpu::flash
