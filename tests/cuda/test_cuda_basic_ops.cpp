// The CUDA backend's elementwise, embedding, norm and LLaMA ops against the CPU backend
// (kernels_basic.cu, kernels_norm.cu, kernels_llama.cu): every output of every op, in f32, bf16
// and f16, on shapes that are not multiples of 32 or of the vector width (the scalar paths) and
// shapes that are (the vectorised paths). Accumulated outputs (`+=`) start from random values.
// Ops whose GPU kernels do the CPU's operations in the CPU's order (copies, dropout, the encoder
// and its backward, repeat_kv) are also checked bit for bit.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "op_check.h"

namespace memfit::test {
namespace {

using Ts = std::vector<Tensor>;
constexpr DType kFloats[] = {DType::f32, DType::bf16, DType::f16};

std::string name(DType t) { return std::string(dtype_name(t)); }

TEST(CudaBasicOps, Copy) {
    MF_REQUIRE_GPU();
    for (DType dd : kFloats)
        for (DType sd : kFloats)
            for (int64_t cols : {67, 64}) {
                SCOPED_TRACE(name(dd) + " <- " + name(sd) + " cols " + std::to_string(cols));
                OpCheck chk;
                const int dst = chk.zeros(dd, {3, 37, cols});
                const int src = chk.rand(sd, {3, 37, cols}, -70000.0f, 70000.0f);   // f16 overflows too
                chk.run([&](Backend & be, const Ts & t) { be.copy(t[dst], t[src]); });
                EXPECT_EQ(mismatches(chk, dst), 0);
            }
}

TEST(CudaBasicOps, BiasGrad) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (DType gt : {DType::f32, dt})
            for (auto [rows, oc] : {std::pair<int64_t, int64_t>{77, 45}, {300, 768}}) {
                SCOPED_TRACE(name(dt) + " grad " + name(gt) + " oc " + std::to_string(oc));
                OpCheck chk;
                const int db = chk.rand(gt, {oc});
                const int dout = chk.rand(dt, {rows, oc});
                chk.run([&](Backend & be, const Ts & t) { be.bias_grad(t[db], t[dout]); });
                EXPECT_LT(chk.rel_err(db), tol(gt));
            }
}

TEST(CudaBasicOps, EncoderForward) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int64_t C : {37, 40})
            for (bool with_wpe : {true, false}) {
                SCOPED_TRACE(name(dt) + " C " + std::to_string(C) + (with_wpe ? " wpe" : " no wpe"));
                const int64_t B = 3, T = 17, V = 11;
                OpCheck chk;
                const int out = chk.zeros(dt, {B, T, C});
                const int tok = chk.ints({B, T}, 0, int(V));
                const int wte = chk.rand(dt, {V, C});
                const int wpe = chk.rand(dt, {T, C});
                chk.run([&](Backend & be, const Ts & t) {
                    be.encoder_fwd(t[out], t[tok], t[wte], with_wpe ? t[wpe] : Tensor{});
                });
                EXPECT_EQ(mismatches(chk, out), 0);
            }
}

// dwte and dwpe each f32, the compute dtype or absent; N = 5000 rows spans two scan chunks of the
// dwte kernel, with every token repeated across them.
TEST(CudaBasicOps, EncoderBackward) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int ge = 0; ge < 3; ++ge)
            for (int gp = 0; gp < 3; ++gp)
                for (auto [B, T, C, V] : {std::array<int64_t, 4>{3, 17, 37, 11}, {2, 2500, 24, 50}}) {
                    const DType gts[] = {DType::f32, dt, DType::f32};   // index 2: invalid
                    SCOPED_TRACE(name(dt) + " dwte " + (ge == 2 ? "none" : name(gts[ge])) + " dwpe " +
                                 (gp == 2 ? "none" : name(gts[gp])) + " N " + std::to_string(B * T));
                    OpCheck chk;
                    const int dwte = chk.rand(gts[ge], {V, C});
                    const int dwpe = chk.rand(gts[gp], {T, C});
                    const int dout = chk.rand(dt, {B, T, C});
                    const int tok = chk.ints({B, T}, 0, int(V));
                    chk.run([&](Backend & be, const Ts & t) {
                        be.encoder_bwd(ge == 2 ? Tensor{} : t[dwte], gp == 2 ? Tensor{} : t[dwpe], t[dout], t[tok]);
                    });
                    EXPECT_EQ(mismatches(chk, dwte), 0);
                    EXPECT_EQ(mismatches(chk, dwpe), 0);
                }
}

