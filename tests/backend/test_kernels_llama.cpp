// The LLaMA-family ops of the CPU backend (kernels_llama.cpp, and the encoder without position
// embedding), through CpuBackend and Graph:
//   - forwards against straightforward double-precision references written here;
//   - backwards against central finite differences (of a double reference, or of the float
//     kernel itself for the linear RoPE), with the scalar loss L = sum(out * R) for a random R;
//   - the `=` versus `+=` contract of every output (buffers are pre-filled with NaN or values);
//   - RoPE: v untouched, norms preserved, backward(forward(x)) == x; repeat_kv layout and sums;
//   - bf16 and f16 storage against the f32 op on the same rounded inputs, with the tolerance of
//     test_kernels_lowp.cpp: |got - want| <= u |want| + floor, u = 2^-8 (bf16) or 2^-11 (f16);
//   - RMSNorm backward's bits with several thread counts; the Graph recording of the ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/graph.h"
#include "core/dtype.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "test_util.h"

namespace memfit {
using memfit::test::ThreadScope;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float round_to(float x, DType dt) {
    switch (dt) {
        case DType::bf16: return bf16_to_f32(f32_to_bf16(x));
        case DType::f16: return f16_to_f32(f32_to_f16(x));
        default: return x;
    }
}

double unit_roundoff(DType dt) {
    return dt == DType::bf16 ? std::ldexp(1.0, -8) : dt == DType::f16 ? std::ldexp(1.0, -11) : 0.0;
}

// A tensor with its own storage in any float dtype; set() rounds fp32 values into it, get() reads
// them back as fp32.
struct Arr {
    DType dt;
    std::vector<std::byte> bytes;
    Tensor t;
    Arr(DType d, std::initializer_list<int64_t> dims) : dt(d), t(-1, d, dims) {
        bytes.resize(t.nbytes());
        t.data = bytes.data();
    }
    size_t n() const { return size_t(t.numel()); }
    void set(const std::vector<float> & v) {
        EXPECT_EQ(v.size(), n());
        for (size_t i = 0; i < v.size(); ++i) {
            if (dt == DType::f32) {
                std::memcpy(bytes.data() + 4 * i, &v[i], 4);
            } else {
                const uint16_t h = dt == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
                std::memcpy(bytes.data() + 2 * i, &h, 2);
            }
        }
    }
    std::vector<float> get() const {
        std::vector<float> v(n());
        for (size_t i = 0; i < v.size(); ++i) {
            if (dt == DType::f32) {
                std::memcpy(&v[i], bytes.data() + 4 * i, 4);
            } else {
                uint16_t h = 0;
                std::memcpy(&h, bytes.data() + 2 * i, 2);
                v[i] = dt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
            }
        }
        return v;
    }
};

// An f32 tensor over caller-owned floats (the vector must outlive it).
Tensor view(std::vector<float> & v, std::initializer_list<int64_t> dims) {
    Tensor t(-1, DType::f32, dims);
    EXPECT_EQ(size_t(t.numel()), v.size());
    t.data = v.data();
    return t;
}

std::vector<float> randn(size_t n, std::mt19937 & rng, float scale = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, scale);
    std::vector<float> v(n);
    for (float & x : v) x = dist(rng);
    return v;
}

std::vector<float> rand_in(size_t n, DType dt, std::mt19937 & rng, float scale = 1.0f, float mean = 0.0f) {
    std::vector<float> v = randn(n, rng, scale, mean);
    for (float & x : v) x = round_to(x, dt);
    return v;
}

std::vector<double> to_double(const std::vector<float> & v) { return {v.begin(), v.end()}; }

// after - before, in double: what a kernel added to an accumulated buffer.
std::vector<double> added(const std::vector<float> & after, const std::vector<float> & before) {
    std::vector<double> d(after.size());
    for (size_t i = 0; i < after.size(); ++i) d[i] = double(after[i]) - double(before[i]);
    return d;
}

double dot(const std::vector<double> & a, const std::vector<double> & b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// ||a - b|| / ||b||; NaN or inf (every `<` check fails) when b is zero or anything is NaN.
double rel_err(const std::vector<double> & a, const std::vector<double> & b) {
    EXPECT_EQ(a.size(), b.size());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num) / std::sqrt(den);
}

// Central differences of loss() (double) with respect to every element of x (restored after).
template <class Loss>
std::vector<double> numeric_grad(std::vector<double> & x, Loss && loss, double h) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss();
        x[i] = x0 - h;
        const double lm = loss();
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * h);
    }
    return g;
}

// The tolerance of test_kernels_lowp.cpp (see the file comment).
void expect_rounded(const std::vector<float> & got, const std::vector<float> & want, DType dt, const std::string & what,
                    double floor_rel = 1e-5) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double maxw = 0.0;
    for (float w : want) maxw = std::max(maxw, double(std::fabs(w)));
    ASSERT_GT(maxw, 0.0) << what << ": the reference is all zeros";
    const double u = unit_roundoff(dt), floor = floor_rel * maxw + std::ldexp(1.0, -24);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double tol = u * std::fabs(double(want[i])) + floor;
        if (!(std::fabs(double(got[i]) - double(want[i])) <= tol)) {
            if (++bad <= 5)
                ADD_FAILURE() << what << " [" << dtype_name(dt) << "] element " << i << ": got " << got[i]
                              << ", want " << want[i] << " (tolerance " << tol << ")";
        }
    }
    EXPECT_EQ(bad, 0) << what << " [" << dtype_name(dt) << "]: " << bad << " of " << got.size() << " elements off";
}

