// --optimizer sgd: PyTorch's SGD with momentum (buf = momentum * buf + g + wd * p, p -= lr * buf)
// against a float64 reference over three steps, with clipping by the global norm and the bf16
// compute copy written in the same pass; and a skipped step changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "optim_ops.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::host_view;
using test::adamw_op;
using test::adamw_8bit_op;
using test::sgd_op;

TEST(Sgd, MatchesTheDoubleReference) {
    CpuBackend be;
    const size_t n = 2049;
    std::mt19937 rng(12);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> p(n), buf(n, 0.0f), g(n), norm(1);
    std::vector<uint16_t> copy(n, 0);
    for (auto & x : p) x = nd(rng);
    std::vector<double> rp(p.begin(), p.end()), rb(n, 0.0);
    OptimHyper h;
    h.lr = 0.05f, h.momentum = 0.9f, h.weight_decay = 0.01f, h.clip = 1.0f;
    for (int t = 1; t <= 3; ++t) {
        double ss = 0;
        for (auto & x : g) x = nd(rng), ss += double(x) * double(x);
        norm[0] = float(ss);
        sgd_op(be, host_view(p, DType::f32), host_view(g, DType::f32), host_view(buf, DType::f32), host_view(norm, DType::f32),
               host_view(copy, DType::bf16), h);
        const double scale = std::min(1.0, double(h.clip) / std::sqrt(double(norm[0])));
        for (size_t i = 0; i < n; ++i) {
            const double gi = double(g[i]) * scale + double(h.weight_decay) * rp[i];
            rb[i] = double(h.momentum) * rb[i] + gi;
            rp[i] -= double(h.lr) * rb[i];
            ASSERT_NEAR(buf[i], rb[i], 1e-5 * (1 + std::fabs(rb[i]))) << "buf, step " << t << " " << i;
            ASSERT_NEAR(p[i], rp[i], 1e-5 * (1 + std::fabs(rp[i]))) << "p, step " << t << " " << i;
            ASSERT_EQ(copy[i], f32_to_bf16(p[i])) << i;
        }
    }
    const std::vector<float> before = p;
    norm[0] = NAN;
    h.skip_nonfinite = true;
    sgd_op(be, host_view(p, DType::f32), host_view(g, DType::f32), host_view(buf, DType::f32), host_view(norm, DType::f32), Tensor{}, h);
    EXPECT_EQ(p, before);
}

}  // namespace
}  // namespace memfit
