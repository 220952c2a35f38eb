// CPU kernels: the flash-attention backward for bf16/f16 storage (contract in kernels_flash.h;
// the algorithm and the fp32 version are in kernels_flash.cpp).
//
// The fp32 backward accumulates dQ, dK and dV in dqkv itself, across tiles. In low precision
// that would round every gradient element once per tile pair, so each gradient tile is instead
// accumulated in fp32 and rounded once. Key tiles are outermost: for key tile j, dV_j and dK_j
// accumulate over query tiles i >= j in two fp32 tiles, then are rounded into dqkv. dQ_i
// accumulates over key tiles j <= i, across the outer loop, so it needs all of the head's dQ
// rows in fp32 (T x hs floats):
//   one pass (T up to kOnePassTiles tiles): they are in the scratch, dQ_i += dS K_j beside the
//      other two products, and rounded at the end; the fp32 kernel's five tile products;
//   two passes (longer T, where that would outgrow the scratch): the key-tile pass computes dK
//      and dV only; then a pass with query tiles outermost accumulates one dQ_i in an fp32 tile
//      over j <= i, recomputing P and dS (7 tile products per pair).
// Either way each gradient element is the fp32 kernel's arithmetic on the same (converted)
// inputs: the same tile products, summed in the same order (dQ_i over j ascending), rounded
// once; the two modes give the same bits (the compiler may contract a multiply and an add into
// an FMA differently here and in the fp32 kernel, so that kernel's values can differ in the
// last bit, which rounding to 16 bits almost always hides).
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "backend/cpu/convert.h"
#include "backend/cpu/flash_tiles.h"
#include "backend/cpu/kernels_flash.h"
#include "core/error.h"

namespace memfit::cpu {

using namespace flash;

namespace {

template <class S>
void flash_backward_lowp(S * dqkv, float * scratch, const S * dout, const S * out, const S * qkv,
                         const float * lse, int B, int T, int C, int NH, const int32_t * doc_start,
                         bool one_pass) {
    MF_ASSERT(NH > 0 && C % NH == 0);
    const int hs = C / NH;
    const size_t C3 = static_cast<size_t>(3) * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int nt = tiles(T);
    const int tasks = B * NH;  // one (b,h) each: its dq, dk, dv columns are disjoint from others
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; ++task) {
        const BackwardPair<S> pair(task, dqkv, scratch, dout, out, qkv, lse, B, T, C, NH, one_pass);
        const S * qbase = pair.q;
        const S * kbase = pair.k;
        const S * vbase = pair.v;
        S * dqbase = pair.dq;
        S * dkbase = pair.dk;
        S * dvbase = pair.dv;
        const S * gobase = pair.dout;
        const S * obase = pair.out;
        const float * lrow = pair.lse;
        float * D = pair.D;
        // P and dS [query][key]; K and V transposed [head column][key]; Q and dO [query][head
        // column]; the dK and dV accumulators [key][head column]; in one pass, K [key][head
        // column] and dQ [query][head column]; in pass B, K [key][head column] and the dQ_i
        // accumulator [query][head column] in the dK and dV tiles.
        float * P = pair.P;
        float * dS = pair.dS;
        float * kt = pair.slot[0];
        float * vt = pair.slot[1];
        float * qp = pair.slot[2];
        float * gp = pair.slot[3];
        float * acc0 = pair.slot[4];  // dK_j; pass B: K_j
        float * acc1 = pair.slot[5];  // dV_j; pass B: dQ_i
        float * kp = pair.slot[6];    // one pass: K_j [key][head column]
        float * dq_acc = pair.dq_acc; // one pass: the head's dQ [T x hs]
        int first[kTile];
        const int32_t * ds = doc_start ? doc_start + static_cast<size_t>(task / NH) * T : nullptr;

        // D_t = dout_t . out_t
        for (int t = 0; t < T; ++t) {
            const S * go = gobase + static_cast<size_t>(t) * C;
            const S * o = obase + static_cast<size_t>(t) * C;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < hs; ++i) d += to_f32(go[i]) * to_f32(o[i]);
            D[t] = d;
        }