// A shard of 5 table rows (tokens 4..8) of a vocabulary of 13: other tokens read zero rows and
// give no table gradient.
TEST(CudaBasicOps, VocabEncoder) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (DType gt : {DType::f32, dt})
            for (bool with_wpe : {true, false}) {
                SCOPED_TRACE(name(dt) + " grad " + name(gt) + (with_wpe ? " wpe" : " no wpe"));
                const int64_t B = 2, T = 19, C = 24, Vl = 5, lo = 4;
                OpCheck chk;
                const int out = chk.zeros(dt, {B, T, C});
                const int tok = chk.ints({B, T}, 0, 13);
                const int wte = chk.rand(dt, {Vl, C});
                const int wpe = chk.rand(dt, {T, C});
                const int dwte = chk.rand(gt, {Vl, C});
                const int dwpe = chk.rand(gt, {T, C});
                const int dout = chk.rand(dt, {B, T, C});
                chk.run([&](Backend & be, const Ts & t) {
                    be.vocab_encoder_fwd(t[out], t[tok], t[wte], with_wpe ? t[wpe] : Tensor{}, lo);
                    be.vocab_encoder_bwd(t[dwte], with_wpe ? t[dwpe] : Tensor{}, t[dout], t[tok], lo);
                });
                EXPECT_EQ(mismatches(chk, out), 0);
                EXPECT_EQ(mismatches(chk, dwte), 0);
                EXPECT_EQ(mismatches(chk, dwpe), 0);
            }
}

// Forward then backward on each backend (the backward reads that backend's mean and rstd);
// dinp, dw and db accumulate onto random values; a frozen norm (no dw/db) too.
TEST(CudaBasicOps, LayerNorm) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int g = 0; g < 3; ++g)   // dw/db: f32, the compute dtype, frozen
            for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 67}, {70, 768}}) {
                const DType gt = g == 1 ? dt : DType::f32;
                SCOPED_TRACE(name(dt) + " grad " + (g == 2 ? "frozen" : name(gt)) + " C " + std::to_string(C));
                OpCheck chk;
                const int out = chk.zeros(dt, {N, C});
                const int mean = chk.zeros(DType::f32, {N});
                const int rstd = chk.zeros(DType::f32, {N});
                const int inp = chk.rand(dt, {N, C}, -1.0f, 3.0f);
                const int w = chk.rand(dt, {C});
                const int b = chk.rand(dt, {C});
                const int dinp = chk.rand(dt, {N, C});
                const int dw = chk.rand(gt, {C});
                const int db = chk.rand(gt, {C});
                const int dout = chk.rand(dt, {N, C});
                chk.run([&](Backend & be, const Ts & t) {
                    be.layernorm_fwd(t[out], t[mean], t[rstd], t[inp], t[w], t[b], 1e-5f);
                    be.layernorm_bwd(t[dinp], g == 2 ? Tensor{} : t[dw], g == 2 ? Tensor{} : t[db], t[dout], t[inp],
                                     t[w], t[mean], t[rstd]);
                });
                EXPECT_LT(chk.rel_err(out), tol(dt));
                EXPECT_LT(chk.rel_err(mean), kTolF32);
                EXPECT_LT(chk.rel_err(rstd), kTolF32);
                EXPECT_LT(chk.rel_err(dinp), tol(dt));
                EXPECT_LT(chk.rel_err(dw), tol(gt));
                EXPECT_LT(chk.rel_err(db), tol(gt));
            }
}

