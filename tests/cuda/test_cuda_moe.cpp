// The mixture of experts' routing kernels (kernel_list.h's moe_*, kernels_moe.cu) on the GPU
// against the CPU backend (tests/cuda/op_check.h): N = 37 tokens over E = 6 experts, k = 2 and 3,
// the top k's weights normalised or not, f32 and bf16 logits and activations. The route (offsets,
// order, slot, expert) must be the CPU's exactly, and a route (slot the inverse of order, each
// expert's choices in token order inside its offsets); some tokens' logits tie (the lower expert
// first). moe_route_bwd reads two layers' statistics, both written by moe_route, with nonzero
// load-balancing and z-loss weights.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/moe.h"
#include "core/dtype.h"
#include "op_check.h"

namespace memfit::test {
namespace {

using Ts = std::vector<Tensor>;
constexpr int64_t kN = 37, kE = 6, kC = 24, kF = 20;

// Bound on rel() of an output stored as dt (fp32 results: summation order and expf's rounding).
double ftol(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }

MoeDesc desc(int k, bool norm, int layer) {
    MoeDesc d;
    d.experts = int(kE);
    d.top_k = k;
    d.norm_topk = norm;
    d.aux_scale = 4.0f;
    d.z_scale = 1.5f;
    d.layers = 2;
    d.layer = layer;
    return d;
}

// Router logits [N, E] in [-3, 3), seeded by `seed`; every fourth token has ties: expert pairs
// (2i, 2i+1) share a value, and token 5's logits are all equal (the top k: experts 0 .. k-1).
std::vector<float> logits_values(unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    std::vector<float> v(size_t(kN * kE));
    for (auto & x : v) x = u(rng);
    for (int64_t n = 0; n < kN; n += 4)
        for (int64_t e = 1; e < kE; e += 2) v[size_t(n * kE + e)] = v[size_t(n * kE + e - 1)];
    for (int64_t e = 0; e < kE; ++e) v[size_t(5 * kE + e)] = 0.25f;
    return v;
}

std::vector<float> part(const std::vector<float> & v, int64_t at, int64_t n) {
    return std::vector<float>(v.begin() + at, v.begin() + at + n);
}

// Route i (backend/moe.h's layout) the same on both backends, part for part, and the GPU's a
// valid route.
void expect_same_route(const OpCheck & op, int i, const MoeDesc & d, bool token_order = true) {
    const std::vector<float> a = op.cpu(i), b = op.gpu(i);
    const int64_t E = d.experts, NK = kN * d.top_k;
    ASSERT_EQ(int64_t(b.size()), moe_route_elems(kN, d));
    struct Part {
        const char * name;
        int64_t at, n;
    };
    for (const Part & p : {Part{"offsets", 0, E + 1}, Part{"order", E + 1, NK}, Part{"slot", E + 1 + NK, NK},
                           Part{"expert", E + 1 + 2 * NK, NK}})
        EXPECT_EQ(part(a, p.at, p.n), part(b, p.at, p.n)) << "the route's " << p.name;
    const float * off = b.data(), * order = off + E + 1, * slot = order + NK, * expert = slot + NK;
    EXPECT_EQ(off[0], 0.0f);
    EXPECT_EQ(off[E], float(NK));
    for (int64_t e = 0; e < E; ++e) EXPECT_LE(off[e], off[e + 1]);
    for (int64_t s = 0; s < NK; ++s) {
        const int64_t c = int64_t(order[s]);
        ASSERT_TRUE(c >= 0 && c < NK) << "slot " << s;
        EXPECT_EQ(slot[c], float(s)) << "slot is not order's inverse at choice " << c;
        const int64_t e = int64_t(expert[c]);
        ASSERT_TRUE(e >= 0 && e < E) << "choice " << c;
        EXPECT_TRUE(float(s) >= off[e] && float(s) < off[e + 1]) << "slot " << s << " outside expert " << e;
        if (token_order && s > 0 && float(s) > off[e]) {
            EXPECT_LT(order[s - 1], order[s]) << "token order within expert " << e;
        }
    }
    for (int64_t n = 0; n < kN; ++n)   // a token's experts are distinct
        for (int j = 0; j < d.top_k; ++j)
            for (int q = 0; q < j; ++q) EXPECT_NE(expert[n * d.top_k + q], expert[n * d.top_k + j]);
}

// Rows [d.layers, 2E+1] of statistics: tokens per expert exactly, the probability sums and the
// squared log-sum-exps' sum within fp32's bound; the counts total N*k per layer.
void expect_same_stats(const OpCheck & op, int i, const MoeDesc & d) {
    const std::vector<float> a = op.cpu(i), b = op.gpu(i);
    const int64_t E = d.experts, W = moe_stats_width(d);
    ASSERT_EQ(int64_t(b.size()), d.layers * W);
    for (int64_t l = 0; l < d.layers; ++l) {
        SCOPED_TRACE(testing::Message() << "layer " << l);
        EXPECT_EQ(part(a, l * W, E), part(b, l * W, E)) << "tokens per expert";
        EXPECT_LT(rel(part(a, l * W + E, E), part(b, l * W + E, E)), kTolF32) << "probability sums";
        EXPECT_LT(rel(part(a, l * W + 2 * E, 1), part(b, l * W + 2 * E, 1)), kTolF32) << "squared lse sum";
        float total = 0;
        for (int64_t e = 0; e < E; ++e) total += b[size_t(l * W + e)];
        EXPECT_EQ(total, float(kN * d.top_k));
    }
}

TEST(CudaMoe, RouteMatchesTheCpu) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16})
        for (const int k : {2, 3})
            for (const bool norm : {true, false}) {
                SCOPED_TRACE(testing::Message() << dtype_name(dt) << " k " << k << (norm ? " normalised" : ""));
                const MoeDesc d0 = desc(k, norm, 0), d1 = desc(k, norm, 1);
                const int64_t W = moe_stats_width(d0), R = moe_route_elems(kN, d0);
                OpCheck op;
                const int logits0 = op.values(dt, {kN, kE}, logits_values(11));
                const int logits1 = op.values(dt, {kN, kE}, logits_values(12));
                const int route0 = op.ints({R}, -5, 100);   // written: start from garbage
                const int route1 = op.ints({R}, -5, 100);
                const int wts0 = op.rand(DType::f32, {kN, k});
                const int wts1 = op.rand(DType::f32, {kN, k});
                const int stats = op.rand(DType::f32, {2, W});
                const int dwts = op.rand(DType::f32, {kN, k});
                const int dlogits = op.rand(dt, {kN, kE});
                op.run([&](Backend & be, const Ts & t) {
                    be.moe_route(t[route0], t[wts0], t[stats].view(0, {W}), t[logits0], d0);
                    be.moe_route(t[route1], t[wts1], t[stats].view(W, {W}), t[logits1], d1);
                    be.moe_route_bwd(t[dlogits], t[dwts], t[logits1], t[route1], t[wts1], t[stats], d1);
                });
                {
                    SCOPED_TRACE("layer 0's route");
                    expect_same_route(op, route0, d0);
                }
                {
                    SCOPED_TRACE("layer 1's route");
                    expect_same_route(op, route1, d1);
                }
                EXPECT_LT(op.rel_err(wts0), kTolF32);
                EXPECT_LT(op.rel_err(wts1), kTolF32);
                expect_same_stats(op, stats, d1);
                EXPECT_LT(op.rel_err(dlogits), ftol(dt));
                if (norm) {   // the k weights sum to 1
                    const std::vector<float> w = op.gpu(wts1);
                    for (int64_t n = 0; n < kN; ++n) {
                        float s = 0;
                        for (int j = 0; j < k; ++j) s += w[size_t(n * k + j)];
                        EXPECT_NEAR(s, 1.0f, 1e-5f) << "token " << n;
                    }
                }
            }
}

