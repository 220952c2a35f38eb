// CPU kernels: encoder, layernorm, bias gradient, sum of squares, AdamW (GELU and residual are
// in kernels_gelu.cpp). Contracts are in kernels.h. Every parallel loop uses a static schedule,
// and every reduction has a fixed order that does not depend on how iterations are split among
// threads: reductions over rows (parameter gradients) are parallelised over blocks of output
// columns, each block summing its rows in order.
//
// Templated on the storage types (kernels.h): loads go through to_f32 and stores through
// from_f32, which are the identity for float, so the float instantiations are the fp32 kernels.
#include "backend/cpu/kernels.h"
#include "backend/stochastic_round.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace memfit::cpu {

namespace {

// Output columns per task for reductions over rows: 32 floats = two cache lines per row.
constexpr int kColBlock = 32;

int col_blocks(int cols) { return (cols + kColBlock - 1) / kColBlock; }

// g = round(g + acc): the one rounded add of a low-precision gradient (a plain += for float).
template <class G>
inline void add_to(G & g, float acc) { g = from_f32<G>(to_f32(g) + acc); }

// The rows of the embedding table a kernel holds: tokens lo .. lo+n-1 at rows 0 .. n-1, or, with
// n < 0, the whole table (every token at its own row).
struct VocabShard {
    int64_t lo = 0, n = -1;
    // The table row of token tok, or -1 when another shard holds it.
    int64_t row(int32_t tok) const {
        MF_ASSERT(tok >= 0);
        const int64_t r = tok - lo;
        return n < 0 || (r >= 0 && r < n) ? r : -1;
    }
};

// dwte += dout rows, for a low-precision dwte: rows are grouped by table row (sorted by it, then
// by row), each group's rows are summed in fp32 in row order, and the sum is added once. Table
// rows are independent, so the groups are the parallel tasks. Tokens of other shards are skipped.
template <class G, class S>
void encoder_backward_wte_grouped(G * dwte, const S * dout, const int32_t * tokens, int rows, int C,
                                  VocabShard shard) {
    std::vector<std::pair<int64_t, int>> order;
    order.reserve(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
        const int64_t e = shard.row(tokens[r]);
        if (e >= 0) order.emplace_back(e, r);
    }
    std::sort(order.begin(), order.end());
    const int n = static_cast<int>(order.size());
    std::vector<int> starts;  // first index in `order` of each table row's group, then `n`
    for (int i = 0; i < n; ++i)
        if (i == 0 || order[static_cast<size_t>(i)].first != order[static_cast<size_t>(i - 1)].first)
            starts.push_back(i);
    const int groups = static_cast<int>(starts.size());
    starts.push_back(n);
#pragma omp parallel
    {
        std::vector<float> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
        for (int gi = 0; gi < groups; ++gi) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int i = starts[static_cast<size_t>(gi)]; i < starts[static_cast<size_t>(gi) + 1]; ++i) {
                const S * d = dout + static_cast<size_t>(order[static_cast<size_t>(i)].second) * C;
                float * a = acc.data();
#pragma omp simd
                for (int c = 0; c < C; ++c) a[c] += to_f32(d[c]);
            }
            G * ge = dwte + static_cast<size_t>(order[static_cast<size_t>(starts[static_cast<size_t>(gi)])].first) * C;
            const float * a = acc.data();
#pragma omp simd
            for (int c = 0; c < C; ++c) add_to(ge[c], a[c]);
        }
    }
}

