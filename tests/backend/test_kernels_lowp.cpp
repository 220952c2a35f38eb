// Mixed-precision storage in the CPU backend (bf16 and f16 tensors, fp32 compute):
//   - the branch-free conversions of core/dtype.h and the bulk ones of backend/cpu/convert.h
//     against the reference scalar conversions; copy() between dtypes;
//   - every kernel, for bf16 and f16: random fp32 inputs are rounded to the low dtype, the op
//     runs on the low-precision tensors, and its outputs are compared with the fp32 op run on
//     the same rounded inputs (converted back to f32). Tolerance, per element:
//         |got - want| <= u |want| + floor,   u = 2^-8 (bf16) or 2^-11 (f16)
//     u |want| is one rounding of the fp32 result to the output dtype (u = 0 for f32 outputs);
//     floor = 1e-5 * max|want| + 2^-24 covers fp32 rounding differences (another summation
//     order, e.g. the gemm's tiles) and f16 subnormal spacing;
//   - gemm with the dtype mixes training uses, transposes, accumulate and bias, tiled into
//     several tiles with partial last tiles, run in exactly gemm_workspace() bytes (followed by
//     guard bytes that must stay untouched);
//   - sum_squares overflow detection, AdamW with skip_nonfinite, its param_copy and its
//     unchanged fp32 path; determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dnnl_gemm.h"
#include "backend/cpu/gemm_mixed.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_flash.h"
#include "backend/moments8.h"
#include "core/dtype.h"
#include "optim_ops.h"
#include "test_util.h"

namespace memfit {
using memfit::test::ThreadScope;
using memfit::test::adamw_op;
using memfit::test::adamw_8bit_op;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float round_to(float x, DType dt) {
    switch (dt) {
        case DType::bf16: return bf16_to_f32(f32_to_bf16(x));
        case DType::f16: return f16_to_f32(f32_to_f16(x));
        default: return x;
    }
}

// The unit roundoff of a storage dtype (0 for f32: nothing is rounded).
double unit_roundoff(DType dt) {
    return dt == DType::bf16 ? std::ldexp(1.0, -8) : dt == DType::f16 ? std::ldexp(1.0, -11) : 0.0;
}

// A tensor with its own storage in any dtype; set() rounds fp32 values into it, get() reads back.
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
            if (dt == DType::f32) std::memcpy(bytes.data() + 4 * i, &v[i], 4);
            if (dt == DType::bf16 || dt == DType::f16) {
                const uint16_t h = dt == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
                std::memcpy(bytes.data() + 2 * i, &h, 2);
            }
        }
    }
    std::vector<float> get() const {
        std::vector<float> v(n());
        for (size_t i = 0; i < v.size(); ++i) {
            uint16_t h = 0;
            if (dt == DType::f32) std::memcpy(&v[i], bytes.data() + 4 * i, 4);
            else std::memcpy(&h, bytes.data() + 2 * i, 2);
            if (dt == DType::bf16) v[i] = bf16_to_f32(h);
            if (dt == DType::f16) v[i] = f16_to_f32(h);
        }
        return v;
    }
};

std::vector<float> randn(size_t n, std::mt19937 & rng, float scale = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, scale);
    std::vector<float> v(n);
    for (float & x : v) x = dist(rng);
    return v;
}

// Random values already representable in dt (so both runs see the same inputs).
std::vector<float> rand_in(size_t n, DType dt, std::mt19937 & rng, float scale = 1.0f, float mean = 0.0f) {
    std::vector<float> v = randn(n, rng, scale, mean);
    for (float & x : v) x = round_to(x, dt);
    return v;
}

// A pair of tensors holding the same (representable) values: one in dt, one in f32.
struct Pair {
    Arr lo, hi;
    Pair(DType dt, std::initializer_list<int64_t> dims) : lo(dt, dims), hi(DType::f32, dims) {}
    void set(const std::vector<float> & v) { lo.set(v); hi.set(v); }
};

// See the file comment for the tolerance.
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

class LowpKernels : public ::testing::TestWithParam<DType> {
protected:
    CpuBackend be;
    DType dt = GetParam();
};

std::string param_name(const ::testing::TestParamInfo<DType> & info) { return std::string(dtype_name(info.param)); }

// ---------------------------------------------------------------------------------------------
// Conversions

TEST(LowpConvert, BranchFreeConversionsMatchTheScalarOnes) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float a = f16_to_f32(uint16_t(h)), b = to_f32(f16_t{uint16_t(h)});
        if (std::isnan(a)) EXPECT_TRUE(std::isnan(b)) << h;
        else EXPECT_EQ(f32_bits(a), f32_bits(b)) << h;
        EXPECT_EQ(f32_bits(bf16_to_f32(uint16_t(h))), f32_bits(to_f32(bf16_t{uint16_t(h)}))) << h;
    }
    // f32 -> f16/bf16 over a sweep of all bit patterns (every sign, exponent, and mantissa tail),
    // which covers subnormal results, ties and overflow to inf.
    int bad = 0;
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
        const float f = bits_f32(uint32_t(u));
        const uint16_t h = from_f32<f16_t>(f).bits;
        if (std::isnan(f) ? (h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0 : h != f32_to_f16(f)) ++bad;
        if (from_f32<bf16_t>(f).bits != f32_to_bf16(f)) ++bad;
    }
    EXPECT_EQ(bad, 0);
    for (const float f :
         {65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f, 0.0f, -0.0f}) {
        EXPECT_EQ(from_f32<f16_t>(f).bits, f32_to_f16(f)) << f;
        EXPECT_EQ(from_f32<bf16_t>(f).bits, f32_to_bf16(f)) << f;
    }
}

TEST(LowpConvert, BulkConversionsMatchElementwise) {
    std::mt19937 rng(3);
    // Odd length (vector loop plus tail), values across the f16 range and beyond, specials.
    std::vector<float> x = randn(100003, rng, 3e4f);
    x[0] = kInf, x[1] = -kInf, x[2] = kNaN, x[3] = 70000.0f, x[4] = 1e-7f, x[5] = -3e-6f, x[6] = 0.0f;
    for (const DType dt : {DType::bf16, DType::f16}) {
        std::vector<uint16_t> h(x.size());
        cpu::convert(h.data(), dt, x.data(), DType::f32, x.size());
        std::vector<float> back(x.size());
        cpu::convert(back.data(), DType::f32, h.data(), dt, x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            const float want = round_to(x[i], dt);
            if (std::isnan(want)) {
                EXPECT_TRUE(std::isnan(back[i])) << i;
            } else {
                ASSERT_EQ(f32_bits(back[i]), f32_bits(want)) << dtype_name(dt) << " element " << i << " = " << x[i];
            }
        }
        EXPECT_EQ(back[3], dt == DType::f16 ? kInf : round_to(70000.0f, DType::bf16));
    }
}

