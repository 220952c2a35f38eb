// sparse24, the 2:4 packed storage (backend/quant_format.h): exactly 9/16 of bf16's bytes; packing
// a dense matrix keeps the two largest magnitudes of every group of four (as bf16, at their
// positions); packing a 2:4 matrix of bf16 values is lossless; and the CPU's packed matmul equals
// the dense matmul of the same weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "core/dtype.h"
#include "test_util.h"

namespace memfit {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    return test::randn(n, rng, 0.05f);
}

// W pruned 2:4 along rows (nm_keep's choice) and rounded to bf16: what a 2:4-trained model holds.
std::vector<float> pruned_bf16(std::vector<float> W) {
    for (size_t g = 0; g < W.size(); g += 4) {
        bool keep[4];
        nm_keep(W.data() + g, 1, 2, 4, keep);
        for (size_t j = 0; j < 4; ++j) W[g + j] = keep[j] ? bf16_to_f32(f32_to_bf16(W[g + j])) : 0.0f;
    }
    return W;
}

// W [out, in] packed by the CPU backend.
std::vector<uint8_t> pack(const CpuBackend & be, int64_t out, int64_t in, const std::vector<float> & W) {
    std::vector<uint8_t> packed(quant_bytes(QuantDesc{QuantFormat::sparse24, out, in}));
    be.quantize(QuantDesc{QuantFormat::sparse24, out, in}, packed.data(), W.data());
    return packed;
}

TEST(Sparse24, BytesAreNineSixteenthsOfBf16) {
    for (const int64_t out : {2, 8, 200, 4096})
        for (const int64_t in : {4, 64, 1056, 11008}) {
            const size_t bf16 = size_t(out * in) * 2, packed = quant_bytes(QuantDesc{QuantFormat::sparse24, out, in});
            EXPECT_EQ(packed * 16, bf16 * 9) << out << " x " << in;   // 0.5625 exactly
            EXPECT_EQ(packed, sparse24_bytes(out, in));
        }
    EXPECT_EQ(quant_bytes(QuantDesc{QuantFormat::sparse24, 4096, 4096}), size_t(18874368));   // 16 MiB of values + 2 MiB
}

TEST(Sparse24, PackingKeepsTheTwoLargestOfFour) {
    const int64_t out = 6, in = 16;
    std::vector<float> W = gaussian(size_t(out * in), 1);
    W[0] = 0.25f, W[1] = -0.25f, W[2] = 0.25f, W[3] = 0.1f;   // a tie: the lower indices stay
    const Sparse24Quant Q{out, in};
    std::vector<uint8_t> packed(Q.bytes());
    Q.quantize(packed.data(), W.data());
    std::vector<float> Wd(W.size(), std::nanf(""));
    Q.dequantize_rows(Wd.data(), packed.data(), 0, out);
    EXPECT_EQ(std::vector<float>(Wd.begin(), Wd.begin() + 4), (std::vector<float>{0.25f, -0.25f, 0.0f, 0.0f}));
    for (size_t g = 0; g < W.size(); g += 4) {
        int kept = 0;
        for (size_t j = 0; j < 4; ++j) {
            if (Wd[g + j] == 0.0f) continue;
            ++kept;
            EXPECT_EQ(Wd[g + j], bf16_to_f32(f32_to_bf16(W[g + j])));   // the value, rounded to bf16
            for (size_t k = 0; k < 4; ++k) {   // nothing dropped is larger
                if (Wd[g + k] == 0.0f) {
                    EXPECT_GE(std::fabs(W[g + j]), std::fabs(W[g + k])) << g + j;
                }
            }
        }
        EXPECT_EQ(kept, 2) << "group " << g / 4;
    }
    // Rows from the middle: the same values.
    std::vector<float> rows(size_t(2 * in));
    Q.dequantize_rows(rows.data(), packed.data(), 3, 2);
    EXPECT_EQ(0, std::memcmp(rows.data(), Wd.data() + 3 * in, rows.size() * sizeof(float)));
}

TEST(Sparse24, LosslessOnTwoFourBf16Weights) {
    const int64_t out = 40, in = 72;
    const std::vector<float> W = pruned_bf16(gaussian(size_t(out * in), 2));
    CpuBackend be;
    const std::vector<uint8_t> packed = pack(be, out, in, W);
    std::vector<float> Wd(W.size());
    be.dequantize(QuantDesc{QuantFormat::sparse24, out, in}, Wd.data(), packed.data());
    EXPECT_EQ(Wd, W);
}

// y = x W^T through the packed bytes equals the dense gemm of the same (2:4, bf16) weights, and
// so does the input gradient dx = dy W; f32 activations, two row tiles (out > the tile's rows).
TEST(Sparse24, PackedMatmulEqualsDense) {
    const int64_t M = 7, out = 260, in = 1024;
    const std::vector<float> W = pruned_bf16(gaussian(size_t(out * in), 3));
    std::vector<float> x = gaussian(size_t(M * in), 4), dy = gaussian(size_t(M * out), 5);
    CpuBackend be;
    const QuantDesc q{QuantFormat::sparse24, out, in};
    std::vector<uint8_t> packed = pack(be, out, in, W);
    std::vector<float> ws(be.qgemm_workspace(q, M, DType::f32) / sizeof(float) + 1);
    auto view = [](std::vector<float> & v, std::initializer_list<int64_t> dims) {
        Tensor t(-1, DType::f32, dims);
        t.data = v.data();
        return t;
    };
    Tensor pk(-1, DType::u8, {int64_t(packed.size())}), wst(-1, DType::u8, {int64_t(ws.size() * sizeof(float))});
    pk.data = packed.data();
    wst.data = ws.data();
    std::vector<float> Wc = W, y_packed(size_t(M * out)), y_dense(size_t(M * out));
    std::vector<float> dx_packed(size_t(M * in)), dx_dense(size_t(M * in));
    be.qgemm_fwd(q, view(y_packed, {M, out}), view(x, {M, in}), pk, Tensor{}, wst);
    be.qgemm_bwd(q, view(dx_packed, {M, in}), view(dy, {M, out}), pk, false, wst);
    GemmDesc fwd;
    fwd.M = M, fwd.N = out, fwd.K = in, fwd.trans_b = true;
    std::vector<float> dense_ws(be.gemm_workspace(fwd) / sizeof(float) + 1);
    be.gemm(fwd, view(y_dense, {M, out}), view(x, {M, in}), view(Wc, {out, in}), Tensor{},
            view(dense_ws, {int64_t(dense_ws.size())}));
    GemmDesc bwd;
    bwd.M = M, bwd.N = in, bwd.K = out;
    dense_ws.assign(be.gemm_workspace(bwd) / sizeof(float) + 1, 0.0f);
    be.gemm(bwd, view(dx_dense, {M, in}), view(dy, {M, out}), view(Wc, {out, in}), Tensor{},
            view(dense_ws, {int64_t(dense_ws.size())}));
    // The same products; only the summation's blocking may differ (the packed gemm runs row tiles).
    auto close = [](const std::vector<float> & a, const std::vector<float> & b) {
        double worst = 0, scale = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
            scale = std::max(scale, std::fabs(double(b[i])));
        }
        return worst / scale;
    };
    EXPECT_LT(close(y_packed, y_dense), 1e-5);
    EXPECT_LT(close(dx_packed, dx_dense), 1e-5);
}

}  // namespace
}  // namespace memfit
