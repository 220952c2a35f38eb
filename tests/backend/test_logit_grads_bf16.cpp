// The LM head's backward under bf16 weights (Graph::matmul_bwd's round_dout): where the backend
// multiplies bf16 natively (Backend::native_gemm), the fp32 logit gradients are rounded to bf16 in
// place (Backend::round_bf16_rows: each row into its own first 2V bytes) and both products read
// them strided (GemmDesc::lda = 2V); elsewhere the flag changes nothing. Checked:
//   - the in-place rounding is the scalar round-to-nearest-even of every element (ties, inf, NaN,
//     subnormals, the largest finite), rows in parallel, rows not a multiple of the kernel's block;
//   - a strided A gives the gemm of the packed A (fp32 everywhere; bf16 where native);
//   - one recorded and executed matmul_bwd of the head's shape: dX and the accumulated dW equal
//     the gemms of the rounded gradients in exactly the planned workspace; with the native path
//     off (MEMFIT_CPU_NATIVE_BF16=0) bitwise the unflagged op's;
//   - the loss op that rounds its gradients as it goes (xent_fwd_bwd_round) leaves the bits of the
//     loss op followed by the rounding pass, ignored rows included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/graph.h"
#include "core/dtype.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::ThreadScope;

// n x V logit gradients (V odd, as GPT-2's 50,257), C channels.
constexpr int64_t kN = 70, kV = 517, kC = 48;

std::vector<float> widen(const std::vector<uint16_t> & h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
    return v;
}

std::vector<uint16_t> narrow(const std::vector<float> & v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = from_f32<bf16_t>(v[i]).bits;
    return h;
}

Tensor host(void * p, DType dt, std::initializer_list<int64_t> dims) {
    Tensor t(-1, dt, dims);
    t.data = p;
    return t;
}

// Same bf16 products summed in fp32 in another order: within 1e-5 of the largest (f32 C), or one
// bf16 rounding (bf16 C).
void expect_close(const std::vector<float> & got, const std::vector<float> & want, double rel) {
    ASSERT_EQ(got.size(), want.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, double(std::fabs(got[i] - want[i])));
        scale = std::max(scale, double(std::fabs(want[i])));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(worst, rel * scale);
}

TEST(LogitGradsBf16, RoundedInPlaceRowByRow) {
    ThreadScope threads(2);
    std::mt19937 rng(5);
    std::vector<float> x = test::randn(size_t(kN * kV), rng, 3.0f);
    const float inf = std::numeric_limits<float>::infinity();
    x[0] = inf, x[5] = -inf, x[size_t(kV + 7)] = std::numeric_limits<float>::quiet_NaN();
    x[size_t(2 * kV - 1)] = std::numeric_limits<float>::max();   // rounds up to inf
    x[size_t(3 * kV + 256)] = 1e-40f;                           // subnormal
    x[size_t(10 * kV + 255)] = 1.00390625f;                      // 1 + 2^-8: a tie, to even (1)
    x[size_t(10 * kV + 256)] = 1.01171875f;                      // 1 + 3 * 2^-8: a tie, to even up
    const std::vector<float> orig = x;
    CpuBackend be;
    be.round_bf16_rows(host(x.data(), DType::f32, {kN, kV}));
    const auto * h = reinterpret_cast<const uint16_t *>(x.data());
    int64_t wrong = 0;
    for (int64_t r = 0; r < kN; ++r)
        for (int64_t j = 0; j < kV; ++j) {
            const float o = orig[size_t(r * kV + j)];
            const uint16_t got = h[r * 2 * kV + j];
            wrong += std::isnan(o) ? !std::isnan(bf16_to_f32(got)) : got != from_f32<bf16_t>(o).bits;
        }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(bf16_to_f32(h[2 * kV - 1 + kV]), inf);   // row 1's last: max rounded up
    EXPECT_EQ(bf16_to_f32(h[10 * 2 * kV + 255]), 1.0f);
    EXPECT_EQ(bf16_to_f32(h[10 * 2 * kV + 256]), 1.015625f);
}

