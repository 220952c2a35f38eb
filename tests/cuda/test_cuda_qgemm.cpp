// The CUDA backend's quantized gemm (QLoRA's frozen base, a quantized decoder): qgemm_fwd and
// qgemm_bwd against the CPU backend's, on a matrix of several dequantization tiles (the last one
// short), with and without bias, written and accumulated (every packed format, GPTQ's too); and its
// workspace is one tile, not W'.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "backend/quant_format.h"
#include "core/dtype.h"
#include "memory/arena.h"
#include "op_check.h"

namespace memfit::test {
namespace {

// A host buffer and its device twin.
struct Twin {
    std::vector<uint8_t> host;
    void * dev = nullptr;
    Twin(size_t bytes) : host(bytes) { dev = gpu()->allocator().allocate(bytes); }
    ~Twin() { gpu()->allocator().release(dev, host.size()); }
    Tensor on(bool device, DType dt, std::initializer_list<int64_t> dims) {
        Tensor t(-1, dt, dims);
        t.data = device ? dev : host.data();
        return t;
    }
    void upload() { gpu()->upload(dev, host.data(), host.size()); }
    std::vector<float> from_device(DType dt) const {
        std::vector<uint8_t> b(host.size());
        gpu()->download(b.data(), dev, b.size());
        std::vector<float> f(b.size() / dtype_size(dt));
        widen_to_f32(f.data(), b.data(), f.size(), dt);
        return f;
    }
    std::vector<float> from_host(DType dt) const {
        std::vector<float> f(host.size() / dtype_size(dt));
        widen_to_f32(f.data(), host.data(), f.size(), dt);
        return f;
    }
};

void fill(Twin & t, DType dt, uint32_t seed, float sd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> v(t.host.size() / dtype_size(dt));
    for (auto & x : v) x = nd(rng);
    narrow_f32(t.host.data(), v.data(), v.size(), dt);
    t.upload();
}

void check_qgemm(QuantFormat fmt, int64_t out, int64_t in, int64_t M, DType dt, int bits = 0, int group = 0) {
    SCOPED_TRACE(std::string(quant_format_name(fmt)) + " " + std::string(dtype_name(dt)) + " " +
                 std::to_string(out) + "x" + std::to_string(in));
    CudaBackend & g = *gpu();
    CpuBackend cpu;
    const QuantDesc q{fmt, out, in, bits, group};
    std::vector<float> W(size_t(out * in));
    std::mt19937 rng(uint32_t(out + in));
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (auto & x : W) x = nd(rng);
    Twin pk(quant_bytes(q));
    cpu.quantize(q, pk.host.data(), W.data());
    pk.upload();
    const size_t es = dtype_size(dt);
    Twin x(size_t(M * in) * es), bias(size_t(out) * es), y(size_t(M * out) * es), dy(size_t(M * out) * es),
        dx(size_t(M * in) * es);
    fill(x, dt, 1, 1.0f), fill(bias, dt, 2, 0.1f), fill(dy, dt, 3, 1.0f), fill(dx, dt, 4, 1.0f);
    const size_t ws_gpu = g.qgemm_workspace(q, M, dt), ws_cpu = cpu.qgemm_workspace(q, M, dt);
    const int64_t R = cuda_qgemm_tile_rows(q);   // one tile of W', not the whole
    EXPECT_EQ(ws_gpu, align_up(size_t(R * in) * es, 256));
    if (R < out) {
        EXPECT_LT(ws_gpu, size_t(out * in) * es);
    }
    EXPECT_EQ(ws_gpu, cuda_qgemm_workspace(q, M, dt));
    Twin wg(ws_gpu), wc(ws_cpu);
    auto both = [&](auto && op) {
        op(cpu, false, wc.on(false, DType::u8, {int64_t(ws_cpu)}));
        op(g, true, wg.on(true, DType::u8, {int64_t(ws_gpu)}));
        g.synchronize();
    };
    const double t = dt == DType::f32 ? 1e-5 : 2e-2;
    for (const bool with_bias : {true, false}) {
        both([&](Backend & b, bool d, Tensor ws) {
            b.qgemm_fwd(q, y.on(d, dt, {M, out}), x.on(d, dt, {M, in}), pk.on(d, DType::u8, {int64_t(pk.host.size())}),
                        with_bias ? bias.on(d, dt, {out}) : Tensor{}, ws);
        });
        EXPECT_LT(rel(y.from_host(dt), y.from_device(dt)), t) << "forward, bias " << with_bias;
    }
    for (const bool acc : {false, true}) {
        both([&](Backend & b, bool d, Tensor ws) {
            b.qgemm_bwd(q, dx.on(d, dt, {M, in}), dy.on(d, dt, {M, out}), pk.on(d, DType::u8, {int64_t(pk.host.size())}),
                        acc, ws);
        });
        EXPECT_LT(rel(dx.from_host(dt), dx.from_device(dt)), t) << "backward, accumulate " << acc;
    }
}

TEST(CudaQuant, TiledQgemmMatchesCpu) {
    MF_REQUIRE_GPU();
    // 8192 inputs: tiles of 512 rows, so 520 outputs are a full tile and a short one of 8.
    ASSERT_EQ(cuda_qgemm_tile_rows(QuantDesc{QuantFormat::nf4_dq, 520, 8192}), 512);
    for (const DType dt : {DType::f32, DType::bf16}) {
        check_qgemm(QuantFormat::nf4_dq, 520, 8192, 3, dt);
        check_qgemm(QuantFormat::int8, 520, 8192, 3, dt);
        check_qgemm(QuantFormat::sparse24, 520, 8192, 3, dt);
        check_qgemm(QuantFormat::nf4, 48, 72, 5, dt);   // one tile, the whole matrix
        check_qgemm(QuantFormat::gptq, 520, 8192, 3, dt, 4, 128);   // GPTQ 4-bit, groups of 128
        check_qgemm(QuantFormat::gptq, 48, 64, 5, dt, 8, 32);       // 8-bit codes, 4 to a word
    }
}

// DoRA's norms on a packed base (QDoRA): the rows col0 .. col0 + cols - 1 dequantized 64 at a time
// (two full tiles and a short one), against the CPU backend's, with bf16 adapters.
TEST(CudaQuant, DoraNormsOnPackedRowsMatchCpu) {
    MF_REQUIRE_GPU();
    for (QuantFormat fmt : {QuantFormat::nf4_dq, QuantFormat::int8, QuantFormat::sparse24}) {
        SCOPED_TRACE(quant_format_name(fmt));
        CudaBackend & g = *gpu();
        CpuBackend cpu;
        const int64_t out = 200, in = 72, col0 = 16, cols = 150, r = 4;
        const QuantDesc q{fmt, out, in};
        std::vector<float> W(size_t(out * in));
        std::mt19937 rng(5);
        std::normal_distribution<float> nd(0.0f, 0.02f);
        for (auto & x : W) x = nd(rng);
        Twin pk(quant_bytes(q)), a(size_t(r * in) * 2), b(size_t(cols * r) * 2), norm(size_t(cols) * 4);
        cpu.quantize(q, pk.host.data(), W.data());
        pk.upload();
        fill(a, DType::bf16, 6, 0.1f), fill(b, DType::bf16, 7, 0.05f);
        const size_t ws = g.dora_norm_workspace(q, cols);
        EXPECT_EQ(ws, size_t(64 * in) * 4);   // one tile, not the rows
        Twin wg(ws), wc(cpu.dora_norm_workspace(q, cols));
        for (bool d : {false, true}) {
            Backend & be = d ? static_cast<Backend &>(g) : cpu;
            be.dora_norm_packed(norm.on(d, DType::f32, {cols}), q, pk.on(d, DType::u8, {int64_t(pk.host.size())}), col0,
                                a.on(d, DType::bf16, {r, in}), b.on(d, DType::bf16, {cols, r}), 0.75f,
                                (d ? wg : wc).on(d, DType::u8, {int64_t(ws)}));
        }
        g.synchronize();
        EXPECT_LT(rel(norm.from_host(DType::f32), norm.from_device(DType::f32)), 1e-5);
        EXPECT_GT(norm.from_host(DType::f32)[cols - 1], 0.01f);
    }
}

}  // namespace
}  // namespace memfit::test
