// Tests of the CPU layer kernels (backend/cpu/kernels.h):
//   - every backward kernel against central finite differences of its forward, with the scalar
//     loss L = sum(out * R) for a random R (crossentropy: L = dloss * sum(losses));
//   - forward kernels against naive double-precision references written here;
//   - the `=` versus `+=` contract of each output (buffers are pre-filled with garbage or values);
//   - AdamW against a double-precision PyTorch-formula reference; determinism of attention.
// Plus one timing test at the target size, which prints and asserts nothing about speed.
#include "backend/cpu/kernels.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

namespace memfit::cpu {
namespace {

constexpr float kFdEps = 1e-3f;      // finite-difference step
constexpr double kFdTol = 1e-2;      // norm-wise relative tolerance of gradient checks
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> randn(size_t n, std::mt19937 & rng, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float & x : v) x = dist(rng);
    return v;
}

double dot(const std::vector<float> & a, const std::vector<float> & b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
}

// ||a - b|| / ||b||; NaN or inf (so every `< tol` check fails) when b is zero or anything is NaN.
double rel_err(const std::vector<double> & a, const std::vector<double> & b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num) / std::sqrt(den);
}

std::vector<double> to_double(const std::vector<float> & v) { return {v.begin(), v.end()}; }

// a - b, elementwise, in double: the part of an accumulated buffer that a kernel added.
std::vector<double> added(const std::vector<float> & after, const std::vector<float> & before) {
    std::vector<double> d(after.size());
    for (size_t i = 0; i < after.size(); ++i) d[i] = static_cast<double>(after[i]) - before[i];
    return d;
}

// Runs the enclosed code on one OpenMP thread. The finite-difference loops below make thousands
// of tiny kernel calls; with a team of threads on a loaded machine every parallel region can wait
// a scheduler tick for a descheduled thread, turning milliseconds into many seconds. The analytic
// gradients, which are what is being tested, still run with the default team.
class SingleThreadScope {
public:
    SingleThreadScope() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
    ~SingleThreadScope() { omp_set_num_threads(saved_); }
    SingleThreadScope(const SingleThreadScope &) = delete;
    SingleThreadScope & operator=(const SingleThreadScope &) = delete;

private:
    int saved_;
};

// Central differences of loss() with respect to every element of x (x is restored). loss()
// evaluates the forward in float and returns the scalar loss in double.
template <class Loss>
std::vector<double> numeric_grad(std::vector<float> & x, Loss && loss, float eps = kFdEps) {
    const SingleThreadScope single_thread;
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const float x0 = x[i];
        x[i] = x0 + eps;
        const float xp = x[i];
        const double lp = loss();
        x[i] = x0 - eps;
        const float xm = x[i];
        const double lm = loss();
        x[i] = x0;
        g[i] = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    }
    return g;
}

// ---------------------------------------------------------------------------------------------
// Encoder

TEST(CpuKernels, EncoderForwardAddsTokenAndPositionRows) {
    const int B = 2, T = 5, C = 8, V = 11;
    std::mt19937 rng(1);
    const std::vector<int32_t> tokens = {3, 3, 7, 0, 10, 7, 7, 1, 3, 5};
    const std::vector<float> wte = randn(size_t(V) * C, rng), wpe = randn(size_t(T) * C, rng);
    std::vector<float> out(size_t(B) * T * C, kNaN);
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c) {
                const size_t r = size_t(b) * T + t;
                EXPECT_EQ(out[r * C + c], wte[size_t(tokens[r]) * C + c] + wpe[size_t(t) * C + c]);
            }
}