// ---------------------------------------------------------------------------------------------
// Double-precision references

void rmsnorm_ref(std::vector<double> & out, std::vector<double> & rstd, const std::vector<double> & x,
                 const std::vector<double> & w, int N, int C, double eps) {
    out.assign(size_t(N) * C, 0.0);
    rstd.assign(size_t(N), 0.0);
    for (int i = 0; i < N; ++i) {
        double ss = 0.0;
        for (int c = 0; c < C; ++c) ss += x[size_t(i) * C + c] * x[size_t(i) * C + c];
        const double r = 1.0 / std::sqrt(ss / C + eps);
        rstd[size_t(i)] = r;
        for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = x[size_t(i) * C + c] * r * w[size_t(c)];
    }
}

// RoPE on qkv[B,T,(NH+2*KVH)*hd] (q and k heads), in double.
std::vector<double> rope_ref(const std::vector<double> & x, int B, int T, int NH, int KVH, int hd, double theta,
                             int pos0) {
    std::vector<double> y = x;
    const int half = hd / 2, width = (NH + 2 * KVH) * hd;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < NH + KVH; ++h)
                for (int i = 0; i < half; ++i) {
                    const size_t lo = (size_t(b) * T + t) * width + size_t(h) * hd + i, hi = lo + half;
                    const double a = double(pos0 + t) * std::pow(theta, -2.0 * i / hd);
                    y[lo] = x[lo] * std::cos(a) - x[hi] * std::sin(a);
                    y[hi] = x[hi] * std::cos(a) + x[lo] * std::sin(a);
                }
    return y;
}

std::vector<double> swiglu_ref(const std::vector<double> & inp, int N, int I) {
    std::vector<double> out(size_t(N) * I);
    for (int i = 0; i < N; ++i)
        for (int c = 0; c < I; ++c) {
            const double g = inp[size_t(i) * 2 * I + c], u = inp[size_t(i) * 2 * I + I + c];
            out[size_t(i) * I + c] = g / (1.0 + std::exp(-g)) * u;
        }
    return out;
}

// GeGLU (Gemma 3): the tanh form of GELU on the gate, in double.
std::vector<double> geglu_ref(const std::vector<double> & inp, int N, int I) {
    std::vector<double> out(size_t(N) * I);
    for (int i = 0; i < N; ++i)
        for (int c = 0; c < I; ++c) {
            const double g = inp[size_t(i) * 2 * I + c], u = inp[size_t(i) * 2 * I + I + c];
            const double gelu = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
            out[size_t(i) * I + c] = gelu * u;
        }
    return out;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

TEST(LlamaKernels, RmsNormForwardMatchesDoubleReference) {
    CpuBackend be;
    const int N = 7, C = 40;
    const float eps = 1e-5f;
    std::mt19937 rng(1);
    std::vector<float> x = randn(size_t(N) * C, rng, 2.0f, 0.3f), w = randn(C, rng, 0.5f, 1.0f);
    x[5] = 0.0f;
    std::vector<float> out(x.size(), kNaN), rstd(size_t(N), kNaN);
    be.rmsnorm_fwd(view(out, {1, N, C}), view(rstd, {N}), view(x, {1, N, C}), view(w, {C}), eps);
    std::vector<double> rout, rrstd;
    rmsnorm_ref(rout, rrstd, to_double(x), to_double(w), N, C, double(eps));
    for (int i = 0; i < N; ++i) EXPECT_NEAR(rstd[size_t(i)], rrstd[size_t(i)], 2e-6 * rrstd[size_t(i)]) << i;
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], rout[i], 2e-6 * std::fabs(rout[i]) + 1e-7) << i;

    // A row of zeros: rstd = 1/sqrt(eps), out = 0.
    std::vector<float> z(size_t(C), 0.0f), zo(size_t(C), kNaN), zr(1, kNaN);
    be.rmsnorm_fwd(view(zo, {1, C}), view(zr, {1}), view(z, {1, C}), view(w, {C}), eps);
    EXPECT_NEAR(zr[0], 1.0 / std::sqrt(double(eps)), 1e-6 / std::sqrt(double(eps)));
    for (float v : zo) EXPECT_EQ(v, 0.0f);
}

TEST(LlamaKernels, RmsNormBackwardMatchesFiniteDifferencesAndAccumulates) {
    // C = 40: more than one column block of the weight gradient's reduction, with a remainder.
    CpuBackend be;
    const int N = 6, C = 40;
    const float eps = 1e-5f;
    std::mt19937 rng(2);
    std::vector<float> x = randn(size_t(N) * C, rng, 1.5f, 0.2f), w = randn(C, rng, 0.5f, 1.0f);
    const std::vector<float> R = randn(x.size(), rng);
    std::vector<float> out(x.size()), rstd(static_cast<size_t>(N));
    be.rmsnorm_fwd(view(out, {N, C}), view(rstd, {N}), view(x, {N, C}), view(w, {C}), eps);

    const std::vector<float> dx0 = randn(x.size(), rng), dw0 = randn(size_t(C), rng);
    std::vector<float> dx = dx0, dw = dw0, dout = R;
    be.rmsnorm_bwd(view(dx, {N, C}), view(dw, {C}), view(dout, {N, C}), view(x, {N, C}), view(w, {C}),
                   view(rstd, {N}));

    std::vector<double> xd = to_double(x), wd = to_double(w);
    const std::vector<double> Rd = to_double(R);
    auto loss = [&] {
        std::vector<double> o, r;
        rmsnorm_ref(o, r, xd, wd, N, C, double(eps));
        return dot(o, Rd);
    };
    EXPECT_LT(rel_err(added(dx, dx0), numeric_grad(xd, loss, 1e-5)), 1e-5);
    EXPECT_LT(rel_err(added(dw, dw0), numeric_grad(wd, loss, 1e-5)), 1e-5);
}

