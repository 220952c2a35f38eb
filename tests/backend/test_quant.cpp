// Frozen-weight quantization (backend/quant_format.h, backend/cpu/quant.h): round-trip error
// statistics on Gaussian weights against the expectations for int8 per-channel absmax and NF4
// (QLoRA), exact packing, zero blocks, exact sizes, and the dequantizing matmuls (forward and dX)
// against a double reference over X · dequantize(W)^T with several tile sizes and an exact-size
// workspace.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/dnnl_gemm.h"
#include "backend/cpu/quant.h"
#include "test_util.h"

namespace memfit::cpu {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    return memfit::test::randn(n, rng);
}

double rel_rms(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(a[i]) * double(a[i]);
    }
    return std::sqrt(num / den);
}

template <class Q>
std::vector<float> round_trip(const Q & q, const std::vector<float> & W) {
    std::vector<uint8_t> packed(q.bytes());
    q.quantize(packed.data(), W.data());
    std::vector<float> d(W.size());
    q.dequantize_rows(d.data(), packed.data(), 0, q.out);
    return d;
}

// A plain uniform 4-bit absmax quantizer (levels k/7, k = -7..7) in blocks of 64, for comparison.
std::vector<float> uniform4_round_trip(const std::vector<float> & W) {
    std::vector<float> d(W.size());
    for (size_t b = 0; b < W.size(); b += 64) {
        float m = 0;
        for (size_t i = b; i < b + 64; ++i) m = std::max(m, std::fabs(W[i]));
        for (size_t i = b; i < b + 64; ++i) d[i] = m > 0 ? std::round(W[i] / m * 7.0f) / 7.0f * m : 0.0f;
    }
    return d;
}

constexpr int64_t kOut = 256, kIn = 1024;

TEST(Quant, Int8RoundTripGaussian) {
    const std::vector<float> W = gaussian(size_t(kOut * kIn), 1234);
    const Int8Quant q{kOut, kIn};
    const std::vector<float> d = round_trip(q, W);
    // Rounding to a grid of step s = max|W[o,:]|/127 leaves an error uniform in [-s/2, s/2]:
    // rms s/sqrt(12) per element, never more than s/2. With max|W[o,:]| about 3.2-3.5 for 1024
    // N(0,1) samples the relative rms is about 3.3/127/sqrt(12) = 0.0075; 0.012 allows a row
    // maximum up to 5.3 (probability < 1e-4 per row).
    double pred = 0;
    for (int64_t o = 0; o < kOut; ++o) {
        float m = 0;
        for (int64_t k = 0; k < kIn; ++k) m = std::max(m, std::fabs(W[size_t(o * kIn + k)]));
        const float s = m / 127.0f;
        pred += double(s) * double(s) / 12.0 * double(kIn);
        for (int64_t k = 0; k < kIn; ++k)
            ASSERT_LE(std::fabs(W[size_t(o * kIn + k)] - d[size_t(o * kIn + k)]), 0.5f * s * (1 + 1e-5f));
    }
    const double rel = rel_rms(W, d);
    pred = std::sqrt(pred / double(kOut * kIn));  // relative: ||W||^2 / n is about 1
    std::printf("[quant] int8 per-channel: relative rms error %.5f (uniform-error model %.5f)\n", rel, pred);
    EXPECT_LT(rel, 0.012);
    EXPECT_NEAR(rel, pred, 0.1 * pred);
}

TEST(Quant, Nf4RoundTripGaussian) {
    const std::vector<float> W = gaussian(size_t(kOut * kIn), 1234);
    const Nf4Quant q{kOut, kIn, false};
    const double rel = rel_rms(W, round_trip(q, W));
    const double rel_u = rel_rms(W, uniform4_round_trip(W));
    std::printf("[quant] nf4 block 64: relative rms error %.5f; uniform 4-bit absmax: %.5f\n", rel, rel_u);
    // A broken codebook (e.g. uniform levels, or codes off by one) lands outside (0.05, 0.12).
    EXPECT_GT(rel, 0.05);
    EXPECT_LT(rel, 0.12);
    EXPECT_LT(rel, rel_u);
}