TEST(CpuKernels, EncoderBackwardMatchesFiniteDifferencesAndAccumulates) {
    // C = 40 spans more than one column block of the row reduction, with a remainder.
    for (const int C : {8, 40}) {
        const int B = 2, T = 5, V = 11;
        std::mt19937 rng(2);
        const std::vector<int32_t> tokens = {3, 3, 7, 0, 3, 10, 7, 7, 1, 3};  // repeats, within and across rows
        std::vector<float> wte = randn(size_t(V) * C, rng), wpe = randn(size_t(T) * C, rng);
        const std::vector<float> R = randn(size_t(B) * T * C, rng);
        std::vector<float> out(R.size());
        auto loss = [&] {
            encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
            return dot(out, R);
        };
        const std::vector<float> dwte0 = randn(wte.size(), rng), dwpe0 = randn(wpe.size(), rng);
        std::vector<float> dwte = dwte0, dwpe = dwpe0;
        encoder_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, T, C);

        EXPECT_LT(rel_err(added(dwte, dwte0), numeric_grad(wte, loss)), kFdTol) << "C=" << C;
        EXPECT_LT(rel_err(added(dwpe, dwpe0), numeric_grad(wpe, loss)), kFdTol) << "C=" << C;
        // Rows of tokens that do not occur are left exactly as they were.
        for (const int v : {2, 4, 6, 8, 9})
            for (int c = 0; c < C; ++c)
                EXPECT_EQ(dwte[size_t(v) * C + c], dwte0[size_t(v) * C + c]);
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

struct LnRef {
    std::vector<double> out, mean, rstd;
};

LnRef layernorm_ref(const std::vector<float> & inp, const std::vector<float> & w,
                    const std::vector<float> & bias, int N, int C, double eps) {
    LnRef r{std::vector<double>(size_t(N) * C), std::vector<double>(N), std::vector<double>(N)};
    for (int i = 0; i < N; ++i) {
        const float * x = inp.data() + size_t(i) * C;
        double m = 0.0;
        for (int c = 0; c < C; ++c) m += x[c];
        m /= C;
        double v = 0.0;
        for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
        v /= C;
        const double s = 1.0 / std::sqrt(v + eps);
        for (int c = 0; c < C; ++c) r.out[size_t(i) * C + c] = (x[c] - m) * s * w[c] + bias[c];
        r.mean[i] = m;
        r.rstd[i] = s;
    }
    return r;
}

TEST(CpuKernels, LayerNormForwardMatchesDouble) {
    for (const int C : {8, 70}) {
        const int N = 10;
        const float eps = 1e-5f;
        std::mt19937 rng(3);
        std::vector<float> inp = randn(size_t(N) * C, rng, 2.0f);
        for (int c = 0; c < C; ++c) inp[c] += 5.0f;                  // a row with a large mean
        for (int c = 0; c < C; ++c) inp[size_t(C) + c] *= 0.002f;   // variance ~ eps: eps matters
        const std::vector<float> w = randn(C, rng), bias = randn(C, rng);
        std::vector<float> out(inp.size(), kNaN), mean(N, kNaN), rstd(N, kNaN);
        layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(),
                          N, C, eps);
        const LnRef ref = layernorm_ref(inp, w, bias, N, C, eps);
        for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref.out[i], 1e-5) << i;
        for (int i = 0; i < N; ++i) {
            EXPECT_NEAR(mean[i], ref.mean[i], 1e-5 * (1.0 + std::fabs(ref.mean[i])));
            EXPECT_NEAR(rstd[i], ref.rstd[i], 1e-5 * ref.rstd[i]);
        }
    }
}

TEST(CpuKernels, LayerNormBackwardMatchesFiniteDifferencesAndAccumulates) {
    // C = 40 spans more than one column block of the dweight/dbias reduction.
    for (const int C : {8, 40}) {
        const int B = 2, T = 5, N = B * T;
        const float eps = 1e-5f;
        std::mt19937 rng(4);
        std::vector<float> inp = randn(size_t(N) * C, rng), w = randn(C, rng), bias = randn(C, rng);
        const std::vector<float> R = randn(inp.size(), rng);
        std::vector<float> out(inp.size()), mean(N), rstd(N);
        auto loss = [&] {
            layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                              bias.data(), N, C, eps);
            return dot(out, R);
        };
        loss();  // mean/rstd of the unperturbed input
        const std::vector<float> mean_s = mean, rstd_s = rstd;
        // Pre-filled buffers: all three outputs accumulate.
        const std::vector<float> dinp0 = randn(inp.size(), rng), dw0 = randn(C, rng), db0 = randn(C, rng);
        std::vector<float> dinp = dinp0, dw = dw0, db = db0;
        layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(),
                           mean_s.data(), rstd_s.data(), N, C);

        EXPECT_LT(rel_err(added(dinp, dinp0), numeric_grad(inp, loss)), kFdTol) << "C=" << C;
        EXPECT_LT(rel_err(added(dw, dw0), numeric_grad(w, loss)), kFdTol) << "C=" << C;
        EXPECT_LT(rel_err(added(db, db0), numeric_grad(bias, loss)), kFdTol) << "C=" << C;
    }
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttnRef {
    std::vector<double> out, att;
};