TEST(LlamaKernels, RmsNormBackwardIsDeterministicAcrossThreadCounts) {
    CpuBackend be;
    const int N = 67, C = 100;
    for (const DType dt : {DType::f32, DType::bf16}) {
        std::mt19937 rng(3);
        Arr x(dt, {N, C}), w(dt, {C}), out(dt, {N, C}), dout(dt, {N, C}), rstd(DType::f32, {N});
        x.set(randn(x.n(), rng)), w.set(randn(C, rng, 0.5f, 1.0f)), dout.set(randn(dout.n(), rng));
        be.rmsnorm_fwd(out.t, rstd.t, x.t, w.t, 1e-6f);
        const std::vector<float> dx0 = randn(x.n(), rng), dw0 = randn(size_t(C), rng);
        std::vector<std::vector<std::byte>> dxs, dws;
        for (const int threads : {1, 2, 3, 5}) {
            const ThreadScope scope(threads);
            Arr dx(dt, {N, C}), dw(dt, {C});
            dx.set(dx0), dw.set(dw0);
            be.rmsnorm_bwd(dx.t, dw.t, dout.t, x.t, w.t, rstd.t);
            dxs.push_back(dx.bytes), dws.push_back(dw.bytes);
        }
        for (size_t k = 1; k < dxs.size(); ++k) {
            EXPECT_EQ(dxs[k], dxs[0]) << dtype_name(dt) << " thread count #" << k;
            EXPECT_EQ(dws[k], dws[0]) << dtype_name(dt) << " thread count #" << k;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeShape { int B, T, NH, KVH, hd; float theta; int pos0; };

TEST(LlamaKernels, RopeForwardMatchesReferenceAndLeavesVUntouched) {
    CpuBackend be;
    for (const RopeShape s : {RopeShape{2, 5, 4, 2, 8, 10000.0f, 0}, RopeShape{1, 6, 4, 2, 8, 10000.0f, 7},
                              RopeShape{2, 3, 6, 1, 16, 500000.0f, 1000}, RopeShape{1, 4, 3, 3, 4, 10.0f, 2}}) {
        const std::string tag = "NH=" + std::to_string(s.NH) + " KVH=" + std::to_string(s.KVH) + " hd=" +
                                std::to_string(s.hd) + " pos0=" + std::to_string(s.pos0);
        const int width = (s.NH + 2 * s.KVH) * s.hd, half = s.hd / 2;
        std::mt19937 rng(4);
        const std::vector<float> x = randn(size_t(s.B) * s.T * width, rng);
        std::vector<float> y = x;
        be.rope_fwd(view(y, {s.B, s.T, width}), s.NH, s.KVH, s.theta, s.pos0);
        const std::vector<double> want = rope_ref(to_double(x), s.B, s.T, s.NH, s.KVH, s.hd, double(s.theta), s.pos0);
        for (int r = 0; r < s.B * s.T; ++r) {
            const int t = r % s.T;
            for (int col = 0; col < width; ++col) {
                const size_t i = size_t(r) * width + col;
                const int h = col / s.hd;
                if (h >= s.NH + s.KVH) {  // v: the same bits
                    EXPECT_EQ(f32_bits(y[i]), f32_bits(x[i])) << tag << " v element " << i;
                    continue;
                }
                const int k = col % s.hd;
                const size_t lo = i - size_t(k >= half ? half : 0), hi = lo + half;
                const double scale = std::fabs(double(x[lo])) + std::fabs(double(x[hi]));
                EXPECT_NEAR(y[i], want[i], 1e-6 * scale + 1e-12) << tag << " element " << i;
                if (k < half) {  // each rotated pair keeps its length
                    const double n0 = double(x[lo]) * x[lo] + double(x[hi]) * x[hi];
                    const double n1 = double(y[lo]) * y[lo] + double(y[hi]) * y[hi];
                    EXPECT_NEAR(n1, n0, 1e-6 * n0) << tag << " pair at " << i;
                }
                if (s.pos0 + t == 0) {
                    EXPECT_EQ(y[i], x[i]) << tag << ": position 0 is the identity";
                }
            }
        }
    }
}

TEST(LlamaKernels, RopeBackwardInvertsForwardAndMatchesFiniteDifferences) {
    CpuBackend be;
    const RopeShape s{2, 5, 4, 2, 8, 10000.0f, 3};
    const int width = (s.NH + 2 * s.KVH) * s.hd;
    std::mt19937 rng(5);
    std::vector<float> x = randn(size_t(s.B) * s.T * width, rng);

    // backward(forward(x)) == x: the backward of a rotation is its transpose, the inverse.
    std::vector<float> y = x;
    be.rope_fwd(view(y, {s.B, s.T, width}), s.NH, s.KVH, s.theta, s.pos0);
    be.rope_bwd(view(y, {s.B, s.T, width}), s.NH, s.KVH, s.theta, s.pos0);
    double maxx = 0.0;
    for (float v : x) maxx = std::max(maxx, double(std::fabs(v)));
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-6 * maxx) << i;
    EXPECT_LT(rel_err(to_double(y), to_double(x)), 1e-6);

    // Finite differences of L = sum(rope(x) * R) on the float kernel itself. RoPE is linear, so a
    // large step has no truncation error, and a step changes only the two outputs of its pair.
    const std::vector<float> R = randn(x.size(), rng);
    std::vector<float> dx = R;
    be.rope_bwd(view(dx, {s.B, s.T, width}), s.NH, s.KVH, s.theta, s.pos0);
    std::vector<double> fd(x.size());
    const std::vector<double> Rd = to_double(R);
    const ThreadScope one_thread(1);  // hundreds of tiny calls: no team to wake for each
    for (size_t i = 0; i < x.size(); ++i) {
        const float h = 0.25f;
        double l[2];
        for (int k = 0; k < 2; ++k) {
            std::vector<float> xp = x;
            xp[i] += k == 0 ? h : -h;
            be.rope_fwd(view(xp, {s.B, s.T, width}), s.NH, s.KVH, s.theta, s.pos0);
            l[k] = dot(to_double(xp), Rd);
        }
        fd[i] = (l[0] - l[1]) / (2.0 * double(h));
    }
    EXPECT_LT(rel_err(to_double(dx), fd), 1e-5);
    // The v part of the gradient passes through.
    for (int r = 0; r < s.B * s.T; ++r)
        for (int col = (s.NH + s.KVH) * s.hd; col < width; ++col)
            EXPECT_EQ(f32_bits(dx[size_t(r) * width + col]), f32_bits(R[size_t(r) * width + col]));
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

TEST(LlamaKernels, SwigluForwardMatchesReference) {
    CpuBackend be;
    const int N = 5, I = 37;
    std::mt19937 rng(6);
    std::vector<float> inp = randn(size_t(N) * 2 * I, rng, 3.0f);
    inp[0] = 0.0f, inp[1] = -30.0f, inp[2] = 30.0f, inp[3] = -100.0f, inp[4] = 95.0f;
    std::vector<float> out(size_t(N) * I, kNaN);
    be.swiglu_fwd(view(out, {N, I}), view(inp, {N, 2 * I}));
    const std::vector<double> want = swiglu_ref(to_double(inp), N, I);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-30) << i;
}

TEST(LlamaKernels, SwigluBackwardMatchesFiniteDifferences) {
    CpuBackend be;
    const int N = 4, I = 37;
    std::mt19937 rng(7);
    std::vector<float> inp = randn(size_t(N) * 2 * I, rng, 2.0f);
    const std::vector<float> R = randn(size_t(N) * I, rng);
    std::vector<float> dinp(inp.size(), kNaN), dout = R;  // written, not accumulated
    be.swiglu_bwd(view(dinp, {N, 2 * I}), view(dout, {N, I}), view(inp, {N, 2 * I}));
    std::vector<double> xd = to_double(inp);
    const std::vector<double> Rd = to_double(R);
    auto loss = [&] { return dot(swiglu_ref(xd, N, I), Rd); };
    EXPECT_LT(rel_err(to_double(dinp), numeric_grad(xd, loss, 1e-5)), 1e-5);

    // Far tails: the gate's gradient tends to u (g -> +inf) and to 0 (g -> -inf).
    std::vector<float> t_inp = {60.0f, -60.0f, 2.0f, 3.0f}, t_d = {1.0f, 1.0f}, t_dinp(4, kNaN);
    be.swiglu_bwd(view(t_dinp, {1, 4}), view(t_d, {1, 2}), view(t_inp, {1, 4}));
    EXPECT_NEAR(t_dinp[0], 2.0f, 1e-6f);
    EXPECT_NEAR(t_dinp[1], 0.0f, 1e-20f);
    EXPECT_NEAR(t_dinp[2], 60.0f, 1e-5f);
    EXPECT_NEAR(t_dinp[3], 0.0f, 1e-20f);
}

TEST(LlamaKernels, GegluMatchesReferenceAndFiniteDifferences) {
    CpuBackend be;
    const int N = 5, I = 37;
    std::mt19937 rng(8);
    std::vector<float> inp = randn(size_t(N) * 2 * I, rng, 3.0f);
    inp[0] = 0.0f, inp[1] = -30.0f, inp[2] = 30.0f, inp[3] = -100.0f, inp[4] = 95.0f;
    std::vector<float> out(size_t(N) * I, kNaN);
    be.geglu_fwd(view(out, {N, I}), view(inp, {N, 2 * I}));
    const std::vector<double> want = geglu_ref(to_double(inp), N, I);
    // Far into the negative tail GELU is tiny and float's 2u carries its rounding into exp(-2u).
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-9) << i;

    std::vector<float> x = randn(size_t(N) * 2 * I, rng, 2.0f);
    const std::vector<float> R = randn(size_t(N) * I, rng);
    std::vector<float> dinp(x.size(), kNaN), dout = R;   // written, not accumulated
    be.geglu_bwd(view(dinp, {N, 2 * I}), view(dout, {N, I}), view(x, {N, 2 * I}));
    std::vector<double> xd = to_double(x);
    const std::vector<double> Rd = to_double(R);
    auto loss = [&] { return dot(geglu_ref(xd, N, I), Rd); };
    EXPECT_LT(rel_err(to_double(dinp), numeric_grad(xd, loss, 1e-5)), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// repeat_kv

TEST(LlamaKernels, RepeatKvForwardLayout) {
    CpuBackend be;
    struct Shape { int NH, KVH, hd; };
    for (const Shape s : {Shape{6, 2, 4}, Shape{4, 1, 3}, Shape{4, 4, 5}}) {
        const int B = 2, T = 3, in_w = (s.NH + 2 * s.KVH) * s.hd, out_w = 3 * s.NH * s.hd, G = s.NH / s.KVH;
        std::vector<float> qkv(size_t(B) * T * in_w);
        for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(i);  // every element distinct
        std::vector<float> full(size_t(B) * T * out_w, kNaN);
        be.repeat_kv_fwd(view(full, {B, T, out_w}), view(qkv, {B, T, in_w}), s.NH, s.KVH);
        for (int r = 0; r < B * T; ++r)
            for (int part = 0; part < 3; ++part)
                for (int h = 0; h < s.NH; ++h)
                    for (int c = 0; c < s.hd; ++c) {
                        const int src_col = part == 0 ? h * s.hd + c
                                                      : s.NH * s.hd + (part - 1) * s.KVH * s.hd + (h / G) * s.hd + c;
                        EXPECT_EQ(full[size_t(r) * out_w + size_t(part) * s.NH * s.hd + size_t(h) * s.hd + c],
                                  qkv[size_t(r) * in_w + size_t(src_col)])
                            << "NH=" << s.NH << " KVH=" << s.KVH << " row " << r << " part " << part << " head " << h;
                    }
        if (s.NH == s.KVH) {
            EXPECT_EQ(full, qkv) << "NH == KVH is a copy";
        }
    }
}

TEST(LlamaKernels, RepeatKvBackwardSumsEachGroup) {
    CpuBackend be;
    struct Shape { int NH, KVH, hd; };
    for (const Shape s : {Shape{6, 2, 4}, Shape{4, 1, 3}, Shape{4, 4, 5}}) {
        const int N = 5, in_w = (s.NH + 2 * s.KVH) * s.hd, out_w = 3 * s.NH * s.hd, G = s.NH / s.KVH;
        std::mt19937 rng(8);
        std::vector<float> dfull = randn(size_t(N) * out_w, rng), dqkv(size_t(N) * in_w, kNaN);
        be.repeat_kv_bwd(view(dqkv, {N, in_w}), view(dfull, {N, out_w}), s.NH, s.KVH);
        for (int r = 0; r < N; ++r) {
            const float * df = dfull.data() + size_t(r) * out_w;
            const float * dq = dqkv.data() + size_t(r) * in_w;
            for (int c = 0; c < s.NH * s.hd; ++c) EXPECT_EQ(f32_bits(dq[c]), f32_bits(df[c])) << "q " << c;
            for (int part = 1; part <= 2; ++part)
                for (int j = 0; j < s.KVH; ++j)
                    for (int c = 0; c < s.hd; ++c) {
                        float want = 0.0f;  // fp32, heads in order
                        for (int g = 0; g < G; ++g) want += df[size_t(part) * s.NH * s.hd + size_t(j * G + g) * s.hd + c];
                        EXPECT_EQ(dq[size_t(s.NH) * s.hd + size_t(part - 1) * s.KVH * s.hd + size_t(j) * s.hd + c], want)
                            << "part " << part << " kv head " << j;
                    }
        }
        if (s.NH == s.KVH) {
            EXPECT_EQ(dqkv, dfull) << "NH == KVH is a copy";
        }

        // The adjoint of the forward: <repeat(x), y> == <x, repeat_bwd(y)>.
        std::vector<float> x = randn(dqkv.size(), rng), fx(dfull.size());
        be.repeat_kv_fwd(view(fx, {N, out_w}), view(x, {N, in_w}), s.NH, s.KVH);
        EXPECT_NEAR(dot(to_double(fx), to_double(dfull)), dot(to_double(x), to_double(dqkv)),
                    1e-5 * std::sqrt(double(dfull.size())));
    }
}

// ---------------------------------------------------------------------------------------------
// Encoder without position embedding

TEST(LlamaKernels, EncoderWithoutPositionEmbedding) {
    CpuBackend be;
    const int B = 2, T = 5, V = 11;
    std::vector<int32_t> tokens = {3, 3, 7, 0, 3, 10, 7, 7, 1, 3};
    Tensor tt(-1, DType::i32, {B, T});
    tt.data = tokens.data();
    for (const int C : {8, 40}) {
        std::mt19937 rng(9);
        std::vector<float> wte = randn(size_t(V) * C, rng), out(size_t(B) * T * C, kNaN);
        be.encoder_fwd(view(out, {B, T, C}), tt, view(wte, {V, C}), Tensor{});
        for (int r = 0; r < B * T; ++r)
            for (int c = 0; c < C; ++c)
                EXPECT_EQ(f32_bits(out[size_t(r) * C + c]), f32_bits(wte[size_t(tokens[size_t(r)]) * C + c]));

        // Backward: dwte[token] += dout rows, in row order (the fp32 kernel's order, bitwise).
        std::vector<float> dout = randn(out.size(), rng);
        const std::vector<float> dwte0 = randn(wte.size(), rng);
        std::vector<float> dwte = dwte0, want = dwte0;
        be.encoder_bwd(view(dwte, {V, C}), Tensor{}, view(dout, {B, T, C}), tt);
        for (int r = 0; r < B * T; ++r)
            for (int c = 0; c < C; ++c) want[size_t(tokens[size_t(r)]) * C + c] += dout[size_t(r) * C + c];
        EXPECT_EQ(dwte, want) << "C=" << C;
        // The same dwte as the call that also accumulates a position embedding's gradient.
        std::vector<float> dwte2 = dwte0, dwpe(size_t(T) * C, 0.0f);
        be.encoder_bwd(view(dwte2, {V, C}), view(dwpe, {T, C}), view(dout, {B, T, C}), tt);
        EXPECT_EQ(dwte2, dwte) << "C=" << C;
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 and f16 storage against the f32 ops on the same rounded inputs

TEST(LlamaKernels, LowPrecisionMatchesF32) {
    CpuBackend be;
    for (const DType dt : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(std::string(dtype_name(dt)));
        std::mt19937 rng(10);
        // RMSNorm
        {
            const int N = 37, C = 72;
            Arr x(dt, {N, C}), w(dt, {C}), out(dt, {N, C}), dout(dt, {N, C}), rstd(DType::f32, {N});
            Arr xf(DType::f32, {N, C}), wf(DType::f32, {C}), outf(DType::f32, {N, C}), doutf(DType::f32, {N, C}),
                rstdf(DType::f32, {N});
            const std::vector<float> xv = rand_in(x.n(), dt, rng, 2.0f, 0.5f), wv = rand_in(C, dt, rng, 0.5f, 1.0f),
                                     gv = rand_in(dout.n(), dt, rng);
            x.set(xv), xf.set(xv), w.set(wv), wf.set(wv), dout.set(gv), doutf.set(gv);
            be.rmsnorm_fwd(out.t, rstd.t, x.t, w.t, 1e-5f);
            be.rmsnorm_fwd(outf.t, rstdf.t, xf.t, wf.t, 1e-5f);
            expect_rounded(out.get(), outf.get(), dt, "rmsnorm_fwd out");
            expect_rounded(rstd.get(), rstdf.get(), DType::f32, "rmsnorm_fwd rstd");
            for (const DType g : {DType::f32, dt}) {
                const std::vector<float> dx0 = rand_in(x.n(), dt, rng), dw0 = rand_in(C, dt, rng);
                Arr dx(dt, {N, C}), dxf(DType::f32, {N, C}), dw(g, {C}), dwf(DType::f32, {C});
                dx.set(dx0), dxf.set(dx0), dw.set(dw0), dwf.set(dw0);
                be.rmsnorm_bwd(dx.t, dw.t, dout.t, x.t, w.t, rstdf.t);
                be.rmsnorm_bwd(dxf.t, dwf.t, doutf.t, xf.t, wf.t, rstdf.t);
                const std::string tag = "rmsnorm_bwd (dw " + std::string(dtype_name(g)) + ") ";
                expect_rounded(dx.get(), dxf.get(), dt, tag + "dinp");
                expect_rounded(dw.get(), dwf.get(), g, tag + "dw");
            }
        }
        // RoPE (the same fp32 arithmetic, one rounding)
        {
            const int B = 2, T = 7, NH = 4, KVH = 2, hd = 8, width = (NH + 2 * KVH) * hd;
            const std::vector<float> v = rand_in(size_t(B) * T * width, dt, rng);
            Arr q(dt, {B, T, width}), qf(DType::f32, {B, T, width});
            q.set(v), qf.set(v);
            be.rope_fwd(q.t, NH, KVH, 10000.0f, 5);
            be.rope_fwd(qf.t, NH, KVH, 10000.0f, 5);
            expect_rounded(q.get(), qf.get(), dt, "rope_fwd", 0.0);
            q.set(v), qf.set(v);
            be.rope_bwd(q.t, NH, KVH, 10000.0f, 5);
            be.rope_bwd(qf.t, NH, KVH, 10000.0f, 5);
            expect_rounded(q.get(), qf.get(), dt, "rope_bwd", 0.0);
        }
        // SwiGLU
        {
            const int N = 9, I = 45;
            const std::vector<float> iv = rand_in(size_t(N) * 2 * I, dt, rng, 2.0f), gv = rand_in(size_t(N) * I, dt, rng);
            Arr inp(dt, {N, 2 * I}), inpf(DType::f32, {N, 2 * I}), out(dt, {N, I}), outf(DType::f32, {N, I});
            Arr d(dt, {N, I}), df(DType::f32, {N, I}), dinp(dt, {N, 2 * I}), dinpf(DType::f32, {N, 2 * I});
            inp.set(iv), inpf.set(iv), d.set(gv), df.set(gv);
            be.swiglu_fwd(out.t, inp.t);
            be.swiglu_fwd(outf.t, inpf.t);
            expect_rounded(out.get(), outf.get(), dt, "swiglu_fwd", 0.0);
            be.swiglu_bwd(dinp.t, d.t, inp.t);
            be.swiglu_bwd(dinpf.t, df.t, inpf.t);
            expect_rounded(dinp.get(), dinpf.get(), dt, "swiglu_bwd", 0.0);
        }
        // repeat_kv (forward: copies, exact; backward: fp32 sums, one rounding)
        {
            const int N = 6, NH = 6, KVH = 2, hd = 8, in_w = (NH + 2 * KVH) * hd, out_w = 3 * NH * hd;
            const std::vector<float> qv = rand_in(size_t(N) * in_w, dt, rng), fv = rand_in(size_t(N) * out_w, dt, rng);
            Arr qkv(dt, {N, in_w}), qkvf(DType::f32, {N, in_w}), full(dt, {N, out_w}), fullf(DType::f32, {N, out_w});
            qkv.set(qv), qkvf.set(qv);
            be.repeat_kv_fwd(full.t, qkv.t, NH, KVH);
            be.repeat_kv_fwd(fullf.t, qkvf.t, NH, KVH);
            EXPECT_EQ(full.get(), fullf.get()) << "repeat_kv_fwd";
            full.set(fv), fullf.set(fv);
            be.repeat_kv_bwd(qkv.t, full.t, NH, KVH);
            be.repeat_kv_bwd(qkvf.t, fullf.t, NH, KVH);
            expect_rounded(qkv.get(), qkvf.get(), dt, "repeat_kv_bwd", 0.0);
        }
        // Encoder without wpe
        {
            const int B = 3, T = 9, C = 72, V = 11;
            std::vector<int32_t> tok(size_t(B) * T);
            for (auto & t : tok) t = int32_t(rng() % 5);  // many repeats
            Tensor tt(-1, DType::i32, {B, T});
            tt.data = tok.data();
            const std::vector<float> wv = rand_in(size_t(V) * C, dt, rng), gv = rand_in(size_t(B) * T * C, dt, rng);
            Arr wte(dt, {V, C}), wtef(DType::f32, {V, C}), out(dt, {B, T, C}), outf(DType::f32, {B, T, C});
            wte.set(wv), wtef.set(wv);
            be.encoder_fwd(out.t, tt, wte.t, Tensor{});
            be.encoder_fwd(outf.t, tt, wtef.t, Tensor{});
            EXPECT_EQ(out.get(), outf.get()) << "encoder_fwd without wpe";
            Arr d(dt, {B, T, C}), df(DType::f32, {B, T, C});
            d.set(gv), df.set(gv);
            for (const DType ge : {DType::f32, dt}) {
                const std::vector<float> w0 = rand_in(size_t(V) * C, dt, rng);
                Arr dwte(ge, {V, C}), dwtef(DType::f32, {V, C});
                dwte.set(w0), dwtef.set(w0);
                be.encoder_bwd(dwte.t, Tensor{}, d.t, tt);
                be.encoder_bwd(dwtef.t, Tensor{}, df.t, tt);
                expect_rounded(dwte.get(), dwtef.get(), ge,
                               "encoder_bwd without dwpe, dwte " + std::string(dtype_name(ge)));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Graph: recording (names, FLOPs, buffers; invalid tensors skipped) and execution

TEST(LlamaKernels, GraphRecordsAndRunsTheOps) {
    const int B = 2, T = 3, C = 16, NH = 4, KVH = 2, hd = 4, I = 24, V = 7;
    const int qkv_w = (NH + 2 * KVH) * hd, full_w = 3 * NH * hd;
    Program p;
    auto decl = [&](const char * name, int64_t elems, DType dt = DType::f32) {
        return p.declare(name, Category::activations, size_t(elems) * dtype_size(dt), true);
    };
    const BufferId b_tok = decl("tokens", B * T, DType::i32), b_wte = decl("wte", V * C), b_x = decl("x", B * T * C),
                   b_w = decl("w", C), b_y = decl("y", B * T * C), b_rstd = decl("rstd", B * T),
                   b_qkv = decl("qkv", B * T * qkv_w), b_full = decl("full", B * T * full_w),
                   b_h = decl("h", B * T * 2 * I), b_o = decl("o", B * T * I), b_dx = decl("dx", B * T * C),
                   b_dw = decl("dw", C), b_dh = decl("dh", B * T * 2 * I), b_dwte = decl("dwte", V * C);
    const Tensor tok(b_tok, DType::i32, {B, T}), wte(b_wte, DType::f32, {V, C}), x(b_x, DType::f32, {B, T, C}),
        w(b_w, DType::f32, {C}), y(b_y, DType::f32, {B, T, C}), rstd(b_rstd, DType::f32, {B * T}),
        qkv(b_qkv, DType::f32, {B, T, qkv_w}), full(b_full, DType::f32, {B, T, full_w}),
        h(b_h, DType::f32, {B, T, 2 * I}), o(b_o, DType::f32, {B, T, I}), dx(b_dx, DType::f32, {B, T, C}),
        dw(b_dw, DType::f32, {C}), dh(b_dh, DType::f32, {B, T, 2 * I}), dwte(b_dwte, DType::f32, {V, C});
    auto step = [&](Graph & g) {
        g.encoder_fwd(x, tok, wte, Tensor{});
        g.rmsnorm_fwd(y, rstd, x, w, 1e-5f);
        g.rope_fwd(qkv, NH, KVH, 10000.0f, 2);
        g.repeat_kv_fwd(full, qkv, NH, KVH);
        g.swiglu_fwd(o, h);
        g.swiglu_bwd(dh, o, h);
        g.repeat_kv_bwd(qkv, full, NH, KVH);
        g.rope_bwd(qkv, NH, KVH, 10000.0f, 2);
        g.rmsnorm_bwd(dx, dw, y, x, w, rstd);
        g.encoder_bwd(dwte, Tensor{}, dx, tok);
    };
    {
        Graph rec(p, nullptr);
        step(rec);
    }
    p.finalize();
    ASSERT_EQ(p.num_ops(), 10);
    const auto & ops = p.ops();
    const char * names[] = {"encoder_fwd",  "rmsnorm_fwd",   "rope_fwd", "repeat_kv_fwd", "swiglu_fwd",
                            "swiglu_bwd",   "repeat_kv_bwd", "rope_bwd", "rmsnorm_bwd",   "encoder_bwd"};
    for (int i = 0; i < 10; ++i) EXPECT_STREQ(ops[size_t(i)].name, names[i]);
    EXPECT_EQ(ops[0].uses, (std::vector<BufferId>{b_x, b_tok, b_wte}));  // the invalid wpe is skipped
    EXPECT_EQ(ops[2].uses, (std::vector<BufferId>{b_qkv}));
    EXPECT_EQ(ops[9].uses, (std::vector<BufferId>{b_dwte, b_dx, b_tok}));
    EXPECT_EQ(ops[1].flops, 4.0 * B * T * C);
    EXPECT_EQ(ops[2].flops, 6.0 * B * T * (NH + KVH) * hd / 2);
    EXPECT_EQ(ops[3].flops, 0.0);
    EXPECT_EQ(ops[4].flops, 6.0 * B * T * I);
    EXPECT_EQ(ops[6].flops, 2.0 * B * T * (NH - KVH) * hd);
    EXPECT_EQ(ops[8].flops, 8.0 * B * T * C);
    EXPECT_EQ(ops[0].bytes, double(B * T * C * 4 + B * T * 4 + V * C * 4));

    // Execute with placed buffers, and the same ops on plain copies through the backend.
    const MemoryPlan plan = plan_memory(p);
    Ledger ledger;
    StepMemory mem(p, plan, ledger, host_allocator());
    CpuBackend be;
    std::mt19937 rng(11);
    std::vector<int32_t> tokv(size_t(B) * T);
    for (auto & t : tokv) t = int32_t(rng() % V);
    auto fill = [&](BufferId id, const std::vector<float> & v) { std::memcpy(mem.base(id), v.data(), v.size() * 4); };
    std::memcpy(mem.base(b_tok), tokv.data(), tokv.size() * 4);
    std::vector<float> wtev = randn(size_t(V) * C, rng), wv = randn(C, rng, 0.3f, 1.0f),
                       qkvv = randn(size_t(B) * T * qkv_w, rng), hv = randn(size_t(B) * T * 2 * I, rng),
                       dwv(size_t(C), 0.0f), dxv(size_t(B) * T * C, 0.0f), dwtev(size_t(V) * C, 0.0f);
    fill(b_wte, wtev), fill(b_w, wv), fill(b_qkv, qkvv), fill(b_h, hv), fill(b_dw, dwv), fill(b_dx, dxv),
        fill(b_dwte, dwtev);
    {
        Graph g(p, mem, be);
        step(g);
        EXPECT_EQ(g.ops_issued(), 10);
    }
    Tensor rtok(-1, DType::i32, {B, T});
    rtok.data = tokv.data();
    std::vector<float> xv(size_t(B) * T * C), yv(xv.size()), rv(size_t(B) * T), fullv(size_t(B) * T * full_w),
        ov(size_t(B) * T * I), dhv(hv.size());
    be.encoder_fwd(view(xv, {B, T, C}), rtok, view(wtev, {V, C}), Tensor{});
    be.rmsnorm_fwd(view(yv, {B, T, C}), view(rv, {B * T}), view(xv, {B, T, C}), view(wv, {C}), 1e-5f);
    be.rope_fwd(view(qkvv, {B, T, qkv_w}), NH, KVH, 10000.0f, 2);
    be.repeat_kv_fwd(view(fullv, {B, T, full_w}), view(qkvv, {B, T, qkv_w}), NH, KVH);
    be.swiglu_fwd(view(ov, {B, T, I}), view(hv, {B, T, 2 * I}));
    be.swiglu_bwd(view(dhv, {B, T, 2 * I}), view(ov, {B, T, I}), view(hv, {B, T, 2 * I}));
    be.repeat_kv_bwd(view(qkvv, {B, T, qkv_w}), view(fullv, {B, T, full_w}), NH, KVH);
    be.rope_bwd(view(qkvv, {B, T, qkv_w}), NH, KVH, 10000.0f, 2);
    be.rmsnorm_bwd(view(dxv, {B, T, C}), view(dwv, {C}), view(yv, {B, T, C}), view(xv, {B, T, C}), view(wv, {C}),
                   view(rv, {B * T}));
    be.encoder_bwd(view(dwtev, {V, C}), Tensor{}, view(dxv, {B, T, C}), rtok);
    auto same = [&](BufferId id, const std::vector<float> & want, const char * what) {
        EXPECT_EQ(0, std::memcmp(mem.base(id), want.data(), want.size() * 4)) << what;
    };
    same(b_x, xv, "x"), same(b_y, yv, "y"), same(b_rstd, rv, "rstd"), same(b_full, fullv, "full");
    same(b_o, ov, "o"), same(b_dh, dhv, "dh"), same(b_qkv, qkvv, "qkv"), same(b_dx, dxv, "dx");
    same(b_dw, dwv, "dw"), same(b_dwte, dwtev, "dwte");
}

}  // namespace
}  // namespace memfit