// A strided A is read as the packed one: the head's two products (dX = dY W, dW += dY^T X) with
// dY stored in rows of 2V, fp32 on every CPU and bf16 where the backend has native bf16 gemms.
TEST(LogitGradsBf16, StridedLeftOperandIsThePackedGemm) {
    std::mt19937 rng(6);
    const std::vector<float> dy = test::randn(size_t(kN * kV), rng), w = test::randn(size_t(kV * kC), rng),
                             xin = test::randn(size_t(kN * kC), rng), c0 = test::randn(size_t(kV * kC), rng);
    CpuBackend be;
    int native = 0;
    for (const DType ab : {DType::f32, DType::bf16})
        for (const bool weight_grad : {false, true})
            for (const DType cdt : {DType::f32, DType::bf16}) {
                if (ab == DType::f32 && cdt != DType::f32) continue;
                SCOPED_TRACE(testing::Message() << dtype_name(ab) << (weight_grad ? " dW" : " dX") << " C "
                                                << dtype_name(cdt));
                GemmDesc d;
                if (weight_grad) d.M = kV, d.N = kC, d.K = kN, d.trans_a = true, d.accumulate = true;
                else d.M = kN, d.N = kC, d.K = kV;
                d.a = d.b = ab, d.c = cdt;
                GemmDesc s = d;
                s.lda = 2 * kV;
                if (ab == DType::bf16 && !be.native_gemm(s)) {   // never taken: matmul_bwd checks
                    EXPECT_FALSE(be.native_gemm(d));
                    continue;
                }
                native += ab == DType::bf16;
                // Packed and strided copies of dY; B and C in the gemm's dtypes.
                const size_t e = dtype_size(ab);
                std::vector<unsigned char> packed(size_t(kN * kV) * e), strided(size_t(kN * 2 * kV) * e, 0xAB);
                const std::vector<uint16_t> dy16 = narrow(dy);
                for (int64_t r = 0; r < kN; ++r) {
                    const void * src = ab == DType::f32 ? static_cast<const void *>(&dy[size_t(r * kV)])
                                                        : static_cast<const void *>(&dy16[size_t(r * kV)]);
                    std::memcpy(&packed[size_t(r * kV) * e], src, size_t(kV) * e);
                    std::memcpy(&strided[size_t(r * 2 * kV) * e], src, size_t(kV) * e);
                }
                std::vector<float> bf = weight_grad ? xin : w;
                std::vector<uint16_t> b16 = narrow(bf);
                void * b = ab == DType::f32 ? static_cast<void *>(bf.data()) : static_cast<void *>(b16.data());
                auto run = [&](const GemmDesc & g, void * a, int64_t a_elems) {
                    std::vector<float> c32(size_t(d.M * d.N));
                    std::copy(c0.begin(), c0.begin() + std::ptrdiff_t(c32.size()), c32.begin());
                    std::vector<uint16_t> c16 = narrow(c32);
                    void * c = cdt == DType::f32 ? static_cast<void *>(c32.data()) : static_cast<void *>(c16.data());
                    std::vector<unsigned char> ws(be.gemm_workspace(g) + 1);
                    Tensor wt = ws.size() > 1 ? host(ws.data(), DType::u8, {int64_t(ws.size() - 1)}) : Tensor{};
                    be.gemm(g, host(c, cdt, {g.M, g.N}), host(a, ab, {a_elems}), host(b, ab, {g.K, g.N}), Tensor{}, wt);
                    return cdt == DType::f32 ? c32 : widen(c16);
                };
                expect_close(run(s, strided.data(), kN * 2 * kV), run(d, packed.data(), kN * kV),
                             cdt == DType::f32 ? 1e-5 : 1.0 / 128);
            }
    std::printf("strided native bf16 head gemms on this CPU: %d of 4\n", native);
}

// One matmul_bwd of the head (out_in, bf16 W, X, dX and dW; fp32 dY), recorded against `be` and
// run on it: dX and dW (accumulated onto dw0) as floats, and the planned workspace.
struct HeadGrads {
    std::vector<float> dx, dw;
    size_t workspace = 0;
};

HeadGrads head_backward(CpuBackend & be, const std::vector<float> & dy, const std::vector<float> & w,
                        const std::vector<float> & x, const std::vector<float> & dw0, bool round) {
    Program p;
    auto declare = [&](const char * name, int64_t elems, DType dt) {
        return p.declare(name, Category::activations, size_t(elems) * dtype_size(dt), true);
    };
    const BufferId b_dy = declare("dy", kN * kV, DType::f32), b_w = declare("w", kV * kC, DType::bf16),
                   b_x = declare("x", kN * kC, DType::bf16), b_dx = declare("dx", kN * kC, DType::bf16),
                   b_dw = declare("dw", kV * kC, DType::bf16);
    const BufferId b_ws = p.declare("workspace", Category::workspace, 0);
    const Tensor dyt(b_dy, DType::f32, {kN, kV}), wt(b_w, DType::bf16, {kV, kC}), xt(b_x, DType::bf16, {kN, kC}),
        dxt(b_dx, DType::bf16, {kN, kC}), dwt(b_dw, DType::bf16, {kV, kC});
    auto step = [&](Graph & g) {
        g.set_workspace(b_ws);
        g.matmul_bwd(dxt, dwt, Tensor{}, dyt, xt, wt, WeightLayout::out_in, false,
                     round ? Graph::DoutBf16::round : Graph::DoutBf16::keep);
    };
    {
        Graph rec(p, &be);
        step(rec);
    }
    p.finalize();
    const MemoryPlan plan = plan_memory(p);
    Ledger ledger;
    StepMemory mem(p, plan, ledger, host_allocator());
    auto fill = [&](BufferId id, const auto & v) { std::memcpy(mem.base(id), v.data(), v.size() * sizeof(v[0])); };
    fill(b_dy, dy), fill(b_w, narrow(w)), fill(b_x, narrow(x)), fill(b_dw, narrow(dw0));
    {
        Graph g(p, mem, be);
        step(g);
    }
    auto read = [&](BufferId id, size_t n) {
        std::vector<uint16_t> h(n);
        std::memcpy(h.data(), mem.base(id), n * 2);
        return widen(h);
    };
    return {read(b_dx, size_t(kN * kC)), read(b_dw, size_t(kV * kC)), p.buffer(b_ws).bytes};
}

