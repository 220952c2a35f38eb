// Tests of the FlashAttention-style CPU kernels (backend/cpu/kernels_flash.h):
//   - forward out against the naive attention_forward, lse against a double-precision reference;
//   - backward dqkv against the naive attention_backward and against central finite differences;
//   - dqkv and the outputs are written, not accumulated (buffers pre-filled with NaN);
//   - bitwise determinism across runs and across thread counts;
//   - the scratch size is linear in T.
// Plus one timing test (naive vs flash), which prints and asserts nothing about speed.
#include "backend/cpu/kernels_flash.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "test_util.h"

namespace memfit::cpu {
using memfit::test::ThreadScope;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kNaiveTol = 1e-5;  // norm-wise relative error against the naive kernels
constexpr double kFdTol = 1e-2;     // norm-wise relative error of the finite-difference check
constexpr float kFdEps = 1e-3f;

using memfit::test::randn;

// ||a - b|| / ||b|| in double; NaN (so every `< tol` check fails) when anything is NaN.
double rel_err(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - b[i];
        num += d * d;
        den += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(num) / std::sqrt(den);
}

bool bitwise_equal(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
    int B, T, C, NH;
};

// T: 1, below a 64-row tile, exactly one tile, one past it, two tiles and a bit, and more.
// hs = C/NH from 8 to 80: 8 and 10 (below the 16-column register block; 10 also leaves single
// columns), 16, 32, 64, and 80 (above the forward's 64-column chunks).
constexpr Shape kShapes[] = {
    {1, 1, 8, 1},    {2, 7, 16, 2},   {1, 64, 64, 1},  {2, 65, 96, 3},  {1, 130, 64, 4},
    {1, 130, 256, 4}, {2, 65, 40, 4}, {1, 130, 30, 3}, {1, 97, 160, 2}, {3, 200, 32, 4},
};

std::string name(const Shape & s) {
    return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
           " NH=" + std::to_string(s.NH);
}

struct FlashRun {
    std::vector<float> out, lse, dqkv;
};

FlashRun run_flash(const std::vector<float> & qkv, const std::vector<float> & dout, const Shape & s,
                   float fill = kNaN) {
    FlashRun r{std::vector<float>(size_t(s.B) * s.T * s.C, fill),
               std::vector<float>(size_t(s.B) * s.NH * s.T, fill),
               std::vector<float>(qkv.size(), fill)};
    std::vector<float> scratch(flash_attention_scratch_floats(s.B, s.T, s.C, s.NH, DType::f32), fill);
    flash_attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    flash_attention_backward(r.dqkv.data(), scratch.data(), dout.data(), r.out.data(), qkv.data(),
                             r.lse.data(), s.B, s.T, s.C, s.NH);
    return r;
}

TEST(CpuFlashAttention, ForwardMatchesNaiveAndLseMatchesDouble) {
    for (const Shape & s : kShapes) {
        for (const float qk_scale : {1.0f, 3.0f}) {  // 3.0: peaked softmax, large running-max moves
            std::mt19937 rng(11);
            const int hs = s.C / s.NH;
            const std::vector<float> qkv = randn(size_t(s.B) * s.T * 3 * s.C, rng, qk_scale);
            std::vector<float> out(size_t(s.B) * s.T * s.C, kNaN);
            std::vector<float> lse(size_t(s.B) * s.NH * s.T, kNaN);
            flash_attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);

            std::vector<float> ref(out.size(), kNaN), att(size_t(s.B) * s.NH * s.T * s.T);
            attention_forward(ref.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
            EXPECT_LT(rel_err(out, ref), kNaiveTol) << name(s) << " scale=" << qk_scale;

            // lse = log sum_{t2 <= t} exp(q_t . k_t2 / sqrt(hs)), in double.
            double max_err = 0.0;
            for (int b = 0; b < s.B; ++b)
                for (int h = 0; h < s.NH; ++h)
                    for (int t = 0; t < s.T; ++t) {
                        auto at = [&](int tt, int part, int i) {
                            const size_t row = size_t(b) * s.T + tt;
                            const size_t col = size_t(part) * s.C + size_t(h) * hs + i;
                            return double(qkv[row * 3 * s.C + col]);
                        };
                        std::vector<double> sc(t + 1);
                        double mx = -1e300;
                        for (int t2 = 0; t2 <= t; ++t2) {
                            double d = 0.0;
                            for (int i = 0; i < hs; ++i) d += at(t, 0, i) * at(t2, 1, i);
                            sc[t2] = d / std::sqrt(double(hs));
                            mx = std::max(mx, sc[t2]);
                        }
                        double sum = 0.0;
                        for (const double x : sc) sum += std::exp(x - mx);
                        const double want = mx + std::log(sum);
                        const double got = lse[(size_t(b) * s.NH + h) * s.T + t];
                        const double err = std::fabs(got - want) / std::max(1.0, std::fabs(want));
                        max_err = std::max(max_err, err);
                    }
            EXPECT_LT(max_err, 1e-5) << name(s) << " scale=" << qk_scale;
        }
    }
}

TEST(CpuFlashAttention, BackwardMatchesNaive) {
    for (const Shape & s : kShapes) {
        std::mt19937 rng(12);
        const std::vector<float> qkv = randn(size_t(s.B) * s.T * 3 * s.C, rng, 1.5f);
        const std::vector<float> dout = randn(size_t(s.B) * s.T * s.C, rng);
        const FlashRun f = run_flash(qkv, dout, s);

        std::vector<float> out(dout.size()), att(size_t(s.B) * s.NH * s.T * s.T);
        std::vector<float> dqkv(qkv.size(), kNaN), scratch(size_t(s.B) * s.NH * s.T);
        attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B,
                           s.T, s.C, s.NH);
        EXPECT_LT(rel_err(f.dqkv, dqkv), kNaiveTol) << name(s);
        // Each of dq, dk, dv separately (dv alone dominates the norm for peaked softmaxes).
        for (int part = 0; part < 3; ++part) {
            std::vector<float> a, b;
            for (size_t row = 0; row < size_t(s.B) * s.T; ++row)
                for (int c = 0; c < s.C; ++c) {
                    const size_t i = row * 3 * s.C + size_t(part) * s.C + c;
                    a.push_back(f.dqkv[i]);
                    b.push_back(dqkv[i]);
                }
            if (s.T > 1 || part == 2) {
                EXPECT_LT(rel_err(a, b), kNaiveTol) << name(s) << " part=" << part;
            } else {
                // At T = 1, dq and dk are zero: dS = P (dP - D) with P = 1 and dP = D up to
                // rounding (dout . v summed in two different orders).
                for (const float x : a) EXPECT_NEAR(x, 0.0f, 1e-6f) << name(s) << " part=" << part;
            }
        }
    }
}

