// CPU kernels: FlashAttention-style causal attention, forward and backward. Contracts are in
// kernels_flash.h.
//
// Queries and keys are cut into tiles of kTile rows; query tile i attends to key tiles 0..i
// (later key tiles are entirely masked and skipped), and only the diagonal pair (key tile i)
// is masked inside. Every product of two tiles goes through one small matrix-multiply kernel
// (tile_gemm) that keeps a kMR x kNR block of C in registers and vectorises over the
// contiguous columns of B. B operands are first packed into small contiguous buffers: K and V
// transposed (head dimension as rows) for the score products, other tiles copied as they are.
//
// Forward, one task per (b, h, query tile): for each key tile j, S = Q_i K_j^T * scale, running
// row max m and sum l, P = exp(S - m), out_i = out_i * exp(m_old - m) + P V_j; at the end
// out_i /= l and lse = m + log l. The output rows themselves are the accumulator.
// Backward (FlashAttention-2), one task per (b, h): D_t = dout_t . out_t; for each key tile j
// and each query tile i >= j: P = exp(S * scale - lse), dP = dO_i V_j^T,
// dS = P (dP - D) * scale, dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j. All of one
// head's gradient rows belong to one task, so nothing is shared between threads and no atomics
// are needed; each gradient element is summed in a fixed order, whatever the thread count.
//
// exp is a vectorisable polynomial (fast_exp below, relative error < 1e-7), not std::exp,
// which GCC does not vectorise without -ffast-math.
#include "backend/cpu/kernels_flash.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace memfit::cpu {