TEST(LowpConvert, CopyConvertsAndRoundTrips) {
    CpuBackend be;
    std::mt19937 rng(4);
    const std::vector<float> x = randn(5000, rng, 10.0f);
    for (const DType a : {DType::f32, DType::bf16, DType::f16}) {
        for (const DType b : {DType::f32, DType::bf16, DType::f16}) {
            Arr src(a, {50, 100}), dst(b, {50, 100});
            src.set(x);
            be.copy(dst.t, src.t);
            const std::vector<float> s = src.get(), d = dst.get();
            for (size_t i = 0; i < x.size(); ++i)
                ASSERT_EQ(f32_bits(d[i]), f32_bits(round_to(s[i], b)))
                    << dtype_name(a) << "->" << dtype_name(b) << " " << i;
            // Back to the source dtype: exact when the destination holds every source value.
            if (b == DType::f32 || a == b) {
                Arr again(a, {50, 100});
                be.copy(again.t, dst.t);
                EXPECT_EQ(again.bytes, src.bytes) << dtype_name(a) << "->" << dtype_name(b) << "->" << dtype_name(a);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Elementwise and row kernels

TEST_P(LowpKernels, EncoderForward) {
    const int B = 2, T = 7, C = 40, V = 13;
    std::mt19937 rng(10);
    std::vector<int32_t> tok(B * T);
    for (auto & t : tok) t = int32_t(rng() % V);
    Tensor tt(-1, DType::i32, {B, T});
    tt.data = tok.data();
    Pair wte(dt, {V, C}), wpe(dt, {T, C}), out(dt, {B, T, C});
    wte.set(rand_in(wte.lo.n(), dt, rng));
    wpe.set(rand_in(wpe.lo.n(), dt, rng));
    be.encoder_fwd(out.lo.t, tt, wte.lo.t, wpe.lo.t);
    be.encoder_fwd(out.hi.t, tt, wte.hi.t, wpe.hi.t);
    expect_rounded(out.lo.get(), out.hi.get(), dt, "encoder_fwd", 0.0);
}

TEST_P(LowpKernels, EncoderBackwardAnyGradDtypes) {
    const int B = 3, T = 9, C = 72, V = 11;  // C: two column blocks and a remainder
    std::mt19937 rng(11);
    std::vector<int32_t> tok(B * T);
    for (auto & t : tok) t = int32_t(rng() % 5);  // many repeats
    tok[4] = V - 1;
    Tensor tt(-1, DType::i32, {B, T});
    tt.data = tok.data();
    Pair dout(dt, {B, T, C});
    dout.set(rand_in(dout.lo.n(), dt, rng));
    for (const DType ge : {DType::f32, dt})
        for (const DType gp : {DType::f32, dt}) {
            Arr dwte(ge, {V, C}), dwpe(gp, {T, C}), rwte(DType::f32, {V, C}), rwpe(DType::f32, {T, C});
            const std::vector<float> w0 = rand_in(dwte.n(), dt, rng), p0 = rand_in(dwpe.n(), dt, rng);
            dwte.set(w0), rwte.set(w0), dwpe.set(p0), rwpe.set(p0);
            be.encoder_bwd(dwte.t, dwpe.t, dout.lo.t, tt);
            be.encoder_bwd(rwte.t, rwpe.t, dout.hi.t, tt);
            const std::string tag = std::string("encoder_bwd dwte ") + std::string(dtype_name(ge)) + " dwpe " +
                                    std::string(dtype_name(gp));
            expect_rounded(dwte.get(), rwte.get(), ge, tag + ": dwte");
            expect_rounded(dwpe.get(), rwpe.get(), gp, tag + ": dwpe");
        }
}

TEST_P(LowpKernels, LayerNormForwardAndBackward) {
    const int N = 37, C = 72;
    std::mt19937 rng(12);
    Pair inp(dt, {N, C}), w(dt, {C}), b(dt, {C}), out(dt, {N, C}), dout(dt, {N, C});
    inp.set(rand_in(inp.lo.n(), dt, rng, 2.0f, 0.5f));
    w.set(rand_in(C, dt, rng, 1.0f, 1.0f));
    b.set(rand_in(C, dt, rng));
    dout.set(rand_in(dout.lo.n(), dt, rng));
    Arr mean(DType::f32, {N}), rstd(DType::f32, {N}), rmean(DType::f32, {N}), rrstd(DType::f32, {N});
    be.layernorm_fwd(out.lo.t, mean.t, rstd.t, inp.lo.t, w.lo.t, b.lo.t, 1e-5f);
    be.layernorm_fwd(out.hi.t, rmean.t, rrstd.t, inp.hi.t, w.hi.t, b.hi.t, 1e-5f);
    expect_rounded(out.lo.get(), out.hi.get(), dt, "layernorm_fwd out");
    expect_rounded(mean.get(), rmean.get(), DType::f32, "layernorm_fwd mean");
    expect_rounded(rstd.get(), rrstd.get(), DType::f32, "layernorm_fwd rstd");

    for (const DType g : {DType::f32, dt}) {
        // dinp accumulates (the residual stream's gradient), in dout's dtype.
        Pair dinp(dt, {N, C});
        dinp.set(rand_in(dinp.lo.n(), dt, rng));
        Arr dw(g, {C}), db(g, {C}), rdw(DType::f32, {C}), rdb(DType::f32, {C});
        const std::vector<float> dw0 = rand_in(C, dt, rng), db0 = rand_in(C, dt, rng);
        dw.set(dw0), rdw.set(dw0), db.set(db0), rdb.set(db0);
        be.layernorm_bwd(dinp.lo.t, dw.t, db.t, dout.lo.t, inp.lo.t, w.lo.t, rmean.t, rrstd.t);
        be.layernorm_bwd(dinp.hi.t, rdw.t, rdb.t, dout.hi.t, inp.hi.t, w.hi.t, rmean.t, rrstd.t);
        const std::string tag = std::string("layernorm_bwd (grads ") + std::string(dtype_name(g)) + ") ";
        expect_rounded(dinp.lo.get(), dinp.hi.get(), dt, tag + "dinp");
        expect_rounded(dw.get(), rdw.get(), g, tag + "dw");
        expect_rounded(db.get(), rdb.get(), g, tag + "db");
    }
}

TEST_P(LowpKernels, GeluResidualBiasGradSumSquares) {
    std::mt19937 rng(13);
    const int N = 33, C = 70;
    Pair x(dt, {N, C}), y(dt, {N, C}), g(dt, {N, C}), out(dt, {N, C}), dx(dt, {N, C}), sum(dt, {N, C});
    x.set(rand_in(x.lo.n(), dt, rng, 2.0f));
    y.set(rand_in(y.lo.n(), dt, rng));
    g.set(rand_in(g.lo.n(), dt, rng));
    for (Gelu kind : {Gelu::tanh, Gelu::erf}) {
        be.gelu_fwd(out.lo.t, x.lo.t, kind);
        be.gelu_fwd(out.hi.t, x.hi.t, kind);
        expect_rounded(out.lo.get(), out.hi.get(), dt, "gelu_fwd", 0.0);
        be.gelu_bwd(dx.lo.t, g.lo.t, x.lo.t, kind);
        be.gelu_bwd(dx.hi.t, g.hi.t, x.hi.t, kind);
        expect_rounded(dx.lo.get(), dx.hi.get(), dt, "gelu_bwd", 0.0);
    }
    be.residual_fwd(sum.lo.t, x.lo.t, y.lo.t);
    be.residual_fwd(sum.hi.t, x.hi.t, y.hi.t);
    expect_rounded(sum.lo.get(), sum.hi.get(), dt, "residual_fwd", 0.0);

    for (const DType gd : {DType::f32, dt}) {
        Arr db(gd, {C}), rdb(DType::f32, {C});
        const std::vector<float> db0 = rand_in(C, dt, rng);
        db.set(db0), rdb.set(db0);
        be.bias_grad(db.t, g.lo.t);
        be.bias_grad(rdb.t, g.hi.t);
        expect_rounded(db.get(), rdb.get(), gd, std::string("bias_grad into ") + std::string(dtype_name(gd)));
    }

    Arr ss(DType::f32, {1}), rss(DType::f32, {1});
    be.sum_squares(ss.t, x.lo.t);
    be.sum_squares(rss.t, x.hi.t);
    EXPECT_EQ(ss.get()[0], rss.get()[0]);  // same values, both accumulated in double
}

TEST_P(LowpKernels, SumSquaresIsInfOrNaNWithAnInfOrNaNElement) {
    CpuBackend & b = be;
    std::mt19937 rng(14);
    std::vector<float> v = randn(70000, rng);
    v[12345] = 70000.0f;  // overflows f16 to inf; finite in bf16
    Arr x(dt, {70000}), out(DType::f32, {1});
    x.set(v);
    b.sum_squares(out.t, x.t);
    if (dt == DType::f16) EXPECT_EQ(out.get()[0], kInf);
    else EXPECT_TRUE(std::isfinite(out.get()[0]) && out.get()[0] > 4.8e9f);
    v[12345] = -kInf;
    x.set(v);
    b.sum_squares(out.t, x.t);
    EXPECT_EQ(out.get()[0], kInf);
    v[12345] = 1.0f;
    v[69999] = kNaN;
    x.set(v);
    b.sum_squares(out.t, x.t);
    EXPECT_TRUE(std::isnan(out.get()[0]));
}

// ---------------------------------------------------------------------------------------------
// Attention

TEST_P(LowpKernels, AttentionForwardAndBackward) {
    const int B = 2, T = 37, C = 48, NH = 4;
    std::mt19937 rng(15);
    Pair qkv(dt, {B, T, 3 * C}), out(dt, {B, T, C}), att(dt, {B, NH, T, T}), dout(dt, {B, T, C}),
        dqkv(dt, {B, T, 3 * C});
    qkv.set(rand_in(qkv.lo.n(), dt, rng));
    dout.set(rand_in(dout.lo.n(), dt, rng));
    be.attention_fwd(out.lo.t, att.lo.t, qkv.lo.t, NH);
    be.attention_fwd(out.hi.t, att.hi.t, qkv.hi.t, NH);
    expect_rounded(out.lo.get(), out.hi.get(), dt, "attention_fwd out");
    expect_rounded(att.lo.get(), att.hi.get(), dt, "attention_fwd att");

    // Backward from the same (rounded) saved probabilities.
    att.hi.set(att.lo.get());
    Arr scratch(DType::f32, {B * NH * T});
    be.attention_bwd(dqkv.lo.t, scratch.t, dout.lo.t, qkv.lo.t, att.lo.t, NH);
    be.attention_bwd(dqkv.hi.t, scratch.t, dout.hi.t, qkv.hi.t, att.hi.t, NH);
    expect_rounded(dqkv.lo.get(), dqkv.hi.get(), dt, "attention_bwd dqkv");
}

TEST_P(LowpKernels, FlashAttentionForwardAndBackward) {
    // T: partial tiles (150 = 2 x 64 + 22), exactly one, one and a bit, and past the one-pass
    // backward's 1024 positions (two passes); hs = 20 (8x8 blocks plus tails), 32, 80 (above the
    // forward's 64-column chunks) and 16.
    struct Shape { int B, T, C, NH; };
    for (const Shape s : {Shape{2, 150, 80, 4}, Shape{1, 64, 64, 2}, Shape{1, 70, 160, 2}, Shape{1, 1090, 32, 2}}) {
        std::mt19937 rng(16);
        Pair qkv(dt, {s.B, s.T, 3 * s.C}), out(dt, {s.B, s.T, s.C}), dout(dt, {s.B, s.T, s.C}),
            dqkv(dt, {s.B, s.T, 3 * s.C});
        qkv.set(rand_in(qkv.lo.n(), dt, rng, 1.5f));
        dout.set(rand_in(dout.lo.n(), dt, rng));
        Arr lse(DType::f32, {s.B, s.NH, s.T}), rlse(DType::f32, {s.B, s.NH, s.T});
        be.flash_attention_fwd(out.lo.t, lse.t, qkv.lo.t, s.NH);
        be.flash_attention_fwd(out.hi.t, rlse.t, qkv.hi.t, s.NH);
        const std::string tag = "flash T=" + std::to_string(s.T) + " ";
        expect_rounded(out.lo.get(), out.hi.get(), dt, tag + "fwd out");
        expect_rounded(lse.get(), rlse.get(), DType::f32, tag + "fwd lse");

        out.hi.set(out.lo.get());  // backward from the same (rounded) forward output
        const size_t ws = be.flash_attention_workspace(s.B, s.T, s.C, s.NH, dt) / sizeof(float);   // >= fp32's
        Arr scratch(DType::f32, {int64_t(ws)});
        be.flash_attention_bwd(dqkv.lo.t, scratch.t, dout.lo.t, out.lo.t, qkv.lo.t, lse.t, s.NH);
        be.flash_attention_bwd(dqkv.hi.t, scratch.t, dout.hi.t, out.hi.t, qkv.hi.t, lse.t, s.NH);
        expect_rounded(dqkv.lo.get(), dqkv.hi.get(), dt, tag + "bwd dqkv");

        // The same bits with one and two threads.
        Arr again(dt, {s.B, s.T, 3 * s.C});
        {
            const ThreadScope one(1);
            be.flash_attention_bwd(again.t, scratch.t, dout.lo.t, out.lo.t, qkv.lo.t, lse.t, s.NH);
        }
        EXPECT_EQ(again.bytes, dqkv.lo.bytes) << tag;
    }
}

// The bf16 flash backward holds each head's dQ in fp32 and makes one pass up to 1024 positions,
// two (dQ with query tiles outermost, recomputing the scores) beyond: the same bits either way,
// with packed documents (whole key tiles skipped, keys masked) or without.
TEST(LowpFlash, OnePassAndTwoPassBackwardsAgreeBitForBit) {
    const int B = 2, T = 150, C = 80, NH = 4;   // partial tiles, hs = 20
    std::mt19937 rng(23);
    auto bf = [&](size_t n, float scale) {
        std::vector<bf16_t> v(n);
        const std::vector<float> f = randn(n, rng, scale);
        cpu::from_f32_row(v.data(), f.data(), n);
        return v;
    };
    const std::vector<bf16_t> qkv = bf(size_t(B) * T * 3 * C, 1.5f), dout = bf(size_t(B) * T * C, 1.0f);
    std::vector<int32_t> docs(size_t(B) * T);
    for (int t = 0; t < T; ++t) {
        docs[t] = t < 40 ? 0 : t < 130 ? 40 : 130;   // the second sequence one document
        docs[T + t] = 0;
    }
    for (const int32_t * doc_start : {static_cast<const int32_t *>(nullptr), static_cast<const int32_t *>(docs.data())}) {
        std::vector<bf16_t> out(size_t(B) * T * C);
        std::vector<float> lse(size_t(B) * NH * T), scratch(cpu::flash_attention_scratch_floats(B, T, C, NH, DType::bf16));
        cpu::flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, doc_start);
        std::vector<bf16_t> one(qkv.size()), two(qkv.size()), plain(qkv.size());
        cpu::flash_attention_backward_passes(one.data(), scratch.data(), dout.data(), out.data(), qkv.data(),
                                             lse.data(), B, T, C, NH, doc_start, 1);
        cpu::flash_attention_backward_passes(two.data(), scratch.data(), dout.data(), out.data(), qkv.data(),
                                             lse.data(), B, T, C, NH, doc_start, 2);
        cpu::flash_attention_backward(plain.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(),
                                      B, T, C, NH, doc_start);
        const std::string tag = doc_start ? "documents" : "causal";
        EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(bf16_t))) << tag;
        EXPECT_EQ(0, std::memcmp(one.data(), plain.data(), one.size() * sizeof(bf16_t))) << tag;
        size_t nonzero = 0;
        for (const bf16_t g : one) nonzero += to_f32(g) != 0.0f;
        EXPECT_GT(nonzero, one.size() * 9 / 10) << tag;   // the gradients were computed
    }
}

// ---------------------------------------------------------------------------------------------
// AdamW

TEST_P(LowpKernels, AdamWLowPrecisionGradsAndParamCopy) {
    const int n = 1000;
    std::mt19937 rng(17);
    const std::vector<float> p0 = randn(n, rng), m0 = randn(n, rng, 0.1f), g = rand_in(n, dt, rng, 0.5f);
    std::vector<float> v0 = randn(n, rng, 0.1f);
    for (float & x : v0) x *= x;
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f, h.t = 3, h.clip = 1.0f;
    Arr nsq(DType::f32, {1});
    nsq.set({4.0f});  // clipped: the multiplier is 0.5

    // Reference: f32 grads (the same values).
    Arr rp(DType::f32, {n}), rm(DType::f32, {n}), rv(DType::f32, {n}), rg(DType::f32, {n});
    rp.set(p0), rm.set(m0), rv.set(v0), rg.set(g);
    adamw_op(be, rp.t, rg.t, rm.t, rv.t, nsq.t, Tensor{}, h);

    for (const DType gd : {DType::f32, dt}) {
        Arr p(DType::f32, {n}), m(DType::f32, {n}), v(DType::f32, {n}), gr(gd, {n}), copy(dt, {n});
        p.set(p0), m.set(m0), v.set(v0), gr.set(g);
        adamw_op(be, p.t, gr.t, m.t, v.t, nsq.t, copy.t, h);
        // The grads are the same numbers, so the update is the same, bitwise.
        EXPECT_EQ(p.bytes, rp.bytes) << dtype_name(gd);
        EXPECT_EQ(m.bytes, rm.bytes) << dtype_name(gd);
        EXPECT_EQ(v.bytes, rv.bytes) << dtype_name(gd);
        const std::vector<float> pv = p.get(), cv = copy.get();
        for (int i = 0; i < n; ++i) ASSERT_EQ(f32_bits(cv[size_t(i)]), f32_bits(round_to(pv[size_t(i)], dt))) << i;
    }
}

TEST_P(LowpKernels, AdamWSkipsNonFiniteSteps) {
    const int n = 300;
    std::mt19937 rng(18);
    Arr p(DType::f32, {n}), m(DType::f32, {n}), v(DType::f32, {n}), g(dt, {n}), copy(dt, {n}), nsq(DType::f32, {1});
    p.set(randn(n, rng)), m.set(randn(n, rng)), v.set(std::vector<float>(size_t(n), 0.25f)), g.set(randn(n, rng));
    copy.set(randn(n, rng));
    OptimHyper h;
    h.skip_nonfinite = true;
    h.grad_scale = 1.0f / 1024;
    for (const float bad : {kNaN, kInf}) {
        const auto p0 = p.bytes, m0 = m.bytes, v0 = v.bytes, c0 = copy.bytes;
        nsq.set({bad});
        adamw_op(be, p.t, g.t, m.t, v.t, nsq.t, copy.t, h);
        EXPECT_EQ(p.bytes, p0);
        EXPECT_EQ(m.bytes, m0);
        EXPECT_EQ(v.bytes, v0);
        EXPECT_EQ(copy.bytes, c0);
    }
    nsq.set({1.0f});  // finite: the step happens
    const auto p0 = p.bytes;
    adamw_op(be, p.t, g.t, m.t, v.t, nsq.t, copy.t, h);
    EXPECT_NE(p.bytes, p0);
}

// --optimizer adamw-bf16: the moments stored in bf16. Over three steps against a float64
// reference that rounds its moments to bf16 after each step as the kernel does: the weights
// within float rounding, each stored moment the reference's rounded to nearest (within one bf16
// ulp: the kernel forms the moment in f32, the reference in double, and a tie may round apart).
TEST(LowpAdamW, Bf16MomentsMatchDoubleReference) {
    CpuBackend be;
    const int n = 2053;
    std::mt19937 rng(23);
    std::vector<float> p0 = randn(n, rng);
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f;
    Arr p(DType::f32, {n}), m(DType::bf16, {n}), v(DType::bf16, {n}), g(DType::f32, {n});
    p.set(p0), m.set(std::vector<float>(size_t(n), 0.0f)), v.set(std::vector<float>(size_t(n), 0.0f));
    std::vector<double> rp(p0.begin(), p0.end()), rm(size_t(n), 0.0), rv(size_t(n), 0.0);
    for (int t = 1; t <= 3; ++t) {
        const std::vector<float> gv = randn(n, rng, 0.5f);
        g.set(gv);
        h.t = t;
        adamw_op(be, p.t, g.t, m.t, v.t, Tensor{}, Tensor{}, h);
        const double bc1 = 1 - std::pow(double(h.beta1), t), bc2 = 1 - std::pow(double(h.beta2), t);
        const std::vector<float> pm = p.get(), mm = m.get(), vm = v.get();
        for (size_t i = 0; i < size_t(n); ++i) {
            const double gi = gv[i];
            const double mi = h.beta1 * rm[i] + (1 - double(h.beta1)) * gi;
            const double vi = h.beta2 * rv[i] + (1 - double(h.beta2)) * gi * gi;
            rp[i] = rp[i] * (1 - double(h.lr) * h.weight_decay) - h.lr * (mi / bc1) / (std::sqrt(vi / bc2) + h.eps);
            ASSERT_LE(std::fabs(double(mm[i]) - mi), std::ldexp(std::fabs(mi), -8) + 1e-30) << "m, step " << t << " " << i;
            ASSERT_LE(std::fabs(double(vm[i]) - vi), std::ldexp(std::fabs(vi), -8) + 1e-30) << "v, step " << t << " " << i;
            ASSERT_NEAR(pm[i], rp[i], 1e-5 * (1 + std::fabs(rp[i]))) << "p, step " << t << " " << i;
            rm[i] = mm[i], rv[i] = vm[i];   // the next step starts from the stored (rounded) moments
        }
    }
}

// --optimizer adamw-8bit (backend/moments8.h). The codes: decoding then encoding gives the same
// codes back (so the host's f32 view of the moments round-trips, and a checkpoint resumes bit for
// bit); every code decodes within half a level of what it encodes; a nonzero v never becomes 0.
TEST(Moments8, CodesRoundTripAndStayNearTheirValues) {
    for (int c = -127; c <= 127; ++c) {
        const uint8_t code = uint8_t(int8_t(c));
        EXPECT_EQ(encode_m8(decode_m8(code, 0.37f), 0.37f), code) << c;
    }
    for (int c = 0; c <= 255; ++c) EXPECT_EQ(encode_v8(decode_v8(uint8_t(c), 2.5e-3f), 2.5e-3f), uint8_t(c)) << c;
    EXPECT_EQ(decode_m8(encode_m8(-0.37f, 0.37f), 0.37f), -0.37f);   // the block's largest: exact
    EXPECT_EQ(decode_v8(encode_v8(2.5e-3f, 2.5e-3f), 2.5e-3f), 2.5e-3f);
    EXPECT_EQ(encode_v8(1e-30f, 1.0f), 1) << "a nonzero second moment stays nonzero";
    EXPECT_EQ(encode_m8(0.0f, 0.0f), 0);
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int i = 0; i < 10000; ++i) {
        const float x = u(rng), y = std::fabs(x);
        // In the maps' own coordinates (sqrt for m, fourth root for v) the error is half a level.
        EXPECT_LE(std::fabs(std::sqrt(std::fabs(decode_m8(encode_m8(x, 1.0f), 1.0f))) - std::sqrt(y)), 0.5f / 127 + 1e-6f);
        EXPECT_LE(std::fabs(std::sqrt(std::sqrt(decode_v8(encode_v8(y, 1.0f), 1.0f))) - std::sqrt(std::sqrt(y))),
                  0.5f / 255 + 1e-6f);
    }
}