// dwte += dout rows alone. A float dwte: parallel over column blocks, each visiting the rows in
// order (the same additions in the same order as encoder_backward's fused fp32 loop); a
// low-precision one: grouped by table row (above).
template <class GE, class S>
void encoder_backward_wte(GE * dwte, const S * dout, const int32_t * tokens, int rows, int C, VocabShard shard) {
    if constexpr (std::is_same_v<GE, float>) {
        const int nblk = col_blocks(C);
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblk; ++blk) {
            const int c0 = blk * kColBlock;
            const int nc = std::min(kColBlock, C - c0);
            for (int r = 0; r < rows; ++r) {
                const int64_t e = shard.row(tokens[r]);
                if (e < 0) continue;
                const S * d = dout + static_cast<size_t>(r) * C + c0;
                float * ge = dwte + static_cast<size_t>(e) * C + c0;
#pragma omp simd
                for (int c = 0; c < nc; ++c) ge[c] += to_f32(d[c]);
            }
        }
    } else {
        encoder_backward_wte_grouped(dwte, dout, tokens, rows, C, shard);
    }
}

// dwte and dwpe in fp32 in one pass. Tokens repeat, so rows of dwte collide: parallelise over
// column blocks instead; each block visits the (b,t) rows in order, which also fixes the
// summation order.
template <class S>
void encoder_backward_fused(float * dwte, float * dwpe, const S * dout, const int32_t * tokens, int B, int T, int C,
                            VocabShard shard) {
    const int nblk = col_blocks(C);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, C - c0);
        for (int b = 0; b < B; ++b) {
            for (int t = 0; t < T; ++t) {
                const size_t r = static_cast<size_t>(b) * T + t;
                const int64_t e = shard.row(tokens[r]);
                const S * d = dout + r * C + c0;
                float * gp = dwpe + static_cast<size_t>(t) * C + c0;
                if (e < 0) {
#pragma omp simd
                    for (int c = 0; c < nc; ++c) gp[c] += to_f32(d[c]);
                    continue;
                }
                float * ge = dwte + static_cast<size_t>(e) * C + c0;
#pragma omp simd
                for (int c = 0; c < nc; ++c) {
                    ge[c] += to_f32(d[c]);
                    gp[c] += to_f32(d[c]);
                }
            }
        }
    }
}

