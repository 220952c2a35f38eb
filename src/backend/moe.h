// Mixture of experts' routing (model/moe.h): N token rows, each sent to k of E experts. The
// dispatched rows are the N*k (token, choice) pairs in expert order, a fixed total however they
// fall, so every buffer has its size before the step (dropless routing: no capacity, nothing
// dropped). The route, one i32 buffer moe_route writes:
//   offsets [E+1]  expert e's rows are slots offsets[e] .. offsets[e+1] - 1 (offsets[E] = N*k)
//   order   [N*k]  slot s holds choice order[s] = n*k + j (token n's j-th expert)
//   slot    [N*k]  choice n*k + j sits at slot[n*k + j]
//   expert  [N*k]  the expert of choice n*k + j (its probability's rank j among the E)
// Choices keep token order within an expert (a counting sort): deterministic.
#pragma once

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
};

inline int64_t moe_route_elems(int64_t N, const MoeDesc & d) { return d.experts + 1 + 3 * N * d.top_k; }
// A layer's statistics (f32): tokens per expert [E], the router probabilities summed over the
// tokens [E], and the squared log-sum-exps of the router logits summed [1].
inline int64_t moe_stats_width(const MoeDesc & d) { return 2 * int64_t(d.experts) + 1; }

// The route's parts.
struct MoeRoute {
    const int32_t * offsets, * order, * slot, * expert;
    MoeRoute(const int32_t * r, int64_t N, const MoeDesc & d)
        : offsets(r), order(r + d.experts + 1), slot(order + N * d.top_k), expert(slot + N * d.top_k) {}
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