namespace {

constexpr int kTile = 64;  // queries per query tile and keys per key tile
constexpr int kMR = 6;     // rows of a register block in tile_gemm
constexpr int kNR = 16;    // columns of a register block in tile_gemm (two AVX2 vectors)

int tiles(int T) { return (T + kTile - 1) / kTile; }

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// exp(x), for x <= 88 (the largest argument here is a rounding error above 0), with relative
// error < 1e-7. Cephes-style: x = n ln2 + r with |r| <= ln2/2, exp(r) by a polynomial, 2^n put
// in the exponent bits.
// Arguments below -87 (results near FLT_MIN and below, and -inf) give 0: the value computed for
// them is garbage and is masked off with integer operations. Free of branches and of float
// comparisons in selects (which GCC does not if-convert under -ftrapping-math), so that
// `omp simd` loops calling it vectorise.
inline float fast_exp(float x) {
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float t = x * 1.44269504088896341f + kMagic;
    const float n = t - kMagic;
    float r = x - n * 0.693359375f;  // ln 2 in two parts (Cody-Waite)
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    // bits(t) = bits(kMagic) + n; 2^n has exponent field n + 127 (>= 1 for x >= -87).
    const uint32_t pow2n = (std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23;
    const float res = y * std::bit_cast<float>(pow2n);
    const uint32_t keep = 0u - static_cast<uint32_t>(x >= -87.0f);  // all ones, or 0 to flush
    return std::bit_cast<float>(std::bit_cast<uint32_t>(res) & keep);
}

// Which part of a diagonal (causal) tile a product needs, with rows m and the reduction index
// k (or the columns n) counted from the same origin.
enum class Causal {
    kNone,   // full tile
    kKUpTo,  // A(m,k) is zero for k > m: the reduction stops at the block's last row
    kKFrom,  // A(m,k) is zero for k < m: the reduction starts at the block's first row
    kNUpTo,  // only C(m,n) with n <= m are needed (others may be left unwritten)
};

// Eight floats, one AVX register. A GCC/Clang vector extension rather than `omp simd` loops:
// with those, GCC keeps gemm_block's accumulators in memory between its three loops and reaches
// about 3/4 of the speed of this version. Never passed by value (that changes the ABI, and
// warns, where AVX is not enabled).
typedef float vf8 __attribute__((vector_size(32)));

// One register block: C[MR x 8*NV] (+)= sum_{k in [k0,k1)} A(m,k) B(k,:).
template <int MR, int NV>
inline void gemm_block(float * c, size_t ldc, const float * a, size_t sam, size_t sak,
                       const float * b, size_t ldb, int k0, int k1, bool accumulate) {
    vf8 acc[MR][NV];
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < NV; ++v) {
            acc[m][v] = vf8{};
            if (accumulate) std::memcpy(&acc[m][v], c + m * ldc + 8 * v, sizeof(vf8));
        }
    for (int k = k0; k < k1; ++k) {
        vf8 bv[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + k * ldb + 8 * v, sizeof(vf8));
        const float * acol = a + k * sak;
        for (int m = 0; m < MR; ++m) {
            const float av = acol[m * sam];
            for (int v = 0; v < NV; ++v) acc[m][v] += av * bv[v];
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < NV; ++v) std::memcpy(c + m * ldc + 8 * v, &acc[m][v], sizeof(vf8));
}

// C[M x N] (+)= A[M x K] B[K x N] with A(m,k) = a[m*sam + k*sak], B row-major (row stride
// ldb), C row-major (row stride ldc). Each C element is summed over k in increasing order.
void tile_gemm(float * c, size_t ldc, const float * a, size_t sam, size_t sak, const float * b,
               size_t ldb, int M, int N, int K, bool accumulate, Causal causal) {
    auto k_range = [&](int m0, int rows, int & k0, int & k1) {
        k0 = 0;
        k1 = K;
        if (causal == Causal::kKUpTo) k1 = std::min(K, m0 + rows);
        if (causal == Causal::kKFrom) k0 = std::min(K, m0);
    };
    // Rows of one column block of 8*NV: blocks of kMR rows, then 4, 2, 1 (64 = 10 * 6 + 4).
    auto column_block = [&]<int NV>(int n0) {
        int m0 = 0;
        auto rows = [&]<int R>() {
            for (; m0 + R <= M; m0 += R) {
                if (causal == Causal::kNUpTo && m0 + R <= n0) continue;
                int k0 = 0, k1 = 0;
                k_range(m0, R, k0, k1);
                gemm_block<R, NV>(c + m0 * ldc + n0, ldc, a + m0 * sam, sam, sak, b + n0, ldb, k0,
                                  k1, accumulate);
            }
        };
        rows.template operator()<kMR>();
        rows.template operator()<4>();
        rows.template operator()<2>();
        rows.template operator()<1>();
    };
    int n0 = 0;
    for (; n0 + kNR <= N; n0 += kNR) column_block.template operator()<kNR / 8>(n0);
    for (; n0 + 8 <= N; n0 += 8) column_block.template operator()<1>(n0);
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
// dst[d * ldd + r] = src[r * lds + d] for an 8 x 8 block, in registers.
inline void transpose8x8(float * dst, size_t ldd, const float * src, size_t lds) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
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

// dst[d * kTile + r] = src[r * lds + d]: rows r < rows, d < cols. 8 x 8 blocks in registers
// where AVX is available (about 3x faster than element by element), the rest one by one.
void transpose_tile(float * dst, const float * src, size_t lds, int rows, int cols) {
    int r8 = 0, c8 = 0;  // rows and columns done in 8 x 8 blocks
#if defined(__AVX__)
    r8 = rows - rows % 8;
    c8 = cols - cols % 8;
    for (int r = 0; r < r8; r += 8)
        for (int d = 0; d < c8; d += 8)
            transpose8x8(dst + d * kTile + r, kTile, src + r * lds + d, lds);
#endif
    for (int r = 0; r < rows; ++r) {
        const float * s = src + r * lds;
        for (int d = r < r8 ? c8 : 0; d < cols; ++d) dst[d * kTile + r] = s[d];
    }
}

// dst[r * ldd + d] = src[r * lds + d]: rows r < rows, d < cols. Packs a tile of rows strided
// by 3C or C into contiguous rows: B operands read from contiguous rows run about 35% faster
// (rows 3C floats apart fall into a few L1 sets).
void copy_tile(float * dst, size_t ldd, const float * src, size_t lds, int rows, int cols) {
    for (int r = 0; r < rows; ++r) std::memcpy(dst + r * ldd, src + r * lds, cols * sizeof(float));
}

}  // namespace

size_t flash_attention_scratch_floats(int B, int T, int C, int NH) {
    MF_ASSERT(B >= 0 && T >= 0 && NH > 0 && C % NH == 0);
    const size_t hs = static_cast<size_t>(C / NH);
    const size_t pairs = static_cast<size_t>(B) * NH;
    const size_t per_pair = 2 * static_cast<size_t>(kTile) * kTile + 5 * hs * kTile;
    return round_up(pairs * static_cast<size_t>(T), 16) + pairs * per_pair;
}

void flash_attention_forward(float * out, float * lse, const float * qkv, int B, int T, int C,
                             int NH) {
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int nt = tiles(T);
    const int tasks = B * NH * nt;

    // Tasks are independent (disjoint rows of out and lse), each computed by one thread in a
    // fixed order, so the dynamic schedule (which balances the causal tiles' unequal costs;
    // the first tasks are the most expensive) does not affect the results.
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
        const int qi = nt - 1 - task % nt;  // largest query tiles first
        const int h = (task / nt) % NH;
        const int b = task / (nt * NH);
        const float * base = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        const int q0 = qi * kTile;
        const int br = std::min(kTile, T - q0);
        const float * q = base + q0 * C3;
        float * o = out + (static_cast<size_t>(b) * T + q0) * C + static_cast<size_t>(h) * hs;
        float * lrow = lse + (static_cast<size_t>(b) * NH + h) * T + q0;

        // Fixed-size tiles on the stack (48 KiB); head sizes above kTile are done in chunks of
        // kTile columns.
        alignas(64) float s[kTile * kTile];   // scores, then probabilities, of one tile pair
        alignas(64) float kt[kTile * kTile];  // K tile transposed: [head column][key]
        alignas(64) float vp[kTile * kTile];  // V tile packed: [key][head column]
        float mrow[kTile], lsum[kTile];       // running max and sum per query

        for (int kj = 0; kj <= qi; ++kj) {
            const int k0 = kj * kTile;
            const int bc = std::min(kTile, T - k0);
            const bool diag = kj == qi;
            const float * k = base + C + k0 * C3;
            const float * v = base + 2 * static_cast<size_t>(C) + k0 * C3;

            // S = Q K^T (the diagonal tile only on and below the diagonal).
            for (int d0 = 0; d0 < hs; d0 += kTile) {
                const int dc = std::min(kTile, hs - d0);
                transpose_tile(kt, k + d0, C3, bc, dc);
                tile_gemm(s, kTile, q + d0, C3, 1, kt, kTile, br, bc, dc, d0 > 0,
                          diag ? Causal::kNUpTo : Causal::kNone);
            }

            // Online softmax; P replaces S (zero where masked).
            for (int r = 0; r < br; ++r) {
                float * srow = s + r * kTile;
                const int nv = diag ? r + 1 : bc;
                float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
                for (int c = 0; c < nv; ++c) mx = srow[c] > mx ? srow[c] : mx;
                mx *= scale;  // = the max of the scaled scores: rounding is monotonic
                const float mnew = kj == 0 ? mx : std::max(mrow[r], mx);
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int c = 0; c < nv; ++c) {
                    const float e = fast_exp(srow[c] * scale - mnew);
                    srow[c] = e;
                    sum += e;
                }
                for (int c = nv; c < bc; ++c) srow[c] = 0.0f;
                if (kj == 0) {
                    lsum[r] = sum;
                } else {
                    const float alpha = fast_exp(mrow[r] - mnew);
                    lsum[r] = lsum[r] * alpha + sum;
                    if (alpha != 1.0f) {
                        float * orow = o + r * static_cast<size_t>(C);
#pragma omp simd
                        for (int d = 0; d < hs; ++d) orow[d] *= alpha;
                    }
                }
                mrow[r] = mnew;
            }

            // out_i (+)= P V_j, kTile output columns at a time.
            for (int d0 = 0; d0 < hs; d0 += kTile) {
                const int dc = std::min(kTile, hs - d0);
                copy_tile(vp, kTile, v + d0, C3, bc, dc);
                tile_gemm(o + d0, C, s, kTile, 1, vp, kTile, br, dc, bc, kj > 0,
                          diag ? Causal::kKUpTo : Causal::kNone);
            }
        }

        for (int r = 0; r < br; ++r) {
            const float inv = 1.0f / lsum[r];
            float * orow = o + r * static_cast<size_t>(C);
#pragma omp simd
            for (int d = 0; d < hs; ++d) orow[d] *= inv;
            lrow[r] = mrow[r] + std::log(lsum[r]);
        }
    }
}