// The dispatch (gather), its backward (scatter, written and accumulated), the combine and the
// combine's backward through the weights, on a route moe_route makes on each backend (the same,
// as RouteMatchesTheCpu checks; compared again here).
TEST(CudaMoe, DispatchMatchesTheCpu) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16})
        for (const int k : {2, 3})
            for (const bool norm : {true, false}) {
                SCOPED_TRACE(testing::Message() << dtype_name(dt) << " k " << k << (norm ? " normalised" : ""));
                MoeDesc d = desc(k, norm, 0);
                d.layers = 1;
                const int64_t W = moe_stats_width(d), R = moe_route_elems(kN, d), NK = kN * k;
                OpCheck op;
                const int logits = op.values(dt, {kN, kE}, logits_values(21));
                const int route = op.zeros(DType::i32, {R});
                const int wts = op.zeros(DType::f32, {kN, k});
                const int stats = op.zeros(DType::f32, {W});
                const int x = op.rand(dt, {kN, kC});
                const int xs = op.rand(dt, {NK, kC});   // written
                const int dxs = op.rand(dt, {NK, kC});
                const int dx = op.rand(dt, {kN, kC});   // written
                const int dx_acc = op.rand(dt, {kN, kC});
                const int y = op.rand(dt, {NK, kC});
                const int out = op.rand(dt, {kN, kC});   // written
                const int g = op.rand(dt, {NK, kF});
                const int act = op.rand(dt, {NK, kF});
                const int dys = op.rand(dt, {NK, kC});
                const int dwts = op.rand(DType::f32, {kN, k});   // written
                op.run([&](Backend & be, const Ts & t) {
                    be.moe_route(t[route], t[wts], t[stats], t[logits], d);
                    be.moe_gather(t[xs], t[x], t[route], d);
                    be.moe_scatter(t[dx], t[dxs], t[route], d, false);
                    be.moe_scatter(t[dx_acc], t[dxs], t[route], d, true);
                    be.moe_combine(t[out], t[y], t[wts], t[route], d);
                    be.moe_weight_bwd(t[dwts], t[g], t[dys], t[act], t[wts], t[route], d);
                });
                expect_same_route(op, route, d);
                EXPECT_LT(op.rel_err(wts), kTolF32);
                EXPECT_EQ(mismatches(op, xs), 0) << "the gather copies rows";
                EXPECT_LT(op.rel_err(dx), ftol(dt));
                EXPECT_LT(op.rel_err(dx_acc), ftol(dt));
                EXPECT_LT(op.rel_err(out), ftol(dt));
                EXPECT_LT(op.rel_err(dwts), kTolF32);
                EXPECT_LT(op.rel_err(g), ftol(dt));
                EXPECT_LT(op.rel_err(dys), ftol(dt));
            }
}