TEST(CudaBasicOps, RmsNorm) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int g = 0; g < 3; ++g)   // dw: f32, the compute dtype, frozen
            for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 67}, {70, 512}}) {
                const DType gt = g == 1 ? dt : DType::f32;
                SCOPED_TRACE(name(dt) + " grad " + (g == 2 ? "frozen" : name(gt)) + " C " + std::to_string(C));
                OpCheck chk;
                const int out = chk.zeros(dt, {N, C});
                const int rstd = chk.zeros(DType::f32, {N});
                const int inp = chk.rand(dt, {N, C}, -1.0f, 2.0f);
                const int w = chk.rand(dt, {C});
                const int dinp = chk.rand(dt, {N, C});
                const int dw = chk.rand(gt, {C});
                const int dout = chk.rand(dt, {N, C});
                chk.run([&](Backend & be, const Ts & t) {
                    be.rmsnorm_fwd(t[out], t[rstd], t[inp], t[w], 1e-6f);
                    be.rmsnorm_bwd(t[dinp], g == 2 ? Tensor{} : t[dw], t[dout], t[inp], t[w], t[rstd]);
                });
                EXPECT_LT(chk.rel_err(out), tol(dt));
                EXPECT_LT(chk.rel_err(rstd), kTolF32);
                EXPECT_LT(chk.rel_err(dinp), tol(dt));
                EXPECT_LT(chk.rel_err(dw), tol(gt));
            }
}

// Random inputs, plus the ends of the range where exp's argument is clamped; both GELUs (the
// exact one is erfcf on the GPU, a Chebyshev fit on the CPU).
TEST(CudaBasicOps, Gelu) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int64_t cols : {67, 64})
            for (Gelu kind : {Gelu::tanh, Gelu::erf}) {
            SCOPED_TRACE(name(dt) + " cols " + std::to_string(cols) + (kind == Gelu::erf ? " erf" : " tanh"));
            OpCheck chk;
            const int out = chk.zeros(dt, {5, 13, cols});
            const int dinp = chk.zeros(dt, {5, 13, cols});
            const int inp = chk.rand(dt, {5, 13, cols}, -6.0f, 6.0f);
            const int dout = chk.rand(dt, {5, 13, cols});
            const int out2 = chk.zeros(dt, {9});
            const int dinp2 = chk.zeros(dt, {9});
            const int ext = chk.values(dt, {9}, {-60000.0f, -100.0f, -30.0f, -10.0f, 0.0f, 10.0f, 30.0f, 100.0f, 60000.0f});
            const int dout2 = chk.values(dt, {9}, {1, -1, 1, -1, 1, -1, 1, -1, 1});
            chk.run([&](Backend & be, const Ts & t) {
                be.gelu_fwd(t[out], t[inp], kind);
                be.gelu_bwd(t[dinp], t[dout], t[inp], kind);
                be.gelu_fwd(t[out2], t[ext], kind);
                be.gelu_bwd(t[dinp2], t[dout2], t[ext], kind);
            });
            for (int i : {out, dinp, out2, dinp2}) EXPECT_LT(chk.rel_err(i), tol(dt)) << "tensor " << i;
        }
}

TEST(CudaBasicOps, Residual) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int64_t cols : {67, 64}) {
            SCOPED_TRACE(name(dt) + " cols " + std::to_string(cols));
            OpCheck chk;
            const int out = chk.zeros(dt, {7, cols});
            const int a = chk.rand(dt, {7, cols});
            const int b = chk.rand(dt, {7, cols});
            chk.run([&](Backend & be, const Ts & t) { be.residual_fwd(t[out], t[a], t[b]); });
            EXPECT_EQ(mismatches(chk, out), 0);
        }
}

// The mask is the CPU's bit for bit: out of place, in place, and p = 0.
TEST(CudaBasicOps, Dropout) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int64_t cols : {67, 64}) {
            SCOPED_TRACE(name(dt) + " cols " + std::to_string(cols));
            OpCheck chk;
            const int out = chk.zeros(dt, {31, cols});
            const int in = chk.rand(dt, {31, cols});
            const int inplace = chk.rand(dt, {31, cols});
            const int out0 = chk.zeros(dt, {31, cols});
            chk.run([&](Backend & be, const Ts & t) {
                be.dropout(t[out], t[in], 0.3f, 0x1234567890abcdefull);
                be.dropout(t[inplace], t[inplace], 0.1f, 42);
                be.dropout(t[out0], t[in], 0.0f, 7);
            });
            for (int i : {out, inplace, out0}) EXPECT_EQ(mismatches(chk, i), 0) << "tensor " << i;
        }
}