// The 8-bit update against float64: three steps on blocks of every length (a partial last one),
// the reference decoding the kernel's stored codes before each step (so both start from the same
// moments), the weights within float rounding of the reference's update from the unrounded new
// moments, and each stored code within one level of the reference's new moment.
TEST(LowpAdamW, EightBitMomentsMatchDoubleReference) {
    CpuBackend be;
    const int n = 2 * int(kMoments8Block) + 77;
    const int64_t nb = int64_t(moments8_blocks(size_t(n)));
    std::mt19937 rng(31);
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f;
    Arr p(DType::f32, {n}), g(DType::f32, {n}), m(DType::u8, {n}), v(DType::u8, {n}), ms(DType::f32, {nb}),
        vs(DType::f32, {nb});
    p.set(randn(size_t(n), rng));
    std::fill(m.bytes.begin(), m.bytes.end(), std::byte{0});
    std::fill(v.bytes.begin(), v.bytes.end(), std::byte{0});
    ms.set(std::vector<float>(size_t(nb), 0.0f)), vs.set(std::vector<float>(size_t(nb), 0.0f));
    for (int t = 1; t <= 3; ++t) {
        const std::vector<float> gv = randn(size_t(n), rng, 0.5f), p0 = p.get(), ms0 = ms.get(), vs0 = vs.get();
        std::vector<double> m0(static_cast<size_t>(n)), v0(static_cast<size_t>(n));
        for (size_t i = 0; i < size_t(n); ++i) {
            m0[i] = decode_m8(uint8_t(m.bytes[i]), ms0[i / kMoments8Block]);
            v0[i] = decode_v8(uint8_t(v.bytes[i]), vs0[i / kMoments8Block]);
        }
        g.set(gv);
        h.t = t;
        adamw_8bit_op(be, p.t, g.t, m.t, v.t, ms.t, vs.t, Tensor{}, Tensor{}, h);
        const double bc1 = 1 - std::pow(double(h.beta1), t), bc2 = 1 - std::pow(double(h.beta2), t);
        const std::vector<float> pv = p.get(), ms1 = ms.get(), vs1 = vs.get();
        for (size_t i = 0; i < size_t(n); ++i) {
            const double mi = h.beta1 * m0[i] + (1 - double(h.beta1)) * gv[i];
            const double vi = h.beta2 * v0[i] + (1 - double(h.beta2)) * double(gv[i]) * gv[i];
            const double rp = p0[i] * (1 - double(h.lr) * h.weight_decay) - h.lr * (mi / bc1) / (std::sqrt(vi / bc2) + h.eps);
            ASSERT_NEAR(pv[i], rp, 1e-5 * (1 + std::fabs(rp))) << "p, step " << t << " " << i;
            const size_t b = i / kMoments8Block;
            const double qm = 127 * std::sqrt(std::fabs(mi) / ms1[b]), qv = 255 * std::sqrt(std::sqrt(vi / vs1[b]));
            ASSERT_LE(std::fabs(std::abs(int(int8_t(m.bytes[i]))) - qm), 1.0) << "m, step " << t << " " << i;
            ASSERT_LE(std::fabs(int(uint8_t(v.bytes[i])) - qv), 1.0) << "v, step " << t << " " << i;
        }
        for (int64_t b = 0; b < nb; ++b) EXPECT_GT(vs1[size_t(b)], 0.0f);
    }
}

