// --master-weights bf16-sr: AdamW on bf16 weights with stochastic rounding (backend/stochastic_round.h).
// Against a float64 reference update, every stored weight is one of the two bf16 values around
// it; over many draws the rounding is unbiased, so an update far below half a bf16 step moves the
// weights on average where rounding to nearest would leave them; and the draws depend on the
// element's flat index only, so updating a tensor in pieces changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/moments8.h"
#include "backend/stochastic_round.h"
#include "core/dtype.h"
#include "optim_ops.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::host_view;
using test::adamw_op;
using test::adamw_8bit_op;
using test::sgd_op;

// The bf16 values just below and above x (equal when x is one).
std::pair<double, double> bf16_around(double x) {
    const float f = float(x);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const float lo = bf16_to_f32(uint16_t(u >> 16)), hi = bf16_to_f32(uint16_t((u >> 16) + 1));
    if (double(lo) == x) return {lo, lo};
    return f >= 0 ? std::pair<double, double>{lo, hi} : std::pair<double, double>{hi, lo};
}

TEST(AdamWSr, Bf16WeightsStayBetweenTheNeighboursOfTheDoubleReference) {
    CpuBackend be;
    const size_t n = 3001;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> p(n);
    std::vector<float> m(n, 0.0f), v(n, 0.0f), g(n);
    for (auto & x : p) x = f32_to_bf16(nd(rng));
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f, h.sr_seed = 77;
    for (int t = 1; t <= 3; ++t) {
        for (auto & x : g) x = 0.5f * nd(rng);
        const std::vector<uint16_t> before = p;
        h.t = t;
        adamw_op(be, host_view(p, DType::bf16), host_view(g, DType::f32), host_view(m, DType::f32), host_view(v, DType::f32), Tensor{},
                 Tensor{}, h);
        const double bc1 = 1 - std::pow(double(h.beta1), t), bc2 = 1 - std::pow(double(h.beta2), t);
        size_t up = 0, moved = 0;
        for (size_t i = 0; i < n; ++i) {
            // m and v are the kernel's (fp32, checked by LowpAdamW); the weight against float64.
            const double exact = double(bf16_to_f32(before[i])) * (1 - double(h.lr) * h.weight_decay) -
                                 h.lr * (double(m[i]) / bc1) / (std::sqrt(double(v[i]) / bc2) + h.eps);
            const auto [lo, hi] = bf16_around(exact);
            const double got = bf16_to_f32(p[i]);
            const double slack = 1e-6 * std::fabs(exact);   // the kernel's fp32 arithmetic
            ASSERT_TRUE((got >= std::min(lo, hi) - slack && got <= std::max(lo, hi) + slack)) << i << " " << exact;
            up += got == hi && hi != lo;
            moved += p[i] != before[i];
        }
        EXPECT_GT(up, n / 5) << "no rounding away from zero";
        EXPECT_GT(moved, n / 2);
    }
}

// An update of a tenth of a bf16 step: rounding to nearest never moves the weight; stochastic
// rounding moves a tenth of the elements by one step, the mean displacement the update itself.
TEST(AdamWSr, TinyUpdatesAreKeptInExpectation) {
    CpuBackend be;
    const size_t n = 20000;
    const float w = 1.0f, step = 1.0f / 128;   // bf16's spacing at 1
    std::vector<uint16_t> p(n, f32_to_bf16(w));
    std::vector<float> m(n, 0.0f), v(n, 0.0f), g(n, 1.0f);
    OptimHyper h;   // the first step of Adam moves every weight by lr (m/sqrt(v) = 1)
    h.lr = step / 10, h.eps = 0, h.sr_seed = 3;
    adamw_op(be, host_view(p, DType::bf16), host_view(g, DType::f32), host_view(m, DType::f32), host_view(v, DType::f32), Tensor{}, Tensor{}, h);
    double mean = 0;
    for (uint16_t x : p) mean += double(bf16_to_f32(x)) - w;
    mean /= double(n);
    EXPECT_NEAR(mean, -double(h.lr), 0.05 * double(h.lr));   // sd of the mean: 0.021 lr
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(w - h.lr)), w) << "rounding to nearest would have lost the update";
}

// The draws follow the flat index (sr_at + i): one call or two pieces, the same bits; 8-bit moments
// too. Another seed rounds differently.
TEST(AdamWSr, PiecesAndSeedsDrawByTheFlatIndex) {
    CpuBackend be;
    const size_t n = 2 * kMoments8Block + 40, cut = kMoments8Block;
    std::mt19937 rng(8);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> p0(n);
    std::vector<float> g(n);
    for (auto & x : p0) x = f32_to_bf16(nd(rng));
    for (auto & x : g) x = nd(rng);
    for (bool eight : {false, true}) {
        SCOPED_TRACE(eight ? "8-bit moments" : "fp32 moments");
        auto run = [&](uint64_t seed, bool split) {
            std::vector<uint16_t> p = p0;
            std::vector<float> m(n, 0.0f), v(n, 0.0f), ms(moments8_blocks(n), 0.0f), vs(ms.size(), 0.0f);
            std::vector<uint8_t> m8(n, 0), v8(n, 0);
            OptimHyper h;
            h.lr = 1e-3f, h.sr_seed = seed;
            auto part = [&](size_t a, size_t b) {
                auto sub = [&](auto & vec, DType dt, size_t x, size_t y) {
                    return host_view(vec, dt, x, int64_t(y - x));
                };
                h.sr_at = a;
                if (eight)
                    adamw_8bit_op(be, sub(p, DType::bf16, a, b), sub(g, DType::f32, a, b), sub(m8, DType::u8, a, b),
                                  sub(v8, DType::u8, a, b), sub(ms, DType::f32, a / kMoments8Block, moments8_blocks(b)),
                                  sub(vs, DType::f32, a / kMoments8Block, moments8_blocks(b)), Tensor{}, Tensor{}, h);
                else
                    adamw_op(be, sub(p, DType::bf16, a, b), sub(g, DType::f32, a, b), sub(m, DType::f32, a, b),
                             sub(v, DType::f32, a, b), Tensor{}, Tensor{}, h);
            };
            if (split) part(0, cut), part(cut, n);
            else part(0, n);
            return p;
        };
        EXPECT_EQ(run(11, false), run(11, true));
        EXPECT_NE(run(11, false), run(12, false));
    }
}

}  // namespace
}  // namespace memfit