AttnRef attention_ref(const std::vector<float> & qkv, int B, int T, int C, int NH) {
    const int hs = C / NH;
    AttnRef r{std::vector<double>(size_t(B) * T * C), std::vector<double>(size_t(B) * NH * T * T, 0.0)};
    auto at = [&](int b, int t, int part, int h, int i) {
        return static_cast<double>(qkv[(size_t(b) * T + t) * 3 * C + size_t(part) * C + size_t(h) * hs + i]);
    };
    std::vector<double> s(T);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                double mx = -1e300;
                for (int t2 = 0; t2 <= t; ++t2) {
                    double d = 0.0;
                    for (int i = 0; i < hs; ++i) d += at(b, t, 0, h, i) * at(b, t2, 1, h, i);
                    s[t2] = d / std::sqrt(double(hs));
                    mx = std::max(mx, s[t2]);
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(s[t2] - mx);
                double * arow = &r.att[((size_t(b) * NH + h) * T + t) * T];
                for (int t2 = 0; t2 <= t; ++t2) arow[t2] = std::exp(s[t2] - mx) / sum;
                for (int i = 0; i < hs; ++i) {
                    double o = 0.0;
                    for (int t2 = 0; t2 <= t; ++t2) o += arow[t2] * at(b, t2, 2, h, i);
                    r.out[(size_t(b) * T + t) * C + size_t(h) * hs + i] = o;
                }
            }
    return r;
}

struct AttnShape {
    int B, T, C, NH;
};
// Small shapes from the brief, plus ones whose T is not a multiple of the 4-key blocking and
// whose head size is odd.
constexpr AttnShape kAttnShapes[] = {{2, 5, 8, 2}, {1, 9, 12, 3}, {2, 13, 15, 3}};

TEST(CpuKernels, AttentionForwardMatchesNaiveDouble) {
    for (const AttnShape & s : kAttnShapes) {
        std::mt19937 rng(5);
        const std::vector<float> qkv = randn(size_t(s.B) * s.T * 3 * s.C, rng, 1.5f);
        std::vector<float> out(size_t(s.B) * s.T * s.C, kNaN), att(size_t(s.B) * s.NH * s.T * s.T, kNaN);
        attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        const AttnRef ref = attention_ref(qkv, s.B, s.T, s.C, s.NH);
        for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref.out[i], 1e-5) << i;
        for (size_t i = 0; i < att.size(); ++i) EXPECT_NEAR(att[i], ref.att[i], 1e-6) << i;
        // Causal mask: exact zeros above the diagonal; rows sum to 1.
        for (size_t row = 0; row < att.size() / s.T; ++row) {
            const int t = int(row % s.T);
            double sum = 0.0;
            for (int t2 = 0; t2 < s.T; ++t2) {
                if (t2 > t) {
                    EXPECT_EQ(att[row * s.T + t2], 0.0f);
                }
                sum += att[row * s.T + t2];
            }
            EXPECT_NEAR(sum, 1.0, 1e-6);
        }
    }
}

TEST(CpuKernels, AttentionBackwardMatchesFiniteDifferences) {
    for (const AttnShape & s : kAttnShapes) {
        const int B = s.B, T = s.T, C = s.C, NH = s.NH;
        std::mt19937 rng(6);
        std::vector<float> qkv = randn(size_t(B) * T * 3 * C, rng);
        const std::vector<float> R = randn(size_t(B) * T * C, rng);
        std::vector<float> out(R.size()), att(size_t(B) * NH * T * T);
        auto loss = [&] {
            attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
            return dot(out, R);
        };
        loss();
        const std::vector<float> att_s = att;
        // dqkv is written, not accumulated: NaN garbage in it (and in scratch) must not survive.
        std::vector<float> dqkv(qkv.size(), kNaN), scratch(size_t(B) * NH * T, kNaN);
        attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), att_s.data(), B, T, C, NH);
        const double err = rel_err(to_double(dqkv), numeric_grad(qkv, loss));
        EXPECT_LT(err, kFdTol) << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
    }
}

