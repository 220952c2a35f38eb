// DnnlGemm (oneDNN 2.6 matmul behind GemmDesc): correctness against a double-precision reference
// for every transpose / accumulate / bias combination, bitwise reproducibility across reuse,
// exact-size user scratchpads, the abort paths, and (printed, not asserted) the matmul peak and
// the matmul peak probe (timing the GPT-2 shapes is `memfit bench`'s job, not a unit test's).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "backend/cpu/dnnl_check.h"
#include "backend/cpu/dnnl_gemm.h"
#include "backend/cpu/matmul_probe.h"

namespace memfit::cpu {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float & x : v) x = dist(rng);
    return v;
}

// Exactly `n` bytes (null when n == 0), so that a sanitizer build catches any overrun.
std::unique_ptr<std::byte[]> exact_workspace(size_t n) {
    return n == 0 ? nullptr : std::unique_ptr<std::byte[]>(new std::byte[n]);
}

// C (+)= op(A) op(B) (+ bias) in double, storage as documented on GemmDesc.
std::vector<double> reference(const GemmDesc & d, const std::vector<float> & a, const std::vector<float> & b,
                              const std::vector<float> & bias, const std::vector<float> & c_old) {
    std::vector<double> c(size_t(d.M * d.N));
    for (int64_t m = 0; m < d.M; ++m) {
        for (int64_t n = 0; n < d.N; ++n) {
            double s = 0.0;
            for (int64_t k = 0; k < d.K; ++k) {
                const double av = d.trans_a ? a[size_t(k * d.M + m)] : a[size_t(m * d.K + k)];
                const double bv = d.trans_b ? b[size_t(n * d.K + k)] : b[size_t(k * d.N + n)];
                s += av * bv;
            }
            if (d.bias) s += bias[size_t(n)];
            if (d.accumulate) s += c_old[size_t(m * d.N + n)];
            c[size_t(m * d.N + n)] = s;
        }
    }
    return c;
}

// max |got - want| / max |want|
double rel_error(const std::vector<float> & got, const std::vector<double> & want) {
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        err = std::max(err, std::abs(double(got[i]) - want[i]));
        ref = std::max(ref, std::abs(want[i]));
    }
    return err / std::max(ref, 1e-30);
}

std::string describe(const GemmDesc & d) {
    return "M=" + std::to_string(d.M) + " N=" + std::to_string(d.N) + " K=" + std::to_string(d.K) +
           " trans_a=" + std::to_string(d.trans_a) + " trans_b=" + std::to_string(d.trans_b) +
           " accumulate=" + std::to_string(d.accumulate) + " bias=" + std::to_string(d.bias);
}

// Every legal flag combination (bias only without accumulate) for one shape.
std::vector<GemmDesc> all_variants(int64_t M, int64_t N, int64_t K) {
    std::vector<GemmDesc> out;
    for (int f = 0; f < 16; ++f) {
        GemmDesc d;
        d.M = M, d.N = N, d.K = K;
        d.trans_a = f & 1, d.trans_b = f & 2, d.accumulate = f & 4, d.bias = f & 8;
        if (d.bias && d.accumulate) continue;
        out.push_back(d);
    }
    return out;
}

struct Problem {
    std::vector<float> a, b, bias, c_old;
    Problem(const GemmDesc & d, uint32_t seed)
        : a(random_vec(size_t(d.M * d.K), seed)),
          b(random_vec(size_t(d.K * d.N), seed + 1)),
          bias(d.bias ? random_vec(size_t(d.N), seed + 2) : std::vector<float>{}),
          c_old(random_vec(size_t(d.M * d.N), seed + 3)) {}
};

// Runs d on p with an exact-size workspace; C starts as p.c_old.
std::vector<float> run_once(DnnlGemm & g, const GemmDesc & d, const Problem & p) {
    std::vector<float> c = p.c_old;
    auto ws = exact_workspace(g.workspace_bytes(d));
    g.run(d, c.data(), p.a.data(), p.b.data(), d.bias ? p.bias.data() : nullptr, ws.get());
    return c;
}

TEST(DnnlGemm, MatchesDoubleReferenceForAllVariants) {
    DnnlGemm g;
    const int64_t shapes[][3] = {{7, 13, 5}, {65, 33, 129}, {1, 1, 1}, {3, 200, 17}};
    uint32_t seed = 1;
    for (const auto & s : shapes) {
        for (const GemmDesc & d : all_variants(s[0], s[1], s[2])) {
            const Problem p(d, seed += 10);
            const std::vector<float> c = run_once(g, d, p);
            const std::vector<double> want = reference(d, p.a, p.b, p.bias, p.c_old);
            EXPECT_LT(rel_error(c, want), 1e-5) << describe(d);
        }
    }
}