// Every dtype pair, on an unaligned slice (scalar path) and an aligned one (packs).
TEST(CudaBasicOps, Columns) {
    MF_REQUIRE_GPU();
    for (DType ot : kFloats)
        for (DType dt : kFloats)
            for (auto [ld, col0, cols] : {std::array<int64_t, 3>{67, 5, 20}, {64, 24, 32}}) {
                SCOPED_TRACE(name(ot) + " / " + name(dt) + " col0 " + std::to_string(col0));
                const int64_t N = 37;
                OpCheck chk;
                const int out = chk.rand(ot, {N, ld});
                const int d = chk.rand(dt, {N, cols});
                const int taken = chk.zeros(dt, {N, cols});
                const int src = chk.rand(ot, {N, ld});
                chk.run([&](Backend & be, const Ts & t) {
                    be.add_columns(t[out], t[d], col0, 0.37f);
                    be.take_columns(t[taken], t[src], col0, -1.5f);
                });
                EXPECT_LT(chk.rel_err(out), tol(ot));
                EXPECT_EQ(mismatches(chk, taken), 0);
            }
}

// DoRA's three kernels, both weight layouts, each storage dtype, a bias and none: the norms, the
// scaled output and its saved z, the scaled gradient and the magnitudes' accumulated gradient
// (f32 and the storage dtype).
TEST(CudaBasicOps, Dora) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (bool in_out : {false, true}) {
            SCOPED_TRACE(name(dt) + (in_out ? " in_out" : " out_in"));
            const int64_t N = 37, in = 45, out_cols = 70, col0 = 11, cols = 40, r = 3;
            OpCheck chk;
            const int w = in_out ? chk.rand(dt, {in, out_cols}) : chk.rand(dt, {out_cols, in});
            const int a = chk.rand(dt, {r, in}), b = chk.rand(dt, {cols, r});
            const int norm = chk.zeros(DType::f32, {cols});
            const int out = chk.rand(dt, {N, out_cols}), z = chk.zeros(dt, {N, cols});
            const int bias = chk.rand(dt, {out_cols}), mag = chk.rand(dt, {cols}, 0.5f, 2.0f);
            const int dout = chk.rand(dt, {N, out_cols});
            const int dmag = chk.rand(DType::f32, {cols}), dmag_lowp = chk.rand(dt, {cols});
            const int out_nb = chk.rand(dt, {N, out_cols}), z_nb = chk.zeros(dt, {N, cols});
            chk.run([&](Backend & be, const Ts & t) {
                be.dora_norm(t[norm], t[w], in_out, col0, t[a], t[b], 0.7f);
                be.dora_scale_fwd(t[out], t[z], t[bias], t[mag], t[norm], col0);
                be.dora_scale_fwd(t[out_nb], t[z_nb], Tensor{}, t[mag], t[norm], col0);
                be.dora_scale_bwd(t[dout], t[dmag], t[z], t[mag], t[norm], col0);
                be.dora_scale_bwd(t[dout], t[dmag_lowp], t[z], t[mag], t[norm], col0);
            });
            EXPECT_LT(chk.rel_err(norm), kTolF32);
            for (int i : {out, z, out_nb, z_nb, dout}) EXPECT_LT(chk.rel_err(i), tol(dt)) << "tensor " << i;
            EXPECT_LT(chk.rel_err(dmag), dt == DType::f32 ? 1e-5 : 1e-2);
            EXPECT_LT(chk.rel_err(dmag_lowp), tol(dt));
        }
}

// Small heads from position 0, and hd = 128 far along the sequence (angles up to ~4000 rad).
TEST(CudaBasicOps, Rope) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (auto [T, NH, KVH, hd, pos0] : {std::array<int, 5>{13, 4, 2, 16, 0}, {5, 2, 1, 128, 4000}}) {
            SCOPED_TRACE(name(dt) + " hd " + std::to_string(hd));
            OpCheck chk;
            const int64_t W = int64_t(NH + 2 * KVH) * hd;
            const int qkv = chk.rand(dt, {2, T, W});
            const int dqkv = chk.rand(dt, {2, T, W});
            chk.run([&](Backend & be, const Ts & t) {
                be.rope_fwd(t[qkv], NH, KVH, 10000.0f, pos0);
                be.rope_bwd(t[dqkv], NH, KVH, 500000.0f, pos0);
            });
            EXPECT_LT(chk.rel_err(qkv), tol(dt));
            EXPECT_LT(chk.rel_err(dqkv), tol(dt));
        }
}