TEST(CpuKernels, AttentionBackwardIsBitwiseDeterministic) {
    const int B = 2, T = 67, C = 64, NH = 4;
    std::mt19937 rng(7);
    const std::vector<float> qkv = randn(size_t(B) * T * 3 * C, rng), dout = randn(size_t(B) * T * C, rng);
    std::vector<float> out(dout.size()), att(size_t(B) * NH * T * T);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    std::vector<float> d1(qkv.size(), 1.0f), d2(qkv.size(), -7.0f), scratch(size_t(B) * NH * T);
    attention_backward(d1.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    attention_backward(d2.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0);
}

// ---------------------------------------------------------------------------------------------
// GELU, residual

double gelu_ref(double x) {
    // 0.5 x (1 + tanh(u)) written as x * sigmoid(2u), which double evaluates without cancellation.
    const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
    return x / (1.0 + std::exp(-2.0 * u));
}

TEST(CpuKernels, GeluForwardMatchesDouble) {
    std::vector<float> x;
    for (int i = -1200; i <= 1200; ++i) x.push_back(0.01f * float(i));  // [-12, 12]
    for (const float v : {-1e4f, -100.0f, -30.0f, 30.0f, 100.0f, 1e4f, 0.0f, 1e-30f, -1e-30f}) x.push_back(v);
    std::vector<float> out(x.size(), kNaN);
    gelu_forward(out.data(), x.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double ref = gelu_ref(x[i]);
        // |x|^3 grows the rounding of u in float; 2e-5 relative covers |x| <= 12.
        EXPECT_NEAR(out[i], ref, 1e-6 + 2e-5 * std::fabs(ref)) << "x=" << x[i];
    }
}

TEST(CpuKernels, GeluBackwardMatchesFiniteDifferencesAndIsWritten) {
    const size_t n = 64;
    std::mt19937 rng(9);
    std::vector<float> x = randn(n, rng, 2.5f);
    const std::vector<float> R = randn(n, rng);
    std::vector<float> out(n);
    auto loss = [&] {
        gelu_forward(out.data(), x.data(), n);
        return dot(out, R);
    };
    std::vector<float> dx(n, kNaN);  // written with `=`
    gelu_backward(dx.data(), R.data(), x.data(), n);
    EXPECT_LT(rel_err(to_double(dx), numeric_grad(x, loss)), kFdTol);
    // Far tails: the derivative is 1 on the right and 0 on the left.
    const std::vector<float> tails = {-1e4f, -40.0f, 40.0f, 1e4f}, ones(4, 1.0f);
    std::vector<float> dt(4, kNaN);
    gelu_backward(dt.data(), ones.data(), tails.data(), 4);
    EXPECT_NEAR(dt[0], 0.0f, 1e-20);
    EXPECT_NEAR(dt[1], 0.0f, 1e-20);
    EXPECT_EQ(dt[2], 1.0f);
    EXPECT_EQ(dt[3], 1.0f);
}

// The exact GELU against double's erfc: forward x Phi(x) and derivative Phi(x) + x phi(x), to
// 1e-6 relative near 0, over [-12, 12] and into the tails; finite differences agree. In the left
// tail Phi(x) ~ exp(-x^2 / 2): x^2 in float carries a relative error of about 6e-8 x^2 into it
// (4e-6 at x = -8), which any float evaluation has, hence the x^2 term of the tolerance.
TEST(CpuKernels, GeluErfMatchesDoubleAndItsDerivative) {
    const auto Phi = [](double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); };
    std::vector<float> x;
    for (int i = -1200; i <= 1200; ++i) x.push_back(0.01f * float(i));
    for (const float v : {-1e4f, -30.0f, -13.0f, 13.0f, 30.0f, 1e4f, 1e-30f, -1e-30f}) x.push_back(v);
    std::vector<float> out(x.size(), kNaN), dx(x.size(), kNaN);
    const std::vector<float> ones(x.size(), 1.0f);
    gelu_erf_forward(out.data(), x.data(), x.size());
    gelu_erf_backward(dx.data(), ones.data(), x.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i], y = v * Phi(v), phi = std::exp(-0.5 * v * v) / std::sqrt(2 * std::numbers::pi);
        const double rel = 1e-6 + 1.2e-7 * std::min(v * v, 200.0);
        EXPECT_NEAR(out[i], y, 1e-30 + rel * std::fabs(y)) << "x=" << v;
        // The derivative's two terms cancel near x = -0.75: relative to their sizes.
        EXPECT_NEAR(dx[i], Phi(v) + v * phi, 1e-30 + rel * (Phi(v) + std::fabs(v) * phi)) << "x=" << v;
    }
    // It is not the tanh approximation: they differ by up to ~5e-4 near |x| = 2.
    std::vector<float> approx(x.size());
    gelu_forward(approx.data(), x.data(), x.size());
    EXPECT_GT(std::fabs(approx[1200 + 200] - out[1200 + 200]), 1e-5f);
    const size_t n = 64;
    std::mt19937 rng(11);
    std::vector<float> xs = randn(n, rng, 2.5f), o(n), g(n, kNaN);
    const std::vector<float> R = randn(n, rng);
    gelu_erf_backward(g.data(), R.data(), xs.data(), n);
    EXPECT_LT(rel_err(to_double(g), numeric_grad(xs, [&] {
                  gelu_erf_forward(o.data(), xs.data(), n);
                  return dot(o, R);
              })), kFdTol);
}