TEST(LowpAdamW, Fp32PathIsBitwiseUnchanged) {
    // The backend's all-f32 AdamW with grad_scale 1 against the previous kernel's arithmetic.
    const int n = 4099;
    std::mt19937 rng(19);
    std::vector<float> p = randn(n, rng), m = randn(n, rng, 0.1f), v = randn(n, rng, 0.1f);
    const std::vector<float> g = randn(n, rng);
    for (float & x : v) x *= x;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const int t = 5;
    std::vector<float> rp = p, rm = m, rv = v;
    {
        const double bc1 = 1.0 - std::pow(double(b1), t), bc2 = 1.0 - std::pow(double(b2), t);
        const float inv_bc1 = float(1.0 / bc1), inv_bc2 = float(1.0 / bc2);
        const float decay = float(1.0 - double(lr) * wd);
        for (int i = 0; i < n; ++i) {
            const float gi = g[size_t(i)];
            const float mi = b1 * rm[size_t(i)] + (1.0f - b1) * gi;
            const float vi = b2 * rv[size_t(i)] + (1.0f - b2) * gi * gi;
            rm[size_t(i)] = mi, rv[size_t(i)] = vi;
            rp[size_t(i)] = rp[size_t(i)] * decay - lr * (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
        }
    }
    CpuBackend be;
    OptimHyper h;
    h.lr = lr, h.beta1 = b1, h.beta2 = b2, h.eps = eps, h.weight_decay = wd, h.t = t;
    Tensor tp(-1, DType::f32, {n}), tg(-1, DType::f32, {n}), tm(-1, DType::f32, {n}), tv(-1, DType::f32, {n});
    tp.data = p.data(), tg.data = const_cast<float *>(g.data()), tm.data = m.data(), tv.data = v.data();
    adamw_op(be, tp, tg, tm, tv, Tensor{}, Tensor{}, h);
    EXPECT_EQ(0, std::memcmp(p.data(), rp.data(), p.size() * 4));
    EXPECT_EQ(0, std::memcmp(m.data(), rm.data(), m.size() * 4));
    EXPECT_EQ(0, std::memcmp(v.data(), rv.data(), v.size() * 4));
}

// ---------------------------------------------------------------------------------------------
// Gemm

constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;

// Workspace of exactly `bytes`, followed by guard bytes that must survive the call.
struct Workspace {
    std::vector<unsigned char> buf;
    size_t bytes;
    explicit Workspace(size_t n) : buf(n + kGuard, kGuardByte), bytes(n) {}
    Tensor tensor() {
        if (bytes == 0) return Tensor{};
        Tensor t(-1, DType::u8, {int64_t(bytes)});
        t.data = buf.data();
        return t;
    }
    bool guard_intact() const {
        return std::all_of(buf.begin() + std::ptrdiff_t(bytes), buf.end(),
                           [](unsigned char c) { return c == kGuardByte; });
    }
};

struct GemmCase {
    DType a, b, c;
};

// The dtype mixes of mixed-precision training: activations and weights bf16/f16, fp32 logits
// from the LM head, dX from fp32 dlogits, fp32 or low-precision weight gradients.
std::vector<GemmCase> training_mixes(DType lo) {
    const DType f = DType::f32;
    return {{lo, lo, lo}, {lo, lo, f}, {f, lo, lo}, {f, lo, f}, {lo, f, f}, {lo, f, lo}, {f, f, lo}};
}

// Runs d through `run` on low-precision tensors and through the fp32 DnnlGemm on the same
// values, and compares; the workspace's guard bytes must be intact.
template <class Run>
void check_gemm(const GemmDesc & d, size_t ws_bytes, Run && run, const std::string & tag, uint32_t seed) {
    std::mt19937 rng(seed);
    Arr a(d.a, {d.M * d.K}), b(d.b, {d.K * d.N}), c(d.c, {d.M * d.N}), bias(d.b, {d.N});
    a.set(rand_in(a.n(), d.a, rng));
    b.set(rand_in(b.n(), d.b, rng));
    bias.set(rand_in(bias.n(), d.b, rng));
    const std::vector<float> c0 = rand_in(c.n(), d.c, rng, 4.0f);
    c.set(c0);

    std::vector<float> ref = c0;
    cpu::DnnlGemm fp32;
    GemmDesc r = d;
    r.a = r.b = r.c = DType::f32;
    std::vector<std::byte> rws(fp32.workspace_bytes(r) + 1);
    const std::vector<float> af = a.get(), bf = b.get(), biasf = bias.get();
    fp32.run(r, ref.data(), af.data(), bf.data(), d.bias ? biasf.data() : nullptr, rws.data());

    Workspace ws(ws_bytes);
    run(c.t, a.t, b.t, d.bias ? bias.t : Tensor{}, ws);
    EXPECT_TRUE(ws.guard_intact()) << tag << ": workspace overrun";
    expect_rounded(c.get(), ref, d.c, tag);
}

std::string gemm_tag(const GemmDesc & d) {
    char s[160];
    std::snprintf(s, sizeof s, "gemm M=%ld N=%ld K=%ld A=%s B=%s C=%s%s%s%s%s", long(d.M), long(d.N), long(d.K),
                  std::string(dtype_name(d.a)).c_str(), std::string(dtype_name(d.b)).c_str(),
                  std::string(dtype_name(d.c)).c_str(), d.trans_a ? " A^T" : "", d.trans_b ? " B^T" : "",
                  d.accumulate ? " +=" : "", d.bias ? " +bias" : "");
    return s;
}

TEST_P(LowpKernels, GemmTiledMixesTransposesAccumulateBias) {
    // Small tile limits, so that modest shapes are cut into many tiles (M and N are not
    // multiples of the tiles: the last tiles are partial). One thread: thousands of tiny oneDNN
    // calls, each a parallel region that can wait a scheduler tick on a loaded machine (the
    // tiles are below the size at which conversions run in parallel anyway).
    const ThreadScope single(1);
    cpu::DnnlGemm dnnl;
    cpu::MixedGemm mixed(dnnl, cpu::GemmTileLimits{24u << 10, 16});
    bool saw_m_outer = false, saw_n_outer = false;
    uint32_t seed = 100;
    for (const GemmCase & mix : training_mixes(dt))
        for (int tr = 0; tr < 4; ++tr)
            for (int mode = 0; mode < 3; ++mode) {  // plain, accumulate, bias
                GemmDesc d;
                d.M = 151, d.N = 173, d.K = 70;  // primes: never a multiple of a tile
                d.a = mix.a, d.b = mix.b, d.c = mix.c;
                d.trans_a = tr & 1, d.trans_b = tr & 2;
                d.accumulate = mode == 1, d.bias = mode == 2;
                const cpu::GemmTilePlan & p = mixed.plan(d);
                const std::string tag = gemm_tag(d);
                EXPECT_GT(p.m_tiles * p.n_tiles, 1) << tag;
                EXPECT_TRUE(d.M % p.mt != 0 || d.N % p.nt != 0) << tag << ": no partial tile";
                (p.m_outer ? saw_m_outer : saw_n_outer) = true;
                // The workspace holds at least the fp32 tiles it converts.
                size_t need = 0;
                if (d.a != DType::f32) need += size_t(p.mt * d.K) * 4;
                if (d.b != DType::f32) need += size_t(d.K * p.nt) * 4;
                if (d.c != DType::f32) need += size_t(p.mt * p.nt) * 4;
                EXPECT_GE(p.bytes, need) << tag;
                check_gemm(d, p.bytes, [&](Tensor c, Tensor a, Tensor b, Tensor bias, Workspace & ws) {
                    mixed.run(d, c.data, a.data, b.data, bias.data, ws.bytes ? ws.buf.data() : nullptr);
                }, tag, seed++);
            }
    EXPECT_TRUE(saw_m_outer && saw_n_outer);
}

TEST_P(LowpKernels, GemmThroughTheBackendInExactWorkspace) {
    // Default tile limits: one shape whose fp32 tiles exceed the 32 MiB budget (several tiles),
    // the rest single-tile, as the transformer's gemms at small sizes.
    struct S { int64_t M, N, K; bool ta, tb, acc, bias; GemmCase mix; };
    const DType f = DType::f32;
    const std::vector<S> cases = {
        {1100, 1030, 6000, false, false, true, false, {dt, dt, dt}},   // several tiles
        {64, 192, 48, false, false, false, true, {dt, dt, dt}},        // fwd with bias
        {64, 97, 48, false, true, false, false, {dt, dt, f}},          // LM head: f32 logits
        {64, 48, 97, false, false, false, false, {f, dt, dt}},         // dX from f32 dlogits
        {48, 192, 64, true, false, true, false, {dt, dt, f}},          // dW += X^T dY into f32
        {48, 192, 64, true, false, true, false, {dt, dt, dt}},         // ... into the compute dtype
        {97, 48, 64, true, false, true, false, {f, dt, f}},            // dwte += dlogits^T X
        {300, 192, 64, false, false, false, true, {dt, dt, dt}},       // 256+ rows: native B packed
        {300, 48, 192, false, true, true, false, {dt, dt, dt}},        // ... transposed, accumulated
    };
    cpu::DnnlGemm probe;
    cpu::MixedGemm plans(probe);
    uint32_t seed = 200;
    for (const S & s : cases) {
        GemmDesc d;
        d.M = s.M, d.N = s.N, d.K = s.K, d.trans_a = s.ta, d.trans_b = s.tb, d.accumulate = s.acc, d.bias = s.bias;
        d.a = s.mix.a, d.b = s.mix.b, d.c = s.mix.c;
        const size_t bytes = be.gemm_workspace(d);
        // bf16 operands on a CPU with native bf16: the primitive's scratchpad; else fp32 tiles.
        EXPECT_EQ(bytes, probe.native(d) ? probe.native_workspace_bytes(d) : plans.workspace_bytes(d));
        if (s.K == 6000) {
            EXPECT_GT(plans.plan(d).m_tiles * plans.plan(d).n_tiles, 1);
        }
        check_gemm(d, bytes, [&](Tensor c, Tensor a, Tensor b, Tensor bias, Workspace & ws) {
            be.gemm(d, c, a, b, bias, ws.tensor());
        }, gemm_tag(d), seed++);
    }
}

TEST(LowpGemm, AllF32WorkspaceIsOnlyTheScratchpad) {
    CpuBackend be;
    cpu::DnnlGemm fresh;
    for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
            GemmDesc d;
            d.M = 300, d.N = 1100, d.K = 257, d.trans_a = ta, d.trans_b = tb;
            EXPECT_EQ(be.gemm_workspace(d), fresh.workspace_bytes(d));
            GemmDesc lo = d;
            lo.a = lo.b = lo.c = DType::bf16;
            // Native bf16 (a CPU with bf16 instructions): the scratchpad only; else fp32 tiles.
            if (fresh.native(lo)) EXPECT_EQ(be.gemm_workspace(lo), fresh.native_workspace_bytes(lo));
            else EXPECT_GE(be.gemm_workspace(lo), size_t(d.M * d.K + d.K * d.N + d.M * d.N) * 4);
        }
}

