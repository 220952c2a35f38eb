// N:M sparsity's masked updates on the device (OptimHyper::keep_zeros): every optimizer kernel
// leaves a zero weight at exactly zero and sets its moments to zero, as the CPU's do, and updates
// the other elements as the CPU does; fp32 weights with a bf16 copy, bf16-sr weights, 8-bit
// moments and SGD.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/moments8.h"
#include "op_check.h"
#include "optim_ops.h"

namespace memfit::test {
namespace {

// Weights with every other pair exactly zero (a 2:4 pattern), the rest U(-1, 1).
std::vector<float> pruned_weights(int64_t n) {
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[size_t(i)] = (i / 2) % 2 ? 0.0f : u(rng);
    return w;
}

// Both backends' results: zero where the weight was zero (weights and the listed states), and
// within rel of each other.
void expect_kept_zeros(const OpCheck & c, const std::vector<float> & w0, int param, std::initializer_list<int> states,
                       double rel) {
    std::vector<int> all(states);
    all.push_back(param);
    for (const bool device : {false, true})
        for (const int k : all) {
            const std::vector<float> x = device ? c.gpu(k) : c.cpu(k);
            for (size_t i = 0; i < w0.size(); ++i)
                if (w0[i] == 0.0f) {
                    ASSERT_EQ(x[i], 0.0f) << (device ? "gpu" : "cpu") << " tensor " << k << " at " << i;
                }
        }
    EXPECT_LE(c.rel_err(param), rel);
}

TEST(CudaSparsity, AdamWKeepsZeros) {
    MF_REQUIRE_GPU();
    const int64_t n = 4099;
    const std::vector<float> w0 = pruned_weights(n);
    OpCheck c;
    const int param = c.values(DType::f32, {n}, w0), grad = c.rand(DType::bf16, {n}, -0.5f, 0.5f);
    const int m = c.rand(DType::f32, {n}, -0.05f, 0.05f), v = c.rand(DType::f32, {n}, 0.0f, 0.01f);
    const int copy = c.zeros(DType::bf16, {n}), nsq = c.zeros(DType::f32, {1});
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f, h.t = 3, h.clip = 1.0f, h.keep_zeros = true;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        b.sum_squares(at(nsq), at(grad));
        adamw_op(b, at(param), at(grad), at(m), at(v), at(nsq), at(copy), h);
    });
    expect_kept_zeros(c, w0, param, {m, v, copy}, 1e-5);
    EXPECT_LE(c.rel_err(m), 1e-5);
}

TEST(CudaSparsity, SrAndEightBitMomentsKeepZeros) {
    MF_REQUIRE_GPU();
    const int64_t n = 3 * int64_t(kMoments8Block) + 77, nb = int64_t(moments8_blocks(size_t(n)));
    const std::vector<float> w0 = pruned_weights(n);
    OpCheck c;
    const int param = c.values(DType::bf16, {n}, w0), grad = c.rand(DType::f32, {n}, -0.5f, 0.5f);
    const int m = c.zeros(DType::u8, {n}), v = c.zeros(DType::u8, {n});
    const int ms = c.zeros(DType::f32, {nb}), vs = c.zeros(DType::f32, {nb});
    OptimHyper h;
    h.lr = 1e-3f, h.weight_decay = 0.1f, h.sr_seed = 99, h.sr_at = 12345, h.keep_zeros = true;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        adamw_8bit_op(b, at(param), at(grad), at(m), at(v), at(ms), at(vs), Tensor{}, Tensor{}, h);
    });
    expect_kept_zeros(c, w0, param, {m, v}, tol(DType::bf16));
}

TEST(CudaSparsity, SgdKeepsZeros) {
    MF_REQUIRE_GPU();
    const int64_t n = 3001;
    const std::vector<float> w0 = pruned_weights(n);
    OpCheck c;
    const int param = c.values(DType::f32, {n}, w0), grad = c.rand(DType::f32, {n}, -0.5f, 0.5f);
    const int buf = c.rand(DType::f32, {n}, -0.1f, 0.1f);
    OptimHyper h;
    h.lr = 0.05f, h.momentum = 0.9f, h.weight_decay = 0.01f, h.keep_zeros = true;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        sgd_op(b, at(param), at(grad), at(buf), Tensor{}, Tensor{}, h);
    });
    expect_kept_zeros(c, w0, param, {buf}, 1e-5);
    EXPECT_LE(c.rel_err(buf), 1e-5);
}

}  // namespace
}  // namespace memfit::test