// dwpe += dout summed over the batch: rows t are independent; each element sums b in order (for
// a float dwpe, the same additions in the same order as the fused loop), a low-precision one gets
// one rounded add.
template <class GP, class S>
void encoder_backward_wpe(GP * dwpe, const S * dout, int B, int T, int C) {
#pragma omp parallel
    {
        std::vector<float> acc(std::is_same_v<GP, float> ? 0 : static_cast<size_t>(C));
#pragma omp for schedule(static)
        for (int t = 0; t < T; ++t) {
            GP * gp = dwpe + static_cast<size_t>(t) * C;
            float * a = nullptr;
            if constexpr (std::is_same_v<GP, float>) {
                a = gp;
            } else {
                a = acc.data();
                std::fill(acc.begin(), acc.end(), 0.0f);
            }
            for (int b = 0; b < B; ++b) {
                const S * d = dout + (static_cast<size_t>(b) * T + t) * C;
#pragma omp simd
                for (int c = 0; c < C; ++c) a[c] += to_f32(d[c]);
            }
            if constexpr (!std::is_same_v<GP, float>) {
#pragma omp simd
                for (int c = 0; c < C; ++c) add_to(gp[c], a[c]);
            }
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Encoder

template <class S>
void encoder_forward(S * out, const int32_t * tokens, const S * wte, const S * wpe, int B, int T, int C,
                     int64_t vocab_lo, int64_t vocab_rows, const int32_t * doc_start) {
    const VocabShard shard{vocab_lo, vocab_rows};
    const int rows = B * T;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) {
        const int64_t e = shard.row(tokens[r]);
        S * o = out + static_cast<size_t>(r) * C;
        const S * w = e < 0 ? nullptr : wte + static_cast<size_t>(e) * C;
        const S * p = wpe == nullptr ? nullptr : wpe + static_cast<size_t>(token_position(doc_start, r, T)) * C;
        if (w != nullptr && p != nullptr) {
#pragma omp simd
            for (int c = 0; c < C; ++c) o[c] = from_f32<S>(to_f32(w[c]) + to_f32(p[c]));
        } else if (w != nullptr || p != nullptr) {
            // One term (a gather of token rows without position embedding, as in LLaMA, or the
            // position row alone for a token of another shard): copied exactly.
            const S * src = w != nullptr ? w : p;
#pragma omp simd
            for (int c = 0; c < C; ++c) o[c] = src[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; ++c) o[c] = from_f32<S>(0.0f);
        }
    }
}

template <class GE, class GP, class S>
void encoder_backward(GE * dwte, GP * dwpe, const S * dout, const int32_t * tokens, int B, int T, int C,
                      int64_t vocab_lo, int64_t vocab_rows, const int32_t * doc_start) {
    const VocabShard shard{vocab_lo, vocab_rows};
    if (doc_start != nullptr && dwpe != nullptr) {
        // Packed documents: positions repeat within a row, so dwpe's rows collide like dwte's;
        // they are summed as the table's are, with the positions for tokens.
        std::vector<int32_t> pos(static_cast<size_t>(B) * T);
        for (int r = 0; r < B * T; ++r) pos[static_cast<size_t>(r)] = token_position(doc_start, r, T);
        encoder_backward_wte(dwpe, dout, pos.data(), B * T, C, VocabShard{});
        if (dwte != nullptr) encoder_backward_wte(dwte, dout, tokens, B * T, C, shard);
        return;
    }
    if constexpr (std::is_same_v<GE, float> && std::is_same_v<GP, float>) {
        if (dwte != nullptr && dwpe != nullptr) {
            encoder_backward_fused(dwte, dwpe, dout, tokens, B, T, C, shard);
            return;
        }
    }
    if (dwpe != nullptr) encoder_backward_wpe(dwpe, dout, B, T, C);
    if (dwte != nullptr) encoder_backward_wte(dwte, dout, tokens, B * T, C, shard);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

template <class S>
void layernorm_forward(S * out, float * mean, float * rstd, const S * inp, const S * weight, const S * bias,
                       int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const S * x = inp + static_cast<size_t>(i) * C;
        S * o = out + static_cast<size_t>(i) * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; ++c) s += to_f32(x[c]);
        const float m = s / static_cast<float>(C);
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; ++c) {
            const float d = to_f32(x[c]) - m;
            v += d * d;
        }
        v /= static_cast<float>(C);
        const float r = 1.0f / std::sqrt(v + eps);
#pragma omp simd
        for (int c = 0; c < C; ++c)
            o[c] = from_f32<S>((to_f32(x[c]) - m) * r * to_f32(weight[c]) + to_f32(bias[c]));
        mean[i] = m;
        rstd[i] = r;
    }
}

