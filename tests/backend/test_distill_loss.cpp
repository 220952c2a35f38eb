// The distillation loss kernels (Backend::distill_fwd / distill_bwd) on the CPU:
//   - against PyTorch in float64 (tests/data/distill_loss.json, make_distill_fixture.py: F.kl_div
//     of log_softmax(z / T) against softmax(t / T) times T^2 plus the cross-entropy, gradients by
//     autograd), for alpha 0, 0.3, 0.5, 0.9, 1 and T 0.5, 1, 2, 4, with a dominant logit, a nearly
//     uniform teacher and an ignored row;
//   - alpha = 0 is the cross-entropy (xent_fwd / xent_bwd's numbers); a teacher equal to the
//     student at alpha = 1 gives a zero loss and zero gradients; the teacher's row becomes q.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace memfit {
namespace {

Tensor host(std::vector<float> & v, std::initializer_list<int64_t> dims) {
    Tensor t(-1, DType::f32, dims);
    t.data = v.data();
    return t;
}
Tensor host(std::vector<int32_t> & v, std::initializer_list<int64_t> dims) {
    Tensor t(-1, DType::i32, dims);
    t.data = v.data();
    return t;
}

struct Fixture {
    int64_t N = 0, V = 0;
    float dloss = 0;
    std::vector<float> z, t;
    std::vector<int32_t> targets;
    nlohmann::json cases;
};

Fixture load() {
    std::ifstream in(std::string(MEMFIT_TEST_DATA) + "/distill_loss.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    Fixture f;
    f.N = j["N"], f.V = j["V"], f.dloss = j["dloss"];
    for (double x : j["logits"]) f.z.push_back(float(x));
    for (double x : j["teacher"]) f.t.push_back(float(x));
    for (int x : j["targets"]) f.targets.push_back(x);
    f.cases = j["cases"];
    return f;
}

TEST(DistillLoss, MatchesPyTorchInFloat64) {
    const Fixture f = load();
    ASSERT_EQ(f.cases.size(), 5u);
    CpuBackend cpu;
    for (const auto & c : f.cases) {
        const float alpha = c["alpha"], temp = c["temperature"];
        std::vector<float> z = f.z, t = f.t, losses(size_t(f.N), -1.0f), stats(size_t(2 * f.N));
        std::vector<int32_t> tg = f.targets;
        cpu.distill_fwd(host(losses, {f.N}), host(stats, {2, f.N}), host(z, {f.N, f.V}), host(t, {f.N, f.V}),
                        host(tg, {f.N}), alpha, temp);
        for (int64_t i = 0; i < f.N; ++i) {
            const double want = c["losses"][size_t(i)];
            EXPECT_NEAR(losses[size_t(i)], want, 2e-5 * std::max(1.0, std::fabs(want)))
                << "alpha " << alpha << " T " << temp << " row " << i;
        }
        EXPECT_EQ(losses[4], 0.0f);   // the ignored row
        EXPECT_EQ(z, f.z) << "the student's logits are read only";
        double qsum = 0;
        for (int64_t j = 0; j < f.V; ++j) qsum += t[size_t(j)];
        EXPECT_NEAR(qsum, 1.0, 1e-6) << "the teacher's row became its softmax at T";
        cpu.distill_bwd(host(z, {f.N, f.V}), host(stats, {2, f.N}), host(t, {f.N, f.V}), host(tg, {f.N}), alpha, temp,
                        f.dloss);
        double worst = 0;
        for (size_t k = 0; k < z.size(); ++k) worst = std::max(worst, std::fabs(double(z[k]) - double(c["dlogits"][k])));
        EXPECT_LT(worst, 2e-7) << "alpha " << alpha << " T " << temp;
    }
}

TEST(DistillLoss, AlphaZeroIsTheCrossEntropy) {
    const int64_t N = 9, V = 301;
    std::mt19937 rng(1);
    std::vector<float> z = test::randn(size_t(N * V), rng, 2.5f), t = test::randn(size_t(N * V), rng, 2.5f);
    std::vector<int32_t> tg = {0, 300, 5, -100, 17, 250, 1, 2, 3};
    std::vector<float> zx = z, lx(static_cast<size_t>(N)), ld(static_cast<size_t>(N)), stats(static_cast<size_t>(2 * N));
    CpuBackend cpu;
    cpu.xent_fwd(host(lx, {N}), host(zx, {N, V}), host(tg, {N}));
    cpu.xent_bwd(host(zx, {N, V}), host(tg, {N}), 0.125f);
    cpu.distill_fwd(host(ld, {N}), host(stats, {2, N}), host(z, {N, V}), host(t, {N, V}), host(tg, {N}), 0.0f, 3.0f);
    cpu.distill_bwd(host(z, {N, V}), host(stats, {2, N}), host(t, {N, V}), host(tg, {N}), 0.0f, 3.0f, 0.125f);
    for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(ld[size_t(i)], lx[size_t(i)], 1e-5f) << i;
    for (size_t k = 0; k < z.size(); ++k) ASSERT_NEAR(z[k], zx[k], 1e-7f) << k;   // 0.125 x probabilities
}

TEST(DistillLoss, TeacherEqualToStudentTeachesNothing) {
    const int64_t N = 4, V = 1000;
    std::mt19937 rng(3);
    std::vector<float> z = test::randn(size_t(N * V), rng, 4.0f), t = z, losses(static_cast<size_t>(N)), stats(static_cast<size_t>(2 * N));
    std::vector<int32_t> tg = {1, 2, 3, 4};
    CpuBackend cpu;
    for (float temp : {0.25f, 1.0f, 8.0f}) {
        std::vector<float> zz = z, tt = t;
        cpu.distill_fwd(host(losses, {N}), host(stats, {2, N}), host(zz, {N, V}), host(tt, {N, V}), host(tg, {N}), 1.0f,
                        temp);
        for (float l : losses) EXPECT_NEAR(l, 0.0f, 2e-5f * temp * temp) << "T " << temp;
        cpu.distill_bwd(host(zz, {N, V}), host(stats, {2, N}), host(tt, {N, V}), host(tg, {N}), 1.0f, temp, 1.0f);
        for (float g : zz) ASSERT_NEAR(g, 0.0f, 2e-6f) << "T " << temp;   // exp(z / T) rounds at 1/T times the scale
    }
}

}  // namespace
}  // namespace memfit