TEST(Quant, Nf4DoubleQuant) {
    const std::vector<float> W = gaussian(size_t(kOut * kIn), 1234);
    const double rel = rel_rms(W, round_trip(Nf4Quant{kOut, kIn, false}, W));
    const double rel_dq = rel_rms(W, round_trip(Nf4Quant{kOut, kIn, true}, W));
    const size_t b = nf4_bytes(kOut * kIn, false), b_dq = nf4_bytes(kOut * kIn, true);
    std::printf("[quant] nf4 double quant: relative rms error %.6f (without %.6f, ratio %.6f); "
                "bytes %zu vs %zu (%.3f vs %.3f bits/weight)\n",
                rel_dq, rel, rel_dq / rel, b_dq, b, 8.0 * double(b_dq) / double(kOut * kIn),
                8.0 * double(b) / double(kOut * kIn));
    EXPECT_LT(rel_dq, 1.05 * rel);
    EXPECT_LT(b_dq, b);
}

TEST(Quant, Sizes) {
    EXPECT_EQ(int8_bytes(256, 1024), size_t(256 * 1024 + 256 * 4));
    EXPECT_EQ(int8_bytes(3, 5), size_t(15 + 12));
    EXPECT_EQ(nf4_bytes(64, false), size_t(32 + 4));
    EXPECT_EQ(nf4_bytes(64, true), size_t(32 + 1 + 4 + 4));
    // 256 blocks of 64: one second-level scale; 257 blocks: two.
    EXPECT_EQ(nf4_bytes(64 * 256, true), size_t(64 * 128 + 256 + 4 + 4));
    EXPECT_EQ(nf4_bytes(64 * 257, true), size_t(64 * 257 / 2 + 257 + 8 + 4));
    EXPECT_EQ(nf4_bytes(64 * 257, false), size_t(64 * 257 / 2 + 257 * 4));
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH((void)nf4_bytes(100, false), "assertion failed: n > 0 && n % kNf4Block == 0");
}

// quantize writes every byte of its buffer (two different fills give the same bytes) and
// nothing past it.
template <class Q>
void check_exact_write(const Q & q, const std::vector<float> & W) {
    const size_t n = q.bytes(), guard = 64;
    std::vector<uint8_t> a(n + guard, 0x00), b(n + guard, 0xff);
    q.quantize(a.data(), W.data());
    q.quantize(b.data(), W.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n));
    for (size_t i = n; i < n + guard; ++i) {
        ASSERT_EQ(a[i], 0x00);
        ASSERT_EQ(b[i], 0xff);
    }
}

TEST(Quant, ExactBuffers) {
    const int64_t out = 40, in = 96 * 9;  // 540 NF4 blocks: 3 second-level blocks, the last partial
    const std::vector<float> W = gaussian(size_t(out * in), 7);
    check_exact_write(Int8Quant{out, in}, W);
    check_exact_write(Nf4Quant{out, in, false}, W);
    check_exact_write(Nf4Quant{out, in, true}, W);
}

TEST(Quant, Nf4CodesAndLevelsExact) {
    for (int i = 0; i < 16; ++i) EXPECT_EQ(nf4_code(kNf4Levels[i]), i);
    EXPECT_EQ(nf4_code(-2.0f), 0);
    EXPECT_EQ(nf4_code(2.0f), 15);
    EXPECT_EQ(nf4_code(0.01f), 7);

    // Each block: absmax a_b times random levels, with one element at +-1 so that a_b is the
    // block's absmax. Without double quantization every element dequantizes to itself, and the
    // codes are the level indices, element 2j in the low nibble of byte j.
    const int64_t out = 6, in = 96;  // blocks straddle rows
    const int64_t n = out * in;
    std::mt19937 rng(99);
    std::uniform_int_distribution<int> lev(0, 15);
    std::uniform_real_distribution<float> amp(0.01f, 5.0f);
    std::vector<float> W(static_cast<size_t>(n));
    std::vector<int> code(static_cast<size_t>(n));
    for (int64_t b = 0; b < n / 64; ++b) {
        const float a = amp(rng);
        for (int64_t i = b * 64; i < (b + 1) * 64; ++i) {
            code[size_t(i)] = i == b * 64 + 5 ? (b % 2 ? 0 : 15) : lev(rng);
            W[size_t(i)] = a * kNf4Levels[code[size_t(i)]];
        }
    }
    const Nf4Quant q{out, in, false};
    std::vector<uint8_t> packed(q.bytes());
    q.quantize(packed.data(), W.data());
    for (int64_t i = 0; i < n; ++i) {
        const int c = (i % 2) ? packed[size_t(i / 2)] >> 4 : packed[size_t(i / 2)] & 15;
        ASSERT_EQ(c, code[size_t(i)]) << "element " << i;
    }
    std::vector<float> d(static_cast<size_t>(n));
    q.dequantize_rows(d.data(), packed.data(), 0, out);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(d[size_t(i)], W[size_t(i)]) << "element " << i;
    // Row ranges agree with the whole.
    for (int64_t r0 = 0; r0 < out; ++r0)
        for (int64_t nr = 1; r0 + nr <= out; ++nr) {
            std::vector<float> part(size_t(nr * in));
            q.dequantize_rows(part.data(), packed.data(), r0, nr);
            ASSERT_EQ(0, std::memcmp(part.data(), d.data() + r0 * in, part.size() * sizeof(float)));
        }
}