TEST(CpuFlashAttention, BackwardMatchesFiniteDifferences) {
    // One shape inside a tile, one across a tile boundary (key tile 1 masked on its diagonal).
    for (const Shape & s : {Shape{2, 5, 8, 2}, Shape{1, 70, 16, 2}}) {
        std::mt19937 rng(13);
        std::vector<float> qkv = randn(size_t(s.B) * s.T * 3 * s.C, rng);
        const std::vector<float> R = randn(size_t(s.B) * s.T * s.C, rng);
        const FlashRun f = run_flash(qkv, R, s);

        std::vector<float> out(R.size()), lse(size_t(s.B) * s.NH * s.T);
        auto loss = [&] {
            flash_attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
            double l = 0.0;
            for (size_t i = 0; i < out.size(); ++i) l += double(out[i]) * R[i];
            return l;
        };
        const ThreadScope single(1);  // thousands of tiny calls
        std::vector<float> num(qkv.size());
        for (size_t i = 0; i < qkv.size(); ++i) {
            const float x0 = qkv[i];
            qkv[i] = x0 + kFdEps;
            const float xp = qkv[i];
            const double lp = loss();
            qkv[i] = x0 - kFdEps;
            const float xm = qkv[i];
            const double lm = loss();
            qkv[i] = x0;
            num[i] = float((lp - lm) / (double(xp) - double(xm)));
        }
        EXPECT_LT(rel_err(f.dqkv, num), kFdTol) << name(s);
    }
}