// The 24 gemm cases of the bf16 tests: every transpose, C bf16 or f32, plain, + bias or
// accumulate; f(d) under a trace naming the case.
template <class F>
void for_each_bf16_gemm(int64_t M, int64_t N, int64_t K, DType a, F && f) {
    for (const bool ta : {false, true})
        for (const bool tb : {false, true})
            for (const DType cdt : {DType::bf16, DType::f32})
                for (const int mode : {0, 1, 2}) {   // plain, + bias, accumulate
                    GemmDesc d;
                    d.M = M, d.N = N, d.K = K, d.trans_a = ta, d.trans_b = tb;
                    d.a = a, d.b = DType::bf16, d.c = cdt, d.bias = mode == 1, d.accumulate = mode == 2;
                    SCOPED_TRACE(testing::Message() << "ta " << ta << " tb " << tb << " c " << dtype_name(cdt)
                                                    << " mode " << mode);
                    f(d);
                }
}

// Two gemms summing the same bf16 products in fp32: equal to summation order (f32 C) or one
// bf16 rounding (bf16 C), relative to the largest element.
void expect_same_products(const std::vector<float> & got, const std::vector<float> & want, DType c) {
    ASSERT_EQ(got.size(), want.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, double(std::fabs(got[i] - want[i])));
        scale = std::max(scale, double(std::fabs(want[i])));
    }
    EXPECT_LE(worst, (c == DType::f32 ? 1e-5 : 1.0 / 128) * scale);
}

