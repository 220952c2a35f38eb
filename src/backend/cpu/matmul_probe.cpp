#include "backend/cpu/matmul_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dnnl_gemm.h"
#include "backend/cpu/gemm_mixed.h"
#include "core/dtype.h"

namespace memfit::cpu {

namespace {

struct Shape { int64_t M, K, N; };
// MLP up, MLP down and QKV gemms of a 384-channel model at B*T = 2048.
constexpr Shape kShapes[] = {{2048, 384, 1536}, {2048, 1536, 384}, {2048, 384, 1152}};

template <class F>
double best_gflops(int repeats, F && run_shape) {
    double best = 0;
    for (const Shape & s : kShapes) {
        std::vector<double> secs;
        run_shape(s, [&](auto && call) {
            call();   // warm-up
            for (int r = 0; r < std::max(repeats, 1); ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                call();
                secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
        });
        if (secs.empty()) return 0;
        std::nth_element(secs.begin(), secs.begin() + long(secs.size() / 2), secs.end());
        best = std::max(best, 2.0 * double(s.M) * double(s.N) * double(s.K) / secs[secs.size() / 2] * 1e-9);
    }
    return best;
}

}  // namespace

double measure_matmul_peak_gflops(int repeats) {
    DnnlGemm gemm;
    return best_gflops(repeats, [&](const Shape & s, auto && time) {
        GemmDesc d;
        d.M = s.M, d.N = s.N, d.K = s.K;
        std::vector<float> a(size_t(s.M * s.K), 0.01f), b(size_t(s.K * s.N), 0.02f), c(size_t(s.M * s.N));
        std::vector<std::byte> ws(gemm.workspace_bytes(d));
        void * wsp = ws.empty() ? nullptr : ws.data();
        time([&] { gemm.run(d, c.data(), a.data(), b.data(), nullptr, wsp); });
    });
}

double measure_onednn_bf16_gflops(int repeats) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(eng);
    return best_gflops(repeats, [&](const Shape & s, auto && time) {
        const dnnl::memory::desc a({s.M, s.K}, dt::bf16, tag::ab), b({s.K, s.N}, dt::bf16, tag::ab),
            c({s.M, s.N}, dt::f32, tag::ab);
        dnnl::matmul::primitive_desc pd;
        try {
            pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng);
        } catch (const dnnl::error &) {
            return;   // no bf16 matmul on this CPU
        }
        // oneDNN's reference implementation (CPUs without bf16 instructions) runs at a few
        // GFLOP/s: not timed, 0.
        if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return;
        dnnl::memory ma(a, eng), mb(b, eng), mc(c, eng);
        std::fill_n(static_cast<uint16_t *>(ma.get_data_handle()), s.M * s.K, f32_to_bf16(0.01f));
        std::fill_n(static_cast<uint16_t *>(mb.get_data_handle()), s.K * s.N, f32_to_bf16(0.02f));
        dnnl::matmul prim(pd);
        time([&] {
            prim.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
            stream.wait();
        });
    });
}

namespace {

// A bf16 x bf16 -> bf16 gemm of the probe's shape and its operands (constant values).
struct Bf16Gemm {
    GemmDesc d;
    struct { std::vector<uint16_t> a, b, c; } io;
    explicit Bf16Gemm(const Shape & s) {
        d.M = s.M, d.N = s.N, d.K = s.K;
        d.a = d.b = d.c = DType::bf16;
        io.a.assign(size_t(s.M * s.K), f32_to_bf16(0.01f));
        io.b.assign(size_t(s.K * s.N), f32_to_bf16(0.02f));
        io.c.assign(size_t(s.M * s.N), 0);
    }
};

}  // namespace

double measure_bf16_storage_gflops(int repeats) {
    CpuBackend backend;
    return best_gflops(repeats, [&](const Shape & s, auto && time) {
        Bf16Gemm g(s);
        const GemmDesc & d = g.d;
        auto & [a, b, c] = g.io;
        std::vector<std::byte> ws(backend.gemm_workspace(d));
        Tensor ta(-1, DType::bf16, {s.M, s.K}), tb(-1, DType::bf16, {s.K, s.N}), tc(-1, DType::bf16, {s.M, s.N}),
            tw(-1, DType::u8, {int64_t(ws.size())});
        ta.data = a.data(), tb.data = b.data(), tc.data = c.data(), tw.data = ws.data();
        time([&] { backend.gemm(d, tc, ta, tb, Tensor{}, tw); });
    });
}

double measure_bf16_convert_gflops(int repeats) {
    DnnlGemm gemm;
    MixedGemm mixed(gemm);
    return best_gflops(repeats, [&](const Shape & s, auto && time) {
        Bf16Gemm g(s);
        const GemmDesc & d = g.d;
        auto & [a, b, c] = g.io;
        std::vector<std::byte> ws(mixed.workspace_bytes(d));
        time([&] { mixed.run(d, c.data(), a.data(), b.data(), nullptr, ws.data()); });
    });
}

}  // namespace memfit::cpu