// Expert parallelism's capacity layout (backend/moe.h): a capacity below the busiest expert's
// load drops its later choices; the counts, the dropped total, the padded gather, the combine and
// scatter over kept choices only, and the weights' backward with g alone (dys invalid) match.
TEST(CudaMoe, CapacityLayoutMatchesTheCpu) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16})
        for (const int64_t cap : {int64_t(5), kN}) {
            const bool probs = dt == DType::f32;   // the drop policy: probs, or position
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " capacity " << cap << (probs ? " probs" : ""));
            const int k = 2;
            MoeDesc d = desc(k, true, 0);
            d.drop_probs = probs;
            d.layers = 1;
            const int64_t W = moe_stats_width(d), R = moe_route_elems(kN, d), rows = kE * cap;
            OpCheck op;
            const int logits = op.values(dt, {kN, kE}, logits_values(23));
            const int route = op.zeros(DType::i32, {R});
            const int wts = op.zeros(DType::f32, {kN, k});
            const int stats = op.zeros(DType::f32, {W});
            const int counts = op.zeros(DType::i32, {kE});
            const int x = op.rand(dt, {kN, kC});
            const int xs = op.rand(dt, {rows, kC});   // written, pads zero
            const int dxs = op.rand(dt, {rows, kC});
            const int dx = op.rand(dt, {kN, kC});   // written
            const int y = op.rand(dt, {rows, kC});
            const int out = op.rand(dt, {kN, kC});   // written
            const int g = op.rand(dt, {rows, kC});
            const int dwts = op.rand(DType::f32, {kN, k});   // written
            op.run([&](Backend & be, const Ts & t) {
                MoeDesc c = d;
                be.moe_route(t[route], t[wts], t[stats], t[logits], c);
                c.capacity = cap;
                be.moe_counts(t[counts], t[stats], t[route], t[wts], c);
                be.moe_gather(t[xs], t[x], t[route], c);
                be.moe_scatter(t[dx], t[dxs], t[route], c, false);
                be.moe_combine(t[out], t[y], t[wts], t[route], c);
                be.moe_weight_bwd(t[dwts], t[g], Tensor{}, t[y], t[wts], t[route], c);
            });
            expect_same_route(op, route, d, !(probs && cap < kN));   // probs: spans over it by weight
            EXPECT_EQ(mismatches(op, counts), 0);
            EXPECT_LT(op.rel_err(stats), kTolF32) << "the dropped total with the statistics";
            const std::vector<float> st = op.cpu(stats);
            if (cap < kN) EXPECT_GT(st[size_t(2 * kE + 1)], 0.0f) << "a capacity of 5 drops choices";
            else EXPECT_EQ(st[size_t(2 * kE + 1)], 0.0f);
            EXPECT_EQ(mismatches(op, xs), 0) << "the gather copies rows and zeroes the rest";
            EXPECT_LT(op.rel_err(dx), ftol(dt));
            EXPECT_LT(op.rel_err(out), ftol(dt));
            EXPECT_LT(op.rel_err(dwts), kTolF32);
            EXPECT_LT(op.rel_err(g), ftol(dt));
        }
}

}  // namespace
}  // namespace memfit::test