// bf16 gemms run on oneDNN's native bf16 matmul where the CPU has one, else through fp32 tiles
// (gemm_mixed.h); both sum the same bf16 products in fp32, so C agrees to summation order (fp32
// C) or one bf16 rounding (bf16 C), with bias and accumulation, every transpose. With
// MEMFIT_CPU_NATIVE_BF16=0 no shape is native, and the backend plans the tiles' workspace.
TEST(LowpGemm, NativeBf16AgreesWithTheConvertPath) {
    CpuBackend be;
    cpu::DnnlGemm tiles_gemm;
    cpu::MixedGemm tiles(tiles_gemm);
    std::mt19937 rng(77);
    int native = 0, cases = 0;
    // 130 rows: B read in place; 300 rows (>= 256): a native B packed into the workspace first.
    for (const int64_t M : {130, 300})
    for_each_bf16_gemm(M, 300, 257, DType::bf16, [&](const GemmDesc & d) {
        Arr a(d.a, {d.M * d.K}), b(d.b, {d.K * d.N}), bias(d.b, {d.N}), c1(d.c, {d.M * d.N}), c2(d.c, {d.M * d.N});
        a.set(randn(a.n(), rng)), b.set(randn(b.n(), rng)), bias.set(randn(bias.n(), rng));
        const std::vector<float> c0 = randn(c1.n(), rng);
        c1.set(c0), c2.set(c0);
        Workspace w1(be.gemm_workspace(d)), w2(tiles.workspace_bytes(d));
        be.gemm(d, c1.t, a.t, b.t, d.bias ? bias.t : Tensor{}, w1.tensor());
        tiles.run(d, c2.t.data, a.t.data, b.t.data, d.bias ? bias.t.data : nullptr, w2.tensor().data);
        EXPECT_TRUE(w1.guard_intact());
        expect_same_products(c1.get(), c2.get(), d.c);
        native += tiles_gemm.native(d) && be.gemm_workspace(d) == tiles_gemm.native_workspace_bytes(d);
        ++cases;
    });
    RecordProperty("native_bf16_cases", native);
    std::printf("native bf16 matmul on this CPU: %d of %d cases\n", native, cases);
    setenv("MEMFIT_CPU_NATIVE_BF16", "0", 1);
    CpuBackend off;
    cpu::DnnlGemm off_gemm;
    unsetenv("MEMFIT_CPU_NATIVE_BF16");
    GemmDesc d;
    d.M = 130, d.N = 300, d.K = 257, d.a = d.b = d.c = DType::bf16;
    EXPECT_FALSE(off_gemm.native(d));
    EXPECT_EQ(off.gemm_workspace(d), tiles.workspace_bytes(d));
}