// Llama 3.1's rope_scaling (all three frequency bands at hd 16 with a 32-token original context;
// Llama 3.2's own numbers at hd 128) and linear scaling: the same frequencies as the CPU.
TEST(CudaBasicOps, RopeScaling) {
    MF_REQUIRE_GPU();
    Rope llama3(10000.0f), meta(500000.0f), linear(10000.0f);
    llama3.scaling = meta.scaling = RopeScaling::llama3;
    llama3.factor = 4;
    llama3.original_context = 32;
    meta.factor = 32;
    linear.scaling = RopeScaling::linear;
    linear.factor = 2.5f;
    for (DType dt : kFloats)
        for (auto [T, hd, pos0] : {std::array<int, 3>{24, 16, 0}, {5, 128, 9000}}) {
            SCOPED_TRACE(name(dt) + " hd " + std::to_string(hd));
            OpCheck chk;
            const int64_t W = int64_t(4 + 2 * 2) * hd;
            const int qkv = chk.rand(dt, {2, T, W}), dqkv = chk.rand(dt, {2, T, W}), lin = chk.rand(dt, {2, T, W});
            chk.run([&](Backend & be, const Ts & t) {
                be.rope_fwd(t[qkv], 4, 2, hd == 16 ? llama3 : meta, pos0);
                be.rope_bwd(t[dqkv], 4, 2, hd == 16 ? llama3 : meta, pos0);
                be.rope_fwd(t[lin], 4, 2, linear, pos0);
            });
            EXPECT_LT(chk.rel_err(qkv), tol(dt));
            EXPECT_LT(chk.rel_err(dqkv), tol(dt));
            EXPECT_LT(chk.rel_err(lin), tol(dt));
        }
}

// Partial rotary (12 of 16 dimensions; 96 of 128) with LongRoPE's per-frequency factors and cos/sin
// scale, short and long: the CPU's rotation, the passed-through dimensions untouched.
TEST(CudaBasicOps, RopePartialLongRope) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (auto [T, hd, rot, pos0] : {std::array<int, 4>{24, 16, 12, 0}, {5, 128, 96, 9000}}) {
            Rope r(10000.0f);
            r.scaling = RopeScaling::longrope;
            r.rotary_dim = rot;
            r.original_context = 16;
            r.attention_factor = 1.2247449f;
            for (int i = 0; i < rot / 2; ++i) {
                r.short_factor.push_back(1.0 + 0.1 * i);
                r.long_factor.push_back(1.0 + 0.7 * i);
            }
            SCOPED_TRACE(name(dt) + " hd " + std::to_string(hd));
            OpCheck chk;
            const int64_t W = int64_t(4 + 2 * 2) * hd;
            const int qkv = chk.rand(dt, {2, T, W}), dqkv = chk.rand(dt, {2, T, W});
            chk.run([&](Backend & be, const Ts & t) {
                be.rope_fwd(t[qkv], 4, 2, r.for_sequence(T), pos0);
                be.rope_bwd(t[dqkv], 4, 2, r.for_sequence(T), pos0);
            });
            EXPECT_LT(chk.rel_err(qkv), tol(dt));
            EXPECT_LT(chk.rel_err(dqkv), tol(dt));
        }
}