TEST(Quant, Int8Codes) {
    // The row maximum maps to +-127; values on the grid round-trip to within an ulp.
    const int64_t out = 3, in = 8;
    std::vector<float> W = {1, -2, 0.5f, 0, 0, 0, 0, 0,
                            -4, 1, 2, 3, 0, 0, 0, 0,
                            0, 0, 0, 0, 0, 0, 0, 0};
    const Int8Quant q{out, in};
    std::vector<uint8_t> packed(q.bytes());
    q.quantize(packed.data(), W.data());
    EXPECT_EQ(int8_t(packed[1]), -127);
    EXPECT_EQ(int8_t(packed[8]), -127);
    EXPECT_EQ(int8_t(packed[11]), 95);  // 3/4*127 = 95.25
    float s0;
    std::memcpy(&s0, packed.data() + out * in, 4);
    EXPECT_FLOAT_EQ(s0, 2.0f / 127.0f);
    std::vector<float> d(size_t(out * in));
    q.dequantize_rows(d.data(), packed.data(), 0, out);
    EXPECT_FLOAT_EQ(d[1], -2.0f);
    EXPECT_FLOAT_EQ(d[8], -4.0f);
    for (int k = 0; k < in; ++k) EXPECT_EQ(d[size_t(2 * in + k)], 0.0f);
}

TEST(Quant, ZeroBlocks) {
    // Zero rows / blocks (and an all-zero weight, where the double-quant scale is 0 too).
    const int64_t out = 4, in = 128;
    std::vector<float> W = gaussian(size_t(out * in), 3);
    std::fill(W.begin() + in, W.begin() + 2 * in, 0.0f);      // row 1: two zero NF4 blocks
    std::fill(W.begin() + 3 * in, W.begin() + 3 * in + 64, 0.0f);
    const std::vector<float> Z(size_t(out * in), 0.0f);
    const std::vector<float> * cases[] = {&W, &Z};
    for (const std::vector<float> * w : cases) {
        const std::vector<float> d8 = round_trip(Int8Quant{out, in}, *w);
        const std::vector<float> d4 = round_trip(Nf4Quant{out, in, false}, *w);
        const std::vector<float> d4q = round_trip(Nf4Quant{out, in, true}, *w);
        for (size_t i = 0; i < w->size(); ++i) {
            ASSERT_TRUE(std::isfinite(d8[i]) && std::isfinite(d4[i]) && std::isfinite(d4q[i]));
            if ((*w)[i] == 0.0f) {
                ASSERT_EQ(d8[i], 0.0f);
                ASSERT_EQ(d4[i], 0.0f);
                ASSERT_EQ(d4q[i], 0.0f);
            }
        }
    }
}

// A workspace of exactly `bytes` followed by guard bytes that must stay untouched.
struct Guarded {
    static constexpr size_t kGuard = 256;
    size_t bytes;
    std::vector<float> storage;  // float-aligned
    explicit Guarded(size_t b) : bytes(b), storage((b + kGuard) / sizeof(float) + 1) {
        std::memset(storage.data(), 0x5a, storage.size() * sizeof(float));
    }
    void * data() { return storage.data(); }
    bool guard_intact() const {
        const auto * p = reinterpret_cast<const uint8_t *>(storage.data());
        for (size_t i = bytes; i < bytes + kGuard; ++i)
            if (p[i] != 0x5a) return false;
        return true;
    }
};