TEST(LowpGemm, RepeatsBitwise) {
    // Tiles (B of 12 MB read in place where native), and a native B packed into the workspace.
    for (const int64_t K : {6000, 257}) {
    CpuBackend be;
    GemmDesc d;
    d.M = 1100, d.N = 1030, d.K = K, d.accumulate = true, d.a = d.b = d.c = DType::bf16;
    std::mt19937 rng(300);
    Arr a(d.a, {d.M * d.K}), b(d.b, {d.K * d.N}), c1(d.c, {d.M * d.N}), c2(d.c, {d.M * d.N});
    a.set(randn(a.n(), rng)), b.set(randn(b.n(), rng));
    const std::vector<float> c0 = randn(c1.n(), rng);
    c1.set(c0), c2.set(c0);
    Workspace ws(be.gemm_workspace(d));
    be.gemm(d, c1.t, a.t, b.t, Tensor{}, ws.tensor());
    // Stale tiles in the workspace must not matter.
    std::fill(ws.buf.begin(), ws.buf.begin() + std::ptrdiff_t(ws.bytes), (unsigned char) 0x5a);
    be.gemm(d, c2.t, a.t, b.t, Tensor{}, ws.tensor());
    EXPECT_TRUE(ws.guard_intact());
    EXPECT_EQ(c1.bytes, c2.bytes) << "K " << K;
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LowpKernels, ::testing::Values(DType::bf16, DType::f16), param_name);

}  // namespace
}  // namespace memfit