void flash_attention_backward(float * dqkv, float * scratch, const float * dout, const float * out,
                              const float * qkv, const float * lse, int B, int T, int C, int NH) {
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int nt = tiles(T);
    const int tasks = B * NH;  // one (b,h) each: its dq, dk, dv columns are disjoint from others
    const size_t tile_floats = static_cast<size_t>(hs) * kTile;
    const size_t per_pair = 2 * static_cast<size_t>(kTile) * kTile + 5 * tile_floats;
    float * tile_scratch = scratch + round_up(static_cast<size_t>(tasks) * T, 16);

#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; ++task) {
        const int h = task % NH;
        const int b = task / NH;
        const size_t head_off = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        const size_t row_off = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
        const float * qbase = qkv + head_off;
        const float * kbase = qbase + C;
        const float * vbase = qbase + 2 * static_cast<size_t>(C);
        float * dqbase = dqkv + head_off;
        float * dkbase = dqbase + C;
        float * dvbase = dqbase + 2 * static_cast<size_t>(C);
        const float * gobase = dout + row_off;
        const float * obase = out + row_off;
        const float * lrow = lse + static_cast<size_t>(task) * T;
        float * D = scratch + static_cast<size_t>(task) * T;
        // This pair's tile buffers: P and dS [query][key]; K and V transposed [head column][key];
        // K [key][head column]; Q and dO [query][head column].
        float * P = tile_scratch + static_cast<size_t>(task) * per_pair;
        float * dS = P + kTile * kTile;
        float * kt = dS + kTile * kTile;
        float * vt = kt + tile_floats;
        float * kp = vt + tile_floats;
        float * qp = kp + tile_floats;
        float * gp = qp + tile_floats;

        // D_t = dout_t . out_t; zero this head's q, k, v gradient columns.
        for (int t = 0; t < T; ++t) {
            const float * go = gobase + static_cast<size_t>(t) * C;
            const float * o = obase + static_cast<size_t>(t) * C;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < hs; ++i) d += go[i] * o[i];
            D[t] = d;
            float * dp = dqbase + static_cast<size_t>(t) * C3;
            for (int part = 0; part < 3; ++part) {
                float * dpp = dp + static_cast<size_t>(part) * C;
#pragma omp simd
                for (int i = 0; i < hs; ++i) dpp[i] = 0.0f;
            }
        }

        for (int kj = 0; kj < nt; ++kj) {
            const int k0 = kj * kTile;
            const int bc = std::min(kTile, T - k0);
            float * dk = dkbase + k0 * C3;
            float * dv = dvbase + k0 * C3;
            transpose_tile(kt, kbase + k0 * C3, C3, bc, hs);
            transpose_tile(vt, vbase + k0 * C3, C3, bc, hs);
            copy_tile(kp, hs, kbase + k0 * C3, C3, bc, hs);

            for (int qi = kj; qi < nt; ++qi) {
                const int q0 = qi * kTile;
                const int br = std::min(kTile, T - q0);
                const bool diag = qi == kj;
                float * dq = dqbase + q0 * C3;
                copy_tile(qp, hs, qbase + q0 * C3, C3, br, hs);
                copy_tile(gp, hs, gobase + static_cast<size_t>(q0) * C, C, br, hs);

                // S = Q K^T into P; dP = dO V^T into dS (on the diagonal tile, only the blocks
                // that reach the diagonal or below).
                const Causal nmask = diag ? Causal::kNUpTo : Causal::kNone;
                tile_gemm(P, kTile, qp, hs, 1, kt, kTile, br, bc, hs, false, nmask);
                tile_gemm(dS, kTile, gp, hs, 1, vt, kTile, br, bc, hs, false, nmask);

                // P = exp(S * scale - lse); dS = P (dP - D) * scale; zero where masked.
                for (int r = 0; r < br; ++r) {
                    float * prow = P + r * kTile;
                    float * dsrow = dS + r * kTile;
                    const int nv = diag ? r + 1 : bc;
                    const float l = lrow[q0 + r];
                    const float Dr = D[q0 + r];
#pragma omp simd
                    for (int c = 0; c < nv; ++c) {
                        const float p = fast_exp(prow[c] * scale - l);
                        prow[c] = p;
                        dsrow[c] = p * (dsrow[c] - Dr) * scale;
                    }
                    for (int c = nv; c < bc; ++c) {
                        prow[c] = 0.0f;
                        dsrow[c] = 0.0f;
                    }
                }

                // dV_j += P^T dO_i;  dK_j += dS^T Q_i;  dQ_i += dS K_j
                const Causal kfrom = diag ? Causal::kKFrom : Causal::kNone;
                tile_gemm(dv, C3, P, 1, kTile, gp, hs, bc, hs, br, true, kfrom);
                tile_gemm(dk, C3, dS, 1, kTile, qp, hs, bc, hs, br, true, kfrom);
                tile_gemm(dq, C3, dS, kTile, 1, kp, hs, br, hs, bc, true,
                          diag ? Causal::kKUpTo : Causal::kNone);
            }
        }
    }
}

}  // namespace memfit::cpu