template <class Q>
void check_gemm(const Q & q, uint32_t seed) {
    DnnlGemm gemm;
    const int64_t M = 37, out = q.out, in = q.in;
    const std::vector<float> W = gaussian(size_t(out * in), seed);
    std::vector<uint8_t> packed(q.bytes());
    q.quantize(packed.data(), W.data());
    std::vector<float> Wd(size_t(out * in));
    q.dequantize_rows(Wd.data(), packed.data(), 0, out);
    const std::vector<float> X = gaussian(size_t(M * in), seed + 1);
    const std::vector<float> dY = gaussian(size_t(M * out), seed + 2);
    const std::vector<float> dX0 = gaussian(size_t(M * in), seed + 3);

    // References in double, with the sums of |terms| for an elementwise bound.
    std::vector<double> Yr(size_t(M * out)), Ya(size_t(M * out)), dXr(size_t(M * in), 0.0), dXa(size_t(M * in), 0.0);
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t o = 0; o < out; ++o) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < in; ++k) {
                const double t = double(X[size_t(m * in + k)]) * double(Wd[size_t(o * in + k)]);
                s += t;
                a += std::fabs(t);
            }
            Yr[size_t(m * out + o)] = s;
            Ya[size_t(m * out + o)] = a;
        }
        for (int64_t o = 0; o < out; ++o)
            for (int64_t k = 0; k < in; ++k) {
                const double t = double(dY[size_t(m * out + o)]) * double(Wd[size_t(o * in + k)]);
                dXr[size_t(m * in + k)] += t;
                dXa[size_t(m * in + k)] += std::fabs(t);
            }
    }

    for (const int64_t tile : {int64_t{1}, int64_t{7}, int64_t{64}, out - 1, out, out + 50}) {
        SCOPED_TRACE("tile_rows " + std::to_string(tile));
        const size_t ws_bytes = gemm_dequant_workspace(gemm, M, out, in, tile);
        EXPECT_GE(ws_bytes, size_t(std::min(tile, out) * in) * sizeof(float));
        Guarded ws(ws_bytes);

        std::vector<float> Y(size_t(M * out), std::nanf(""));
        gemm_dequant_forward(gemm, Y.data(), X.data(), q, packed.data(), M, tile, ws.data());
        double num = 0, den = 0;
        for (size_t i = 0; i < Y.size(); ++i) {
            const double e = std::fabs(double(Y[i]) - Yr[i]);
            ASSERT_LE(e, 1e-5 * Ya[i] + 1e-30) << "Y element " << i;
            num += e * e;
            den += Yr[i] * Yr[i];
        }
        EXPECT_LT(std::sqrt(num / den), 1e-5);
        EXPECT_TRUE(ws.guard_intact());

        for (const bool acc : {false, true}) {
            std::vector<float> dX = acc ? dX0 : std::vector<float>(size_t(M * in), std::nanf(""));
            gemm_dequant_backward(gemm, dX.data(), dY.data(), q, packed.data(), M, tile, ws.data(), acc);
            num = den = 0;
            for (size_t i = 0; i < dX.size(); ++i) {
                const double ref = dXr[i] + (acc ? double(dX0[i]) : 0.0);
                const double e = std::fabs(double(dX[i]) - ref);
                ASSERT_LE(e, 1e-5 * (dXa[i] + (acc ? std::fabs(double(dX0[i])) : 0.0)) + 1e-30)
                    << "dX element " << i << " accumulate " << acc;
                num += e * e;
                den += ref * ref;
            }
            EXPECT_LT(std::sqrt(num / den), 1e-5);
            EXPECT_TRUE(ws.guard_intact());
        }
    }
}

// in = 96: rows do not align with the 64-element NF4 blocks.
TEST(Quant, GemmDequantInt8) { check_gemm(Int8Quant{200, 96}, 11); }
TEST(Quant, GemmDequantNf4) { check_gemm(Nf4Quant{200, 96, false}, 21); }
TEST(Quant, GemmDequantNf4DoubleQuant) { check_gemm(Nf4Quant{200, 96, true}, 31); }

TEST(Quant, ByteRatios) {
    // Reference numbers for a LLaMA-7B-like projection (4096 x 4096) against bf16 (2 bytes).
    const int64_t out = 4096, in = 4096;
    const double bf16 = 2.0 * double(out * in);
    const double r8 = double(int8_bytes(out, in)) / bf16;
    const double r4 = double(nf4_bytes(out * in, false)) / bf16;
    const double r4q = double(nf4_bytes(out * in, true)) / bf16;
    std::printf("[quant] bytes vs bf16 (4096x4096): int8 %.4f, nf4 %.4f, nf4+double quant %.4f\n", r8, r4, r4q);
    EXPECT_NEAR(r8, 0.5, 0.001);
    EXPECT_NEAR(r4, 0.28125, 1e-6);   // 4.5 bits / 16
    EXPECT_GT(r4q, 0.25);
    EXPECT_LT(r4q, 0.2581);           // 4 + 8/64 + 32/(64*256) = 4.127 bits / 16 = 0.2579
}

}  // namespace
}  // namespace memfit::cpu
