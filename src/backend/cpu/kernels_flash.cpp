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
// exp is a vectorisable polynomial (fast_exp in flash_tiles.h, relative error < 1e-7), not
// std::exp, which GCC does not vectorise without -ffast-math.
//
// bf16/f16 storage: tiles are converted to fp32 as they are packed (Q, K, V, dout), and every
// accumulation is in fp32. The forward accumulates each output tile in a per-thread fp32 buffer
// (instead of in out) and rounds it once; the backward is in kernels_flash_lowp.cpp.
#include "backend/cpu/kernels_flash.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/flash_tiles.h"
#include "core/error.h"

namespace memfit::cpu {

using namespace flash;

size_t flash_attention_scratch_floats(int B, int T, int C, int NH, DType storage) {
    MF_ASSERT(B >= 0 && T >= 0 && NH > 0 && C % NH == 0);
    const size_t pairs = static_cast<size_t>(B) * NH;
    return round_up(pairs * static_cast<size_t>(T), 16) +
           pairs * backward_pair_floats(C / NH, T, storage != DType::f32 && lowp_one_pass(T));
}

template <class S>
void flash_attention_forward(S * out, float * lse, const S * qkv, int B, int T, int C, int NH,
                             const int32_t * doc_start) {
    constexpr bool kF32 = std::is_same_v<S, float>;
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int nt = tiles(T);
    const int tasks = B * NH * nt;

    // Tasks are independent (disjoint rows of out and lse), each computed by one thread in a
    // fixed order, so the dynamic schedule (which balances the causal tiles' unequal costs;
    // the first tasks are the most expensive) does not affect the results.
#pragma omp parallel
    {
        // Low precision: this thread's Q tile and output accumulator, fp32 [kTile x hs] each.
        std::vector<float> tbuf(kF32 ? 0 : 2 * static_cast<size_t>(kTile) * hs);
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < tasks; ++task) {
            const int qi = nt - 1 - task % nt;  // largest query tiles first
            const int h = (task / nt) % NH;
            const int b = task / (nt * NH);
            const S * base = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
            const int q0 = qi * kTile;
            const int br = std::min(kTile, T - q0);
            S * out_tile = out + (static_cast<size_t>(b) * T + q0) * C + static_cast<size_t>(h) * hs;
            float * lrow = lse + (static_cast<size_t>(b) * NH + h) * T + q0;
            // Q and the output accumulator: in place for float (row strides 3C and C), else packed.
            const float * q = nullptr;
            float * o = nullptr;
            size_t ldq = 0, ldo = 0;
            if constexpr (kF32) {
                q = base + q0 * C3;
                o = out_tile;
                ldq = C3;
                ldo = static_cast<size_t>(C);
            } else {
                copy_tile(tbuf.data(), hs, base + q0 * C3, C3, br, hs);
                q = tbuf.data();
                o = tbuf.data() + static_cast<size_t>(kTile) * hs;
                ldq = ldo = static_cast<size_t>(hs);
            }

            // Fixed-size tiles on the stack (48 KiB); head sizes above kTile are done in chunks of
            // kTile columns.
            alignas(64) float s[kTile * kTile];   // scores, then probabilities, of one tile pair
            alignas(64) float kt[kTile * kTile];  // K tile transposed: [head column][key]
            alignas(64) float vp[kTile * kTile];  // V tile packed: [key][head column]
            float mrow[kTile], lsum[kTile];       // running max and sum per query
            int first[kTile];                     // per query: its first key column in the tile
            // Packed documents: key tiles before the query tile's first document are skipped; a
            // query that has seen no key yet has m = -inf and l = 0.
            const int32_t * ds = doc_start ? doc_start + static_cast<size_t>(b) * T : nullptr;
            const int kj0 = first_key_tile(ds, q0);

            for (int kj = kj0; kj <= qi; ++kj) {
                const int k0 = kj * kTile;
                const int bc = std::min(kTile, T - k0);
                const bool diag = kj == qi;
                first_keys(first, ds, q0, br, k0, bc);
                const S * k = base + C + k0 * C3;
                const S * v = base + 2 * static_cast<size_t>(C) + k0 * C3;

                // S = Q K^T (the diagonal tile only on and below the diagonal).
                for (int d0 = 0; d0 < hs; d0 += kTile) {
                    const int dc = std::min(kTile, hs - d0);
                    transpose_tile(kt, k + d0, C3, bc, dc);
                    tile_gemm(s, kTile, q + d0, ldq, 1, kt, kTile, br, bc, dc, d0 > 0,
                              diag ? Causal::kNUpTo : Causal::kNone);
                }

                // Online softmax; P replaces S (zero where masked).
                for (int r = 0; r < br; ++r) {
                    float * srow = s + r * kTile;
                    const int nv = diag ? r + 1 : bc;
                    const int c0 = std::min(first[r], nv);
                    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
                    for (int c = c0; c < nv; ++c) mx = srow[c] > mx ? srow[c] : mx;
                    mx *= scale;  // = the max of the scaled scores: rounding is monotonic
                    const float mnew = kj == kj0 ? mx : std::max(mrow[r], mx);
                    if (mnew == -std::numeric_limits<float>::infinity()) {   // no key of its document yet
                        for (int c = 0; c < bc; ++c) srow[c] = 0.0f;
                        if (kj == kj0) lsum[r] = 0.0f;
                        mrow[r] = mnew;
                        continue;
                    }
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int c = c0; c < nv; ++c) {
                        const float e = fast_exp(srow[c] * scale - mnew);
                        srow[c] = e;
                        sum += e;
                    }
                    for (int c = 0; c < c0; ++c) srow[c] = 0.0f;
                    for (int c = nv; c < bc; ++c) srow[c] = 0.0f;
                    if (kj == kj0) {
                        lsum[r] = sum;
                    } else {
                        const float alpha = fast_exp(mrow[r] - mnew);
                        lsum[r] = lsum[r] * alpha + sum;
                        if (alpha != 1.0f) {
                            float * orow = o + r * ldo;
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
                    tile_gemm(o + d0, ldo, s, kTile, 1, vp, kTile, br, dc, bc, kj > kj0,
                              diag ? Causal::kKUpTo : Causal::kNone);
                }
            }

            for (int r = 0; r < br; ++r) {
                const float inv = 1.0f / lsum[r];
                float * orow = o + r * ldo;
#pragma omp simd
                for (int d = 0; d < hs; ++d) orow[d] *= inv;
                lrow[r] = mrow[r] + std::log(lsum[r]);
                if constexpr (!kF32) from_f32_row(out_tile + r * static_cast<size_t>(C), orow, static_cast<size_t>(hs));
            }
        }
    }
}

template void flash_attention_forward<float>(float *, float *, const float *, int, int, int, int, const int32_t *);
template void flash_attention_forward<bf16_t>(bf16_t *, float *, const bf16_t *, int, int, int, int,
                                              const int32_t *);
template void flash_attention_forward<f16_t>(f16_t *, float *, const f16_t *, int, int, int, int, const int32_t *);

void flash_attention_backward(float * dqkv, float * scratch, const float * dout, const float * out,
                              const float * qkv, const float * lse, int B, int T, int C, int NH,
                              const int32_t * doc_start) {
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int nt = tiles(T);
    const int tasks = B * NH;  // one (b,h) each: its dq, dk, dv columns are disjoint from others
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; ++task) {
        const BackwardPair<float> pair(task, dqkv, scratch, dout, out, qkv, lse, B, T, C, NH);
        const float * qbase = pair.q;
        const float * kbase = pair.k;
        const float * vbase = pair.v;
        float * dqbase = pair.dq;
        float * dkbase = pair.dk;
        float * dvbase = pair.dv;
        const float * gobase = pair.dout;
        const float * obase = pair.out;
        const float * lrow = pair.lse;
        float * D = pair.D;
        // P and dS [query][key]; K and V transposed [head column][key]; K [key][head column];
        // Q and dO [query][head column].
        float * P = pair.P;
        float * dS = pair.dS;
        float * kt = pair.slot[0];
        float * vt = pair.slot[1];
        float * kp = pair.slot[2];
        float * qp = pair.slot[3];
        float * gp = pair.slot[4];
        int first[kTile];
        const int32_t * ds = doc_start ? doc_start + static_cast<size_t>(task / NH) * T : nullptr;

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
                if (tile_before_documents(ds, q0, k0, bc)) break;   // and every later query tile
                const bool diag = qi == kj;
                first_keys(first, ds, q0, br, k0, bc);
                float * dq = dqbase + q0 * C3;
                copy_tile(qp, hs, qbase + q0 * C3, C3, br, hs);
                copy_tile(gp, hs, gobase + static_cast<size_t>(q0) * C, C, br, hs);

                // S = Q K^T into P; dP = dO V^T into dS (on the diagonal tile, only the blocks
                // that reach the diagonal or below).
                const Causal nmask = diag ? Causal::kNUpTo : Causal::kNone;
                tile_gemm(P, kTile, qp, hs, 1, kt, kTile, br, bc, hs, false, nmask);
                tile_gemm(dS, kTile, gp, hs, 1, vt, kTile, br, bc, hs, false, nmask);

                // P = exp(S * scale - lse); dS = P (dP - D) * scale; zero where masked.
                softmax_backward_tile(P, dS, br, bc, diag, lrow + q0, D + q0, scale, first);

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