TEST(CpuFlashAttention, OutputsAreWrittenNotAccumulated) {
    const Shape s{2, 130, 64, 4};
    std::mt19937 rng(14);
    const std::vector<float> qkv = randn(size_t(s.B) * s.T * 3 * s.C, rng);
    const std::vector<float> dout = randn(size_t(s.B) * s.T * s.C, rng);
    const FlashRun nan_filled = run_flash(qkv, dout, s, kNaN);
    const FlashRun value_filled = run_flash(qkv, dout, s, 7.0f);
    EXPECT_TRUE(bitwise_equal(nan_filled.out, value_filled.out));
    EXPECT_TRUE(bitwise_equal(nan_filled.lse, value_filled.lse));
    EXPECT_TRUE(bitwise_equal(nan_filled.dqkv, value_filled.dqkv));
    for (const float x : nan_filled.dqkv) ASSERT_TRUE(std::isfinite(x));
}

TEST(CpuFlashAttention, BitwiseDeterministicAcrossRunsAndThreadCounts) {
    const Shape s{2, 200, 96, 3};
    std::mt19937 rng(15);
    const std::vector<float> qkv = randn(size_t(s.B) * s.T * 3 * s.C, rng);
    const std::vector<float> dout = randn(size_t(s.B) * s.T * s.C, rng);
    FlashRun one, two_a, two_b;
    {
        const ThreadScope threads(1);
        one = run_flash(qkv, dout, s);
    }
    {
        const ThreadScope threads(2);
        two_a = run_flash(qkv, dout, s);
        two_b = run_flash(qkv, dout, s);
    }
    for (const FlashRun * r : {&two_a, &two_b}) {
        EXPECT_TRUE(bitwise_equal(one.out, r->out));
        EXPECT_TRUE(bitwise_equal(one.lse, r->lse));
        EXPECT_TRUE(bitwise_equal(one.dqkv, r->dqkv));
    }
}

TEST(CpuFlashAttention, ScratchIsLinearInT) {
    for (const Shape & s : {Shape{1, 1, 8, 1}, Shape{4, 512, 768, 12}, Shape{3, 97, 160, 2}}) {
        const size_t s1 = flash_attention_scratch_floats(s.B, s.T, s.C, s.NH, DType::f32);
        for (const int f : {2, 4, 16}) {
            const size_t sf = flash_attention_scratch_floats(s.B, f * s.T, s.C, s.NH, DType::f32);
            EXPECT_LE(sf, f * s1 + 16) << name(s) << " x" << f;
            EXPECT_GE(sf, s1) << name(s) << " x" << f;
        }
        // Far below the naive kernel's B*NH*T*T attention matrix at long T, in any dtype.
        const int T = 2048;
        for (const DType dt : {DType::f32, DType::bf16, DType::f16})
            EXPECT_LT(flash_attention_scratch_floats(s.B, T, s.C, s.NH, dt), size_t(s.B) * s.NH * T * T / 16)
                << name(s);
    }
}

// bf16/f16 storage: up to 1024 positions the backward holds each head's dQ in fp32 beside a
// seventh tile, one pass; beyond, fp32's scratch (two passes). Never more than the shape's fp32
// dQ and one tile per head above fp32's scratch.
TEST(CpuFlashAttention, LowPrecisionScratchHoldsDqUpTo1024Positions) {
    for (const Shape & s : {Shape{1, 1, 8, 1}, Shape{4, 512, 768, 12}, Shape{3, 97, 160, 2}})
        for (const int T : {1, 64, 97, 1024, 1025, 4096}) {
            const size_t f32 = flash_attention_scratch_floats(s.B, T, s.C, s.NH, DType::f32);
            const size_t pairs = size_t(s.B) * s.NH, hs = size_t(s.C / s.NH);
            for (const DType dt : {DType::bf16, DType::f16})
                EXPECT_EQ(flash_attention_scratch_floats(s.B, T, s.C, s.NH, dt),
                          f32 + (T <= 1024 ? pairs * (64 + size_t(T)) * hs : 0))
                    << name(s) << " T=" << T;
        }
}

}  // namespace
}  // namespace memfit::cpu