template <class G, class S>
void layernorm_backward(S * dinp, G * dweight, G * dbias, const S * dout, const S * inp, const S * weight,
                        const float * mean, const float * rstd, int N, int C) {
    const float inv_c = 1.0f / static_cast<float>(C);
    // dinp: independent rows.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
        const size_t off = static_cast<size_t>(i) * C;
        const S * x = inp + off;
        const S * g = dout + off;
        S * dx = dinp + off;
        const float m = mean[i];
        const float r = rstd[i];
        float sum_dn = 0.0f;
        float sum_dnn = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dnn)
        for (int c = 0; c < C; ++c) {
            const float n = (to_f32(x[c]) - m) * r;
            const float dn = to_f32(weight[c]) * to_f32(g[c]);
            sum_dn += dn;
            sum_dnn += dn * n;
        }
        const float mean_dn = sum_dn * inv_c;
        const float mean_dnn = sum_dnn * inv_c;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
            const float n = (to_f32(x[c]) - m) * r;
            const float dn = to_f32(weight[c]) * to_f32(g[c]);
            add_to(dx[c], r * (dn - mean_dn - n * mean_dnn));
        }
    }
    // dweight, dbias: reductions over rows, parallel over column blocks (none for a frozen norm).
    if (!dweight) return;
    const int nblk = col_blocks(C);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, C - c0);
        float dw[kColBlock] = {};
        float db[kColBlock] = {};
        for (int i = 0; i < N; ++i) {
            const size_t off = static_cast<size_t>(i) * C + c0;
            const S * x = inp + off;
            const S * g = dout + off;
            const float m = mean[i];
            const float r = rstd[i];
#pragma omp simd
            for (int c = 0; c < nc; ++c) {
                dw[c] += to_f32(g[c]) * ((to_f32(x[c]) - m) * r);
                db[c] += to_f32(g[c]);
            }
        }
        for (int c = 0; c < nc; ++c) {
            add_to(dweight[c0 + c], dw[c]);
            add_to(dbias[c0 + c], db[c]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bias gradient, sum of squares

template <class G, class S>
void bias_backward(G * dbias, const S * dout, int N, int OC) {
    const int nblk = col_blocks(OC);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kColBlock;
        const int nc = std::min(kColBlock, OC - c0);
        float acc[kColBlock] = {};
        for (int i = 0; i < N; ++i) {
            const S * g = dout + static_cast<size_t>(i) * OC + c0;
#pragma omp simd
            for (int c = 0; c < nc; ++c) acc[c] += to_f32(g[c]);
        }
        for (int c = 0; c < nc; ++c) add_to(dbias[c0 + c], acc[c]);
    }
}

template <class S>
double sum_squares(const S * x, size_t n) {
    // Fixed-size chunks summed in parallel, then combined in chunk order: the result does not
    // depend on the thread count. An inf or NaN element makes the sum inf or NaN.
    constexpr size_t kChunk = size_t{1} << 16;
    const size_t nchunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(nchunks, 0.0);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; ++k) {
        const size_t lo = k * kChunk;
        const size_t hi = std::min(n, lo + kChunk);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; ++i) {
            const double d = static_cast<double>(to_f32(x[i]));
            s += d * d;
        }
        partial[k] = s;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

// ---------------------------------------------------------------------------------------------
// Instantiations: S in {float, bf16_t, f16_t}; parameter gradients float or S.

#define MF_INST_ALL(S)                                                                                  \
    template void encoder_forward<S>(S *, const int32_t *, const S *, const S *, int, int, int, int64_t, \
                                     int64_t, const int32_t *);                                         \
    template void encoder_backward<float, float, S>(float *, float *, const S *, const int32_t *, int,  \
                                                    int, int, int64_t, int64_t, const int32_t *);       \
    template void layernorm_forward<S>(S *, float *, float *, const S *, const S *, const S *, int, int, \
                                       float);                                                          \
    template void layernorm_backward<float, S>(S *, float *, float *, const S *, const S *, const S *,  \
                                               const float *, const float *, int, int);                 \
    template void bias_backward<float, S>(float *, const S *, int, int);                                \
    template double sum_squares<S>(const S *, size_t);
#define MF_INST_LOWP(S)                                                                                 \
    template void encoder_backward<S, S, S>(S *, S *, const S *, const int32_t *, int, int, int, int64_t, \
                                            int64_t, const int32_t *);                                  \
    template void encoder_backward<float, S, S>(float *, S *, const S *, const int32_t *, int, int, int,  \
                                                int64_t, int64_t, const int32_t *);                     \
    template void encoder_backward<S, float, S>(S *, float *, const S *, const int32_t *, int, int, int,  \
                                                int64_t, int64_t, const int32_t *);                     \
    template void layernorm_backward<S, S>(S *, S *, S *, const S *, const S *, const S *, const float *, \
                                           const float *, int, int);                                    \
    template void bias_backward<S, S>(S *, const S *, int, int);

MF_INST_ALL(float)
MF_INST_ALL(bf16_t)
MF_INST_ALL(f16_t)
MF_INST_LOWP(bf16_t)
MF_INST_LOWP(f16_t)
#undef MF_INST_ALL
#undef MF_INST_LOWP

}  // namespace memfit::cpu
