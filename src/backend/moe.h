// Mixture of experts' routing (model/moe.h): N token rows, each sent to k of E experts. The
// dispatched rows are the N*k (token, choice) pairs in expert order, a fixed total however they
// fall, so every buffer has its size before the step (dropless routing: no capacity, nothing
// dropped). The route, one i32 buffer moe_route writes:
//   offsets [E+1]  expert e's rows are slots offsets[e] .. offsets[e+1] - 1 (offsets[E] = N*k)
//   order   [N*k]  slot s holds choice order[s] = n*k + j (token n's j-th expert)
//   slot    [N*k]  choice n*k + j sits at slot[n*k + j]
//   expert  [N*k]  the expert of choice n*k + j (its probability's rank j among the E)
// Choices keep token order within an expert (a counting sort): deterministic.
//
// Expert parallelism (model/expert_parallel.h) uses the capacity layout instead (MoeDesc::
// capacity C > 0): expert e's first C routed rows, in the route's order, are rows e*C .. e*C+C-1
// of an [E*C, cols] buffer (the rest of its rows zero), and its choices past C are dropped
// (Megatron-LM's "position" drop policy; with MoeDesc::drop_probs, moe_counts first orders an
// expert's span by weight, its "probs" policy). moe_gather, moe_scatter, moe_combine and
// moe_weight_bwd read and write that layout when capacity > 0; moe_gemm then reads counts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace memfit {

struct MoeDesc {
    int experts = 0, top_k = 0;
    bool norm_topk = true;   // the k weights divided by their sum
    // Backward (moe_route_bwd): the load-balancing loss's and the z-loss's weights in this
    // micro-batch's gradient (coefficient x the loss gradient's scale), the sparse layers whose
    // statistics the stats buffer holds (rows of moe_stats_width), and this layer's row.
    float aux_scale = 0, z_scale = 0;
    int layers = 1, layer = 0;
    // The stats buffer holds the sums over this many ranks' tokens (an expert-parallel group's,
    // all-reduced before backward), each rank's batch alike.
    int stat_ranks = 1;
    // The capacity layout (above): rows per expert; 0: dropless.
    int64_t capacity = 0;
    // moe_gemm with capacity > 0: its `route` is counts [reps * experts] (i32) and group g's rows
    // are g*capacity .. + counts[g], by expert g % experts (one block per source rank).
    int reps = 1;
    // Under a capacity: an expert over it keeps its `capacity` most probable choices (Megatron-LM's
    // "probs" drop policy; moe_counts reorders its span by weight), else its first ("position").
    bool drop_probs = false;
};

inline int64_t moe_route_elems(int64_t N, const MoeDesc & d) { return d.experts + 1 + 3 * N * d.top_k; }
// The routed rows of N tokens: N*k in expert order, or the capacity layout's E*capacity.
inline int64_t moe_rows(int64_t N, const MoeDesc & d) { return d.capacity > 0 ? d.experts * d.capacity : N * d.top_k; }
// A layer's statistics (f32): tokens per expert [E], the router probabilities summed over the
// tokens [E], the squared log-sum-exps of the router logits summed [1], and the choices dropped
// past the capacity [1] (moe_counts; 0 when dropless).
inline int64_t moe_stats_width(const MoeDesc & d) { return 2 * int64_t(d.experts) + 2; }

// Megatron-LM's capacity per expert for N tokens: ceil(factor * N * k / E), at most N (a token
// picks an expert once).
inline int64_t moe_capacity_rows(int64_t N, int top_k, int experts, double factor) {
    const double c = factor * double(N) * double(top_k) / double(experts);
    return std::min(N, std::max<int64_t>(1, int64_t(std::ceil(c))));
}

// The route's parts.
struct MoeRoute {
    const int32_t * offsets, * order, * slot, * expert;
    MoeRoute(const int32_t * r, int64_t N, const MoeDesc & d)
        : offsets(r), order(r + d.experts + 1), slot(order + N * d.top_k), expert(slot + N * d.top_k) {}
    // The capacity layout's row of choice c, or -1 when it is dropped.
    int64_t capacity_row(int64_t c, int64_t capacity) const {
        const int32_t e = expert[c];
        const int64_t pos = slot[c] - offsets[e];
        return pos < capacity ? int64_t(e) * capacity + pos : -1;
    }
};

// The grouped matmul's forms (moe_gemm), W the experts' stack [E, M, K] (each [out, in]):
//   fwd     c [N*k, M] = a [N*k, K] . W_e^T   (each expert's rows by its own matrix)
//   data    c [N*k, K] = a [N*k, M] . W_e
//   weight  c [E, M, K] += a_e^T [M, rows] . b_e [rows, K]   (a: d(output), b: the input)
enum class MoeGemm { fwd, data, weight };

// Rows per matmul call of a grouped matmul: an expert's rows run as calls of kMoeTile rows and
// the rest as calls of powers of two, so the shapes a step can issue are few and known before it
// (their workspace is the largest of them).
constexpr int64_t kMoeTile = 1024;

}  // namespace memfit