TEST(DnnlGemm, AccumulateAddsToExistingC) {
    // C_new = C_old + A.B exactly as two separate computations would give (up to fp32 rounding),
    // and accumulating twice adds the product twice.
    DnnlGemm g;
    GemmDesc d;
    d.M = 65, d.N = 33, d.K = 129, d.trans_a = true, d.accumulate = true;
    const Problem p(d, 77);
    std::vector<float> c = p.c_old;
    // The sum post-op takes a scratchpad on AVX-512 CPUs (none on AVX2): always the planned one.
    auto ws = exact_workspace(g.workspace_bytes(d));
    g.run(d, c.data(), p.a.data(), p.b.data(), nullptr, ws.get());
    g.run(d, c.data(), p.a.data(), p.b.data(), nullptr, ws.get());
    GemmDesc plain = d;
    plain.accumulate = false;
    const std::vector<double> prod = reference(plain, p.a, p.b, p.bias, p.c_old);
    std::vector<double> want(prod.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = double(p.c_old[i]) + 2.0 * prod[i];
    EXPECT_LT(rel_error(c, want), 1e-5);
}

TEST(DnnlGemm, ReuseAcrossShapesIsBitwiseReproducible) {
    DnnlGemm g;
    std::vector<GemmDesc> descs = all_variants(65, 33, 129);
    for (const GemmDesc & d : all_variants(7, 13, 5)) descs.push_back(d);
    for (const GemmDesc & d : all_variants(256, 96, 300)) descs.push_back(d);

    std::vector<Problem> problems;
    std::vector<std::vector<float>> first;
    for (size_t i = 0; i < descs.size(); ++i) {
        problems.emplace_back(descs[i], uint32_t(1000 + 10 * i));
        first.push_back(run_once(g, descs[i], problems[i]));
    }
    // Second and third passes in a different order, same DnnlGemm, then a fresh one.
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t j = descs.size(); j-- > 0;) {
            const std::vector<float> again = run_once(g, descs[j], problems[j]);
            EXPECT_EQ(0, std::memcmp(again.data(), first[j].data(), again.size() * sizeof(float)))
                << describe(descs[j]) << " pass " << pass;
        }
    }
    DnnlGemm fresh;
    for (size_t j = 0; j < descs.size(); ++j) {
        const std::vector<float> again = run_once(fresh, descs[j], problems[j]);
        EXPECT_EQ(0, std::memcmp(again.data(), first[j].data(), again.size() * sizeof(float)))
            << describe(descs[j]) << " fresh DnnlGemm";
    }
}

TEST(DnnlGemm, WorkspaceBytesStableAndExactSizeSuffices) {
    DnnlGemm g;
    std::vector<GemmDesc> descs;
    for (const GemmDesc & d : all_variants(7, 13, 5)) descs.push_back(d);
    for (const GemmDesc & d : all_variants(65, 33, 129)) descs.push_back(d);
    for (const GemmDesc & d : all_variants(129, 200, 257)) descs.push_back(d);

    std::vector<size_t> first;
    for (const GemmDesc & d : descs) first.push_back(g.workspace_bytes(d));
    for (size_t i = 0; i < descs.size(); ++i) {
        const GemmDesc & d = descs[i];
        EXPECT_EQ(first[i], g.workspace_bytes(d)) << describe(d);
        // A fresh instance (no cached primitive) reports the same size.
        DnnlGemm other;
        EXPECT_EQ(first[i], other.workspace_bytes(d)) << describe(d);

        const Problem p(d, uint32_t(5000 + 10 * i));
        std::vector<float> c = p.c_old;
        auto ws = exact_workspace(first[i]);   // exactly workspace_bytes(d), null when 0
        g.run(d, c.data(), p.a.data(), p.b.data(), d.bias ? p.bias.data() : nullptr, ws.get());
        EXPECT_LT(rel_error(c, reference(d, p.a, p.b, p.bias, p.c_old)), 1e-5) << describe(d);
    }
}

TEST(DnnlGemmDeathTest, VendorErrorsAndBrokenContractsAbort) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    // A oneDNN failure goes through MF_DNNL and aborts with file, line, the call and the message.
    EXPECT_DEATH(MF_DNNL(dnnl::memory::desc({2, 3}, dnnl::memory::data_type::f32, dnnl::memory::dims{1})),
                 "internal error at .*test_dnnl_gemm.cpp:[0-9]+: oneDNN call failed: "
                 "dnnl::memory::desc.*\\(status invalid_arguments\\)");
    // bias is only defined without accumulate.
    auto bias_with_accumulate = [] {
        DnnlGemm g;
        GemmDesc d;
        d.M = d.N = d.K = 4;
        d.accumulate = d.bias = true;
        (void) g.workspace_bytes(d);
    };
    EXPECT_DEATH(bias_with_accumulate(), "assertion failed: !\\(d.bias && d.accumulate\\)");
}

// Sets the OpenMP thread count for a scope.
class ThreadsScope {
public:
    explicit ThreadsScope(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
    ~ThreadsScope() { omp_set_num_threads(saved_); }
private:
    int saved_;
};

TEST(DnnlGemmReport, PeakGflopsTwoThreads) {
    ThreadsScope threads(2);
    const auto t0 = std::chrono::steady_clock::now();
    const double peak = measure_matmul_peak_gflops(5);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ report   ] matmul peak (2 threads): %.1f GFLOP/s (probe took %.2f s)\n", peak, secs);
    EXPECT_GT(peak, 0.0);
}

}  // namespace
}  // namespace memfit::cpu