TEST(LogitGradsBf16, HeadBackwardMultipliesTheRoundedGradients) {
    std::mt19937 rng(7);
    const std::vector<float> dy = test::randn(size_t(kN * kV), rng), w = test::randn(size_t(kV * kC), rng),
                             x = test::randn(size_t(kN * kC), rng), dw0 = test::randn(size_t(kV * kC), rng);
    // The reference: the unflagged op on dY's bf16 rounding (its fp32 copy holds bf16 values).
    std::vector<float> dy_rounded = widen(narrow(dy));
    CpuBackend be;
    const HeadGrads want = head_backward(be, dy_rounded, w, x, dw0, false);
    const HeadGrads plain = head_backward(be, dy, w, x, dw0, false);
    const HeadGrads got = head_backward(be, dy, w, x, dw0, true);
    GemmDesc probe;
    probe.M = kN, probe.N = kC, probe.K = kV, probe.a = probe.b = DType::bf16, probe.lda = 2 * kV;
    if (be.native_gemm(probe)) {
        expect_close(got.dx, want.dx, 1.0 / 128);
        expect_close(got.dw, want.dw, 1.0 / 128);
        EXPECT_NE(got.dx, plain.dx);   // the rounding shows
    } else {
        EXPECT_EQ(got.dx, plain.dx);
        EXPECT_EQ(got.dw, plain.dw);
    }
    std::printf("head backward on rounded logit gradients: %s; workspace %zu bytes (fp32 dY: %zu)\n",
                be.native_gemm(probe) ? "native bf16" : "not here (unchanged)", got.workspace, plain.workspace);

    // Without native bf16 gemms the flag changes nothing, bitwise.
    setenv("MEMFIT_CPU_NATIVE_BF16", "0", 1);
    CpuBackend off;
    unsetenv("MEMFIT_CPU_NATIVE_BF16");
    EXPECT_FALSE(off.native_gemm(probe));
    const HeadGrads off_got = head_backward(off, dy, w, x, dw0, true), off_plain = head_backward(off, dy, w, x, dw0, false);
    EXPECT_EQ(off_got.dx, off_plain.dx);
    EXPECT_EQ(off_got.dw, off_plain.dw);
    EXPECT_EQ(off_got.workspace, off_plain.workspace);
    expect_close(off_plain.dx, plain.dx, 1.0 / 128);
}

TEST(LogitGradsBf16, TheLossOpRoundsAsThePassAfterIt) {
    std::mt19937 rng(11);
    std::vector<float> logits = test::randn(size_t(kN * kV), rng);
    for (float & v : logits) v *= 4.0f;
    std::vector<int32_t> targets(static_cast<size_t>(kN));
    for (int64_t r = 0; r < kN; ++r) targets[size_t(r)] = r % 9 == 4 ? -100 : int32_t((r * 131) % kV);
    std::vector<float> want = logits, got = logits, want_loss(static_cast<size_t>(kN)), got_loss(want_loss);
    cpu::crossentropy_forward_backward(want_loss.data(), want.data(), targets.data(), 0.25f, int(kN), int(kV));
    cpu::round_bf16_rows_in_place(want.data(), kN, kV);
    cpu::crossentropy_forward_backward(got_loss.data(), got.data(), targets.data(), 0.25f, int(kN), int(kV), true);
    EXPECT_EQ(got_loss, want_loss);
    for (int64_t r = 0; r < kN; ++r)   // each row's first 2V bytes: its bf16 gradients
        ASSERT_EQ(std::memcmp(got.data() + r * kV, want.data() + r * kV, size_t(kV) * 2), 0) << "row " << r;
    std::vector<uint16_t> first(static_cast<size_t>(kV));
    std::memcpy(first.data(), got.data(), size_t(kV) * 2);
    EXPECT_NE(bf16_to_f32(first[size_t(targets[0])]), 0.0f);   // the target's entry, p - 1, is there
}

}  // namespace
}  // namespace memfit