        // S = Q K^T into P, dP = dO V^T into dS, then P and dS (qp, gp, kt, vt loaded).
        auto scores = [&](int q0, int br, int k0, int bc, bool diag) {
            const Causal nmask = diag ? Causal::kNUpTo : Causal::kNone;
            tile_gemm(P, kTile, qp, hs, 1, kt, kTile, br, bc, hs, false, nmask);
            tile_gemm(dS, kTile, gp, hs, 1, vt, kTile, br, bc, hs, false, nmask);
            first_keys(first, ds, q0, br, k0, bc);
            softmax_backward_tile(P, dS, br, bc, diag, lrow + q0, D + q0, scale, first);
        };
        auto load_q = [&](int q0, int br) {
            copy_tile(qp, hs, qbase + q0 * C3, C3, br, hs);
            copy_tile(gp, hs, gobase + static_cast<size_t>(q0) * C, C, br, hs);
        };
        auto load_kv = [&](int k0, int bc) {
            transpose_tile(kt, kbase + k0 * C3, C3, bc, hs);
            transpose_tile(vt, vbase + k0 * C3, C3, bc, hs);
        };
        auto store = [&](S * dst, const float * acc, int rows) {
            for (int r = 0; r < rows; ++r)
                from_f32_row(dst + r * C3, acc + r * static_cast<size_t>(hs), static_cast<size_t>(hs));
        };
        // dQ_i += dS K_j (K_j's rows in kj_rows).
        auto add_dq = [&](float * dq, const float * kj_rows, int br, int bc, bool diag) {
            tile_gemm(dq, hs, dS, kTile, 1, kj_rows, hs, br, hs, bc, true, diag ? Causal::kKUpTo : Causal::kNone);
        };

        // Key tiles outermost: dV_j += P^T dO_i;  dK_j += dS^T Q_i  (one pass: dQ_i += dS K_j)
        // over i >= j.
        if (one_pass) std::fill(dq_acc, dq_acc + static_cast<size_t>(T) * hs, 0.0f);
        for (int kj = 0; kj < nt; ++kj) {
            const int k0 = kj * kTile;
            const int bc = std::min(kTile, T - k0);
            load_kv(k0, bc);
            if (one_pass) copy_tile(kp, hs, kbase + k0 * C3, C3, bc, hs);
            std::fill(acc0, acc0 + static_cast<size_t>(bc) * hs, 0.0f);
            std::fill(acc1, acc1 + static_cast<size_t>(bc) * hs, 0.0f);
            for (int qi = kj; qi < nt; ++qi) {
                const int q0 = qi * kTile;
                const int br = std::min(kTile, T - q0);
                if (tile_before_documents(ds, q0, k0, bc)) break;   // and every later query tile
                const bool diag = qi == kj;
                load_q(q0, br);
                scores(q0, br, k0, bc, diag);
                const Causal kfrom = diag ? Causal::kKFrom : Causal::kNone;
                tile_gemm(acc1, hs, P, 1, kTile, gp, hs, bc, hs, br, true, kfrom);
                tile_gemm(acc0, hs, dS, 1, kTile, qp, hs, bc, hs, br, true, kfrom);
                if (one_pass) add_dq(dq_acc + static_cast<size_t>(q0) * hs, kp, br, bc, diag);
            }
            store(dkbase + k0 * C3, acc0, bc);
            store(dvbase + k0 * C3, acc1, bc);
        }
        if (one_pass) {
            store(dqbase, dq_acc, T);
            continue;
        }

        // Pass B: dQ_i += dS K_j  over j <= i.
        for (int qi = 0; qi < nt; ++qi) {
            const int q0 = qi * kTile;
            const int br = std::min(kTile, T - q0);
            load_q(q0, br);
            std::fill(acc1, acc1 + static_cast<size_t>(br) * hs, 0.0f);
            for (int kj = first_key_tile(ds, q0); kj <= qi; ++kj) {
                const int k0 = kj * kTile;
                const int bc = std::min(kTile, T - k0);
                load_kv(k0, bc);
                copy_tile(acc0, hs, kbase + k0 * C3, C3, bc, hs);
                scores(q0, br, k0, bc, qi == kj);
                add_dq(acc1, acc0, br, bc, qi == kj);
            }
            store(dqbase + q0 * C3, acc1, br);
        }
    }
}

}  // namespace

void flash_attention_backward(bf16_t * dqkv, float * scratch, const bf16_t * dout, const bf16_t * out,
                              const bf16_t * qkv, const float * lse, int B, int T, int C, int NH,
                              const int32_t * doc_start) {
    flash_backward_lowp(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH, doc_start, lowp_one_pass(T));
}

void flash_attention_backward(f16_t * dqkv, float * scratch, const f16_t * dout, const f16_t * out,
                              const f16_t * qkv, const float * lse, int B, int T, int C, int NH,
                              const int32_t * doc_start) {
    flash_backward_lowp(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH, doc_start, lowp_one_pass(T));
}

void flash_attention_backward_passes(bf16_t * dqkv, float * scratch, const bf16_t * dout, const bf16_t * out,
                                     const bf16_t * qkv, const float * lse, int B, int T, int C, int NH,
                                     const int32_t * doc_start, int passes) {
    MF_ASSERT(passes == 1 || passes == 2);
    flash_backward_lowp(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH, doc_start, passes == 1);
}

}  // namespace memfit::cpu