// Qwen3's q and k norms, in place on q|k|v with the inputs kept: forward, then backward with fp32
// and with 16-bit gain gradients, against the CPU; head dims 24 (a partial column block) and 128.
TEST(CudaBasicOps, QkNorm) {
    MF_REQUIRE_GPU();
    const int NH = 4, KVH = 2;
    for (DType dt : kFloats)
        for (int64_t hd : {24, 128}) {
            SCOPED_TRACE(name(dt) + " hd " + std::to_string(hd));
            OpCheck chk;
            const int64_t W = (NH + 2 * KVH) * hd;
            const int qkv = chk.rand(dt, {2, 9, W}, -3.0f, 3.0f), dqkv = chk.rand(dt, {2, 9, W}),
                      dqkv2 = chk.rand(dt, {2, 9, W});
            const int raw = chk.zeros(dt, {2, 9, (NH + KVH) * hd}), rstd = chk.zeros(DType::f32, {2, 9, NH + KVH});
            const int wq = chk.rand(dt, {hd}, 0.5f, 1.5f), wk = chk.rand(dt, {hd}, 0.5f, 1.5f);
            const int dwq = chk.rand(DType::f32, {hd}), dwk = chk.rand(DType::f32, {hd});
            const int dwq2 = chk.rand(dt, {hd}), dwk2 = chk.rand(dt, {hd});
            chk.run([&](Backend & be, const Ts & t) {
                be.qk_norm_fwd(t[qkv], t[raw], t[rstd], t[wq], t[wk], NH, KVH, 1e-6f);
                be.qk_norm_bwd(t[dqkv], t[dwq], t[dwk], t[raw], t[wq], t[wk], t[rstd], NH, KVH);
                be.qk_norm_bwd(t[dqkv2], t[dwq2], t[dwk2], t[raw], t[wq], t[wk], t[rstd], NH, KVH);
            });
            for (int i : {qkv, raw, rstd}) EXPECT_LT(chk.rel_err(i), tol(dt)) << i;
            for (int i : {dqkv, dqkv2, dwq, dwk, dwq2, dwk2}) EXPECT_LT(chk.rel_err(i), bwd_tol(dt)) << i;
        }
}

TEST(CudaBasicOps, Swiglu) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int64_t I : {67, 64}) {
            SCOPED_TRACE(name(dt) + " I " + std::to_string(I));
            const int64_t N = 37;
            OpCheck chk;
            const int out = chk.zeros(dt, {N, I});
            const int dinp = chk.zeros(dt, {N, 2 * I});
            const int inp = chk.rand(dt, {N, 2 * I}, -8.0f, 8.0f);
            const int dout = chk.rand(dt, {N, I});
            chk.run([&](Backend & be, const Ts & t) {
                be.swiglu_fwd(t[out], t[inp]);
                be.swiglu_bwd(t[dinp], t[dout], t[inp]);
            });
            EXPECT_LT(chk.rel_err(out), tol(dt));
            EXPECT_LT(chk.rel_err(dinp), tol(dt));
        }
}

TEST(CudaBasicOps, Geglu) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (int64_t I : {67, 64}) {
            SCOPED_TRACE(name(dt) + " I " + std::to_string(I));
            const int64_t N = 37;
            OpCheck chk;
            const int out = chk.zeros(dt, {N, I});
            const int dinp = chk.zeros(dt, {N, 2 * I});
            const int inp = chk.rand(dt, {N, 2 * I}, -8.0f, 8.0f);
            const int dout = chk.rand(dt, {N, I});
            chk.run([&](Backend & be, const Ts & t) {
                be.geglu_fwd(t[out], t[inp]);
                be.geglu_bwd(t[dinp], t[dout], t[inp]);
            });
            EXPECT_LT(chk.rel_err(out), tol(dt));
            EXPECT_LT(chk.rel_err(dinp), tol(dt));
        }
}

// G = 3 (hd 12: scalar path for 2-byte types) and G = 1, 4 (hd 16: packs).
TEST(CudaBasicOps, RepeatKv) {
    MF_REQUIRE_GPU();
    for (DType dt : kFloats)
        for (auto [NH, KVH, hd] : {std::array<int, 3>{6, 2, 12}, {4, 4, 16}, {8, 2, 16}}) {
            SCOPED_TRACE(name(dt) + " NH " + std::to_string(NH) + " KVH " + std::to_string(KVH));
            const int64_t B = 2, T = 7;
            OpCheck chk;
            const int full = chk.zeros(dt, {B, T, 3 * int64_t(NH) * hd});
            const int qkv = chk.rand(dt, {B, T, int64_t(NH + 2 * KVH) * hd});
            const int dqkv = chk.zeros(dt, {B, T, int64_t(NH + 2 * KVH) * hd});
            const int dfull = chk.rand(dt, {B, T, 3 * int64_t(NH) * hd});
            chk.run([&](Backend & be, const Ts & t) {
                be.repeat_kv_fwd(t[full], t[qkv], NH, KVH);
                be.repeat_kv_bwd(t[dqkv], t[dfull], NH, KVH);
            });
            EXPECT_EQ(mismatches(chk, full), 0);
            EXPECT_EQ(mismatches(chk, dqkv), 0);
        }
}

}  // namespace
}  // namespace memfit::test