TEST(CpuKernels, ResidualForwardAdds) {
    std::mt19937 rng(10);
    const size_t n = 1001;
    const std::vector<float> a = randn(n, rng), b = randn(n, rng);
    std::vector<float> out(n, kNaN);
    residual_forward(out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST(CpuKernels, CrossEntropyForwardMatchesDouble) {
    const int N = 10, V = 11;
    std::mt19937 rng(11);
    std::vector<float> logits = randn(size_t(N) * V, rng, 3.0f);
    for (int j = 0; j < V; ++j) logits[size_t(2) * V + j] += 80.0f;  // large logits: max subtraction
    const std::vector<int32_t> targets = {3, -100, 0, 10, 5, -100, 7, 7, 1, 2};
    const std::vector<float> logits0 = logits;
    std::vector<float> losses(N, kNaN);
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    for (int i = 0; i < N; ++i) {
        const float * z = &logits0[size_t(i) * V];
        const double mx = *std::max_element(z, z + V);
        double sum = 0.0;
        for (int j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
        if (targets[i] == -100) {
            EXPECT_EQ(losses[i], 0.0f) << "row " << i;
            continue;
        }
        double psum = 0.0;
        for (int j = 0; j < V; ++j) {
            const double p = std::exp(z[j] - mx) / sum;
            EXPECT_NEAR(logits[size_t(i) * V + j], p, 1e-6) << "row " << i << " col " << j;
            psum += logits[size_t(i) * V + j];
        }
        EXPECT_NEAR(psum, 1.0, 1e-6) << "row " << i;
        const double nll = -std::log(std::exp(z[targets[i]] - mx) / sum);
        EXPECT_NEAR(losses[i], nll, 1e-5 * (1.0 + nll)) << "row " << i;
    }
}

// GPT-2's vocabulary width (odd: rows start unaligned), where the vectorised exp does the work,
// and rows holding an infinity or a NaN, which must come out as the libm exp gives them: a NaN
// or +inf logit makes the loss non-finite (what the loss scaler sees); -inf is a zero probability.
// Six rows of GPT-2's vocabulary (50,257 logits, random with scale 4) and their targets: row 2
// ignored, row 3 holding a NaN, row 4 +inf, row 5 -inf.
constexpr int kWideRows = 6, kWideV = 50257;
const std::vector<int32_t> kWideTargets = {50256, 0, -100, 1, 2, 3};
std::vector<float> wide_logits(uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> logits = randn(size_t(kWideRows) * kWideV, rng, 4.0f);
    logits[size_t(3) * kWideV + 777] = kNaN;
    logits[size_t(4) * kWideV + 12345] = std::numeric_limits<float>::infinity();
    logits[size_t(5) * kWideV + 5] = -std::numeric_limits<float>::infinity();
    return logits;
}

TEST(CpuKernels, CrossEntropyWideAndNonFiniteRows) {
    const int N = kWideRows, V = kWideV;
    std::vector<float> logits = wide_logits(21);
    const std::vector<int32_t> & targets = kWideTargets;
    const std::vector<float> logits0 = logits;
    std::vector<float> losses(N, -1.0f);
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    EXPECT_TRUE(std::isnan(losses[3]));
    EXPECT_FALSE(std::isfinite(losses[4]));
    for (const int i : {0, 1, 2, 5}) {
        const float * z = &logits0[size_t(i) * V];
        double mx = -1e300, sum = 0.0, psum = 0.0, maxerr = 0.0;
        for (int j = 0; j < V; ++j) mx = std::max(mx, double(z[j]));
        for (int j = 0; j < V; ++j) sum += std::exp(double(z[j]) - mx);
        for (int j = 0; j < V; ++j) {
            const double p = std::exp(double(z[j]) - mx) / sum, got = logits[size_t(i) * V + j];
            maxerr = std::max(maxerr, std::fabs(got - p) / std::max(p, 1e-30));
            psum += got;
        }
        // Relative, every probability: the fp32 difference z - max (down to about -40 here) is
        // rounded before exp, which alone costs up to |z - max| * 2^-24 = 2.4e-6.
        EXPECT_LT(maxerr, 4e-6) << "row " << i;
        EXPECT_NEAR(psum, 1.0, 1e-5) << "row " << i;
        if (targets[i] == -100) {
            EXPECT_EQ(losses[i], 0.0f);
        } else {
            const double nll = mx + std::log(sum) - z[targets[i]];
            EXPECT_NEAR(losses[i], nll, 1e-6 * (1.0 + nll)) << "row " << i;
        }
    }
    EXPECT_EQ(logits[size_t(5) * V + 5], 0.0f);
}

// The fused loss-and-gradient kernel training runs: the two kernels' bits, on wide rows, an
// ignored row and rows holding a NaN or an infinity of either sign.
TEST(CpuKernels, CrossEntropyForwardBackwardIsBothKernels) {
    const int N = kWideRows, V = kWideV;
    std::vector<float> a = wide_logits(22);
    const std::vector<int32_t> & targets = kWideTargets;
    std::vector<float> b = a, la(N, -1.0f), lb(N, -2.0f);
    const float dloss = 1.0f / 3.0f;
    crossentropy_forward(la.data(), a.data(), targets.data(), N, V);
    crossentropy_backward(a.data(), targets.data(), dloss, N, V);
    crossentropy_forward_backward(lb.data(), b.data(), targets.data(), dloss, N, V);
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    double row0 = 0.0;   // a gradient row sums to 0: (sum p - 1) * dloss
    for (int j = 0; j < V; ++j) row0 += b[size_t(j)];
    EXPECT_NEAR(row0, 0.0, 1e-6);
    EXPECT_LT(b[50256], 0.0f);
    EXPECT_EQ(b[size_t(2) * V + 9], 0.0f);   // the ignored row
}

TEST(CpuKernels, CrossEntropyBackwardMatchesFiniteDifferences) {
    const int B = 2, T = 5, N = B * T, V = 11;
    std::mt19937 rng(12);
    std::vector<float> logits = randn(size_t(N) * V, rng, 2.0f);
    const std::vector<int32_t> targets = {3, -100, 0, 10, 5, -100, 7, 7, 1, 2};
    const float dloss = 1.0f / 8.0f;  // mean over the 8 counted rows
    std::vector<float> work(logits.size()), losses(N);
    auto loss = [&] {
        work = logits;
        crossentropy_forward(losses.data(), work.data(), targets.data(), N, V);
        double s = 0.0;
        for (const float l : losses) s += l;
        return s * dloss;
    };
    loss();
    std::vector<float> grad = work;  // probs -> dlogits, in place
    crossentropy_backward(grad.data(), targets.data(), dloss, N, V);
    EXPECT_LT(rel_err(to_double(grad), numeric_grad(logits, loss)), kFdTol);
    for (int i = 0; i < N; ++i) {
        if (targets[i] != -100) continue;
        for (int j = 0; j < V; ++j) EXPECT_EQ(grad[size_t(i) * V + j], 0.0f) << "row " << i;
    }
}

// ---------------------------------------------------------------------------------------------
// Bias gradient, sum of squares

TEST(CpuKernels, BiasBackwardMatchesFiniteDifferencesAndAccumulates) {
    // OC = 70: two full column blocks and a remainder.
    for (const int OC : {8, 70}) {
        const int N = 9;
        std::mt19937 rng(13);
        const std::vector<float> inp = randn(size_t(N) * OC, rng), R = randn(inp.size(), rng);
        std::vector<float> bias = randn(OC, rng);
        auto loss = [&] {  // out = inp + bias (broadcast over rows)
            double s = 0.0;
            for (int i = 0; i < N; ++i)
                for (int j = 0; j < OC; ++j) s += double(inp[size_t(i) * OC + j] + bias[j]) * R[size_t(i) * OC + j];
            return s;
        };
        const std::vector<float> db0 = randn(OC, rng);
        std::vector<float> db = db0;
        bias_backward(db.data(), R.data(), N, OC);
        EXPECT_LT(rel_err(added(db, db0), numeric_grad(bias, loss)), kFdTol) << "OC=" << OC;
        for (int j = 0; j < OC; ++j) {
            double s = 0.0;
            for (int i = 0; i < N; ++i) s += R[size_t(i) * OC + j];
            EXPECT_NEAR(db[j] - db0[j], s, 1e-5) << j;
        }
    }
}

TEST(CpuKernels, SumSquaresMatchesDouble) {
    std::mt19937 rng(14);
    for (const size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{200003}}) {
        const std::vector<float> x = randn(n, rng);
        double ref = 0.0;
        for (const float v : x) ref += double(v) * v;
        EXPECT_NEAR(sum_squares(x.data(), n), ref, 1e-12 * (1.0 + ref)) << "n=" << n;
    }
}

// ---------------------------------------------------------------------------------------------
// AdamW

TEST(CpuKernels, AdamWMatchesDoubleReferenceOverTwoSteps) {
    const size_t n = 37;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    for (const float wd : {0.0f, 0.1f}) {
        std::mt19937 rng(15);
        std::vector<float> p = randn(n, rng), m(n, 0.0f), v(n, 0.0f);
        const std::vector<std::vector<float>> grads = {randn(n, rng, 0.1f), randn(n, rng, 0.1f)};
        std::vector<double> pr(p.begin(), p.end()), mr(n, 0.0), vr(n, 0.0);
        for (int t = 1; t <= 2; ++t) {
            std::vector<float> g = grads[t - 1];
            g[0] = 0.0f;    // no gradient at all
            g[1] = 1e-9f;   // gradient below eps
            OptimHyper h;
            h.lr = lr, h.beta1 = b1, h.beta2 = b2, h.eps = eps, h.weight_decay = wd, h.t = t;
            adamw_update<float, float, float, float>(p.data(), nullptr, g.data(), m.data(), v.data(), n,
                                                     update_consts(h));
            const double bc1 = 1.0 - std::pow(double(b1), t), bc2 = 1.0 - std::pow(double(b2), t);
            for (size_t i = 0; i < n; ++i) {
                pr[i] -= double(lr) * wd * pr[i];
                mr[i] = b1 * mr[i] + (1.0 - b1) * g[i];
                vr[i] = b2 * vr[i] + (1.0 - b2) * double(g[i]) * g[i];
                pr[i] -= double(lr) * (mr[i] / bc1) / (std::sqrt(vr[i] / bc2) + eps);
            }
            for (size_t i = 0; i < n; ++i) {
                EXPECT_NEAR(p[i], pr[i], 1e-6 * (1.0 + std::fabs(pr[i]))) << "wd=" << wd << " t=" << t << " i=" << i;
                EXPECT_NEAR(m[i], mr[i], 1e-6 * std::fabs(mr[i]) + 1e-12) << "wd=" << wd << " t=" << t << " i=" << i;
                EXPECT_NEAR(v[i], vr[i], 1e-6 * std::fabs(vr[i]) + 1e-20) << "wd=" << wd << " t=" << t << " i=" << i;
            }
        }
    }
}

}  // namespace
}  // namespace memfit::cpu
