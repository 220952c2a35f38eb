// The CUDA backend's loss, optimizer and dequantization kernels against the CPU backend:
// cross-entropy (full and vocabulary-parallel, ignored rows, padding columns, odd vocabularies so
// rows start unaligned), sum_squares (millions of bf16, unaligned views, inf and NaN), AdamW
// (clipping on and off, loss scale, bf16/f16 compute copies, skipped steps, unaligned views) and
// dequantize (int8, nf4, nf4 with double quantization, sparse24, to f32, bf16 and f16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/moments8.h"
#include "backend/quant_format.h"
#include "core/dtype.h"
#include "op_check.h"
#include "optim_ops.h"

namespace memfit::test {
namespace {

// ---- cross-entropy --------------------------------------------------------------------------

void check_xent(int64_t N, int64_t V, const std::vector<float> & targets) {
    {   // forward: losses and the probabilities in place
        OpCheck c;
        const int logits = c.rand(DType::f32, {N, V}, -8.0f, 8.0f);
        const int tg = c.values(DType::i32, {N}, targets);
        const int losses = c.rand(DType::f32, {N});   // written, whatever it held
        c.run([&](Backend & b, const std::vector<Tensor> & t) {
            b.xent_fwd(t[size_t(losses)], t[size_t(logits)], t[size_t(tg)]);
        });
        EXPECT_LE(c.rel_err(losses), 1e-5) << "N " << N << " V " << V;
        EXPECT_LE(c.rel_err(logits), 1e-5) << "N " << N << " V " << V;
        const std::vector<float> l = c.gpu(losses);
        for (int64_t i = 0; i < N; ++i) {
            if (targets[size_t(i)] != -100) continue;
            EXPECT_EQ(l[size_t(i)], 0.0f) << "ignored row " << i;
        }
    }
    {   // forward then backward: dlogits in place
        OpCheck c;
        const int logits = c.rand(DType::f32, {N, V}, -8.0f, 8.0f);
        const int tg = c.values(DType::i32, {N}, targets);
        const int losses = c.zeros(DType::f32, {N});
        c.run([&](Backend & b, const std::vector<Tensor> & t) {
            b.xent_fwd(t[size_t(losses)], t[size_t(logits)], t[size_t(tg)]);
            b.xent_bwd(t[size_t(logits)], t[size_t(tg)], 1.0f / float(N));
        });
        EXPECT_LE(c.rel_err(logits), 1e-5) << "N " << N << " V " << V;
        const std::vector<float> d = c.gpu(logits);
        for (int64_t i = 0; i < N; ++i) {
            if (targets[size_t(i)] != -100) continue;
            for (int64_t j = 0; j < V; ++j) ASSERT_EQ(d[size_t(i * V + j)], 0.0f) << "ignored row " << i;
        }
    }
    {   // both in one op (training's loss chunk)
        OpCheck c;
        const int logits = c.rand(DType::f32, {N, V}, -8.0f, 8.0f);
        const int tg = c.values(DType::i32, {N}, targets);
        const int losses = c.rand(DType::f32, {N});
        c.run([&](Backend & b, const std::vector<Tensor> & t) {
            b.xent_fwd_bwd(t[size_t(losses)], t[size_t(logits)], t[size_t(tg)], 1.0f / float(N));
        });
        EXPECT_LE(c.rel_err(losses), 1e-5) << "N " << N << " V " << V;
        EXPECT_LE(c.rel_err(logits), 1e-5) << "N " << N << " V " << V;
    }
}

TEST(CudaLoss, CrossEntropyMatchesCpu) {
    MF_REQUIRE_GPU();
    check_xent(5, 1000, {3, -100, 0, 999, 512});
    check_xent(7, 50257, {50256, 0, -100, 17, -100, 25000, 1});   // odd V: unaligned row starts
    check_xent(3, 5, {4, -100, 2});                               // V smaller than a vector
}

// Distillation: forward (losses, stats, the teacher's row -> q) and backward against the CPU.
void check_distill(int64_t N, int64_t V, const std::vector<float> & targets, float alpha, float temperature) {
    OpCheck c;
    const int logits = c.rand(DType::f32, {N, V}, -8.0f, 8.0f);
    const int teacher = c.rand(DType::f32, {N, V}, -6.0f, 6.0f);
    const int tg = c.values(DType::i32, {N}, targets);
    const int losses = c.rand(DType::f32, {N});   // written, whatever they held
    const int stats = c.rand(DType::f32, {2, N});
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        b.distill_fwd(t[size_t(losses)], t[size_t(stats)], t[size_t(logits)], t[size_t(teacher)], t[size_t(tg)], alpha,
                      temperature);
    });
    EXPECT_LE(c.rel_err(losses), 1e-5) << "V " << V << " alpha " << alpha << " T " << temperature;
    EXPECT_LE(c.rel_err(stats), 1e-5);
    EXPECT_LE(c.rel_err(teacher), 1e-5);
    EXPECT_LE(c.rel_err(logits), 0.0);   // untouched
    OpCheck d;
    const int z = d.rand(DType::f32, {N, V}, -8.0f, 8.0f);
    const int q = d.rand(DType::f32, {N, V}, -6.0f, 6.0f);
    const int tg2 = d.values(DType::i32, {N}, targets);
    const int l2 = d.zeros(DType::f32, {N});
    const int s2 = d.zeros(DType::f32, {2, N});
    d.run([&](Backend & b, const std::vector<Tensor> & t) {
        b.distill_fwd(t[size_t(l2)], t[size_t(s2)], t[size_t(z)], t[size_t(q)], t[size_t(tg2)], alpha, temperature);
        b.distill_bwd(t[size_t(z)], t[size_t(s2)], t[size_t(q)], t[size_t(tg2)], alpha, temperature, 1.0f / float(N));
    });
    EXPECT_LE(d.rel_err(z), 1e-5) << "V " << V << " alpha " << alpha << " T " << temperature;
    const std::vector<float> g = d.gpu(z);
    for (int64_t i = 0; i < N; ++i) {
        if (targets[size_t(i)] != -100) continue;
        for (int64_t j = 0; j < V; ++j) ASSERT_EQ(g[size_t(i * V + j)], 0.0f) << "ignored row " << i;
    }
}

TEST(CudaLoss, DistillationMatchesCpu) {
    MF_REQUIRE_GPU();
    check_distill(5, 1000, {3, -100, 0, 999, 512}, 0.5f, 2.0f);
    check_distill(4, 50257, {50256, 0, -100, 17}, 0.9f, 4.0f);   // odd V: unaligned row starts
    check_distill(3, 5, {4, -100, 2}, 1.0f, 0.5f);
    check_distill(3, 77, {4, 1, 2}, 0.0f, 1.0f);
}

TEST(CudaLoss, CrossEntropyLargeVocabulary) {
    MF_REQUIRE_GPU();
    check_xent(4, 128256, {128255, -100, 7, 64000});
}

// R shards of Vl columns over a vocabulary of `vocab` entries (the last shards may be padding).
void check_xent_shards(int64_t N, int64_t Vl, int R, int64_t vocab, const std::vector<float> & targets) {
    OpCheck c;
    std::vector<int> shard;
    for (int r = 0; r < R; ++r) shard.push_back(c.rand(DType::f32, {N, Vl}, -6.0f, 6.0f));
    const int tg = c.values(DType::i32, {N}, targets);
    const int gathered = c.zeros(DType::f32, {int64_t(R), 2, N});
    const int losses = c.zeros(DType::f32, {N});
    const int lse = c.zeros(DType::f32, {N});
    const float dloss = 0.25f;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        const Tensor g = t[size_t(gathered)];
        for (int r = 0; r < R; ++r)
            b.xent_shard_stats(g.view(int64_t(r) * 2 * N, {2, N}), t[size_t(shard[size_t(r)])], t[size_t(tg)],
                               r * Vl, vocab);
        b.xent_shard_loss(t[size_t(losses)], t[size_t(lse)], g, t[size_t(tg)]);
        for (int r = 0; r < R; ++r)
            b.xent_shard_bwd(t[size_t(shard[size_t(r)])], t[size_t(tg)], t[size_t(lse)], r * Vl, vocab, dloss);
    });
    EXPECT_LE(c.rel_err(gathered), 1e-5);
    EXPECT_LE(c.rel_err(losses), 1e-5);
    EXPECT_LE(c.rel_err(lse), 1e-5);
    for (int r = 0; r < R; ++r) {
        EXPECT_LE(c.rel_err(shard[size_t(r)]), 1e-5) << "shard " << r;
        const std::vector<float> d = c.gpu(shard[size_t(r)]);
        for (int64_t i = 0; i < N; ++i)
            for (int64_t j = 0; j < Vl; ++j)
                if (targets[size_t(i)] == -100 || r * Vl + j >= vocab) {
                    ASSERT_EQ(d[size_t(i * Vl + j)], 0.0f) << "shard " << r << " row " << i << " col " << j;
                }
    }
    const std::vector<float> g = c.gpu(gathered);
    for (int r = 0; r < R; ++r)
        if (r * Vl >= vocab) {
            for (int64_t i = 0; i < N; ++i) EXPECT_EQ(g[size_t(r * 2 * N + i)], -INFINITY) << "empty shard " << r;
        }
}

TEST(CudaLoss, ShardedCrossEntropyMatchesCpu) {
    MF_REQUIRE_GPU();
    // 4 shards of 256 over 1000 entries: the last holds 232 valid columns and 24 of padding.
    check_xent_shards(6, 256, 4, 1000, {999, -100, 0, 255, 256, 768});
    // 50257 over 4 shards of 12565 (GPT-2's vocabulary): unaligned rows, padding in the last.
    check_xent_shards(3, 12565, 4, 50257, {50256, 12565, -100});
    // A shard made only of padding (its stats are -inf) and a shard width that is not a multiple of 4.
    check_xent_shards(4, 301, 4, 850, {849, 0, -100, 602});
}

// The contract's other half: the shards' losses equal xent_fwd's on the concatenated valid
// columns, and each shard's dlogits equal xent_bwd's columns (both on the GPU).
TEST(CudaLoss, ShardedCrossEntropyEqualsFullOnGpu) {
    MF_REQUIRE_GPU();
    const int64_t N = 4, Vl = 250, vocab = 997;
    const int R = 4;
    const std::vector<float> targets = {996, -100, 3, 500};
    const float dloss = 0.5f;
    OpCheck c;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-5.0f, 5.0f);
    std::vector<std::vector<float>> logits(size_t(R), std::vector<float>(size_t(N * Vl)));
    std::vector<int> shard;
    for (auto & l : logits) {
        for (auto & x : l) x = u(rng);
        shard.push_back(c.values(DType::f32, {N, Vl}, l));
    }
    const int tg = c.values(DType::i32, {N}, targets);
    const int gathered = c.zeros(DType::f32, {int64_t(R), 2, N});
    const int losses = c.zeros(DType::f32, {N});
    const int lse = c.zeros(DType::f32, {N});
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        for (int r = 0; r < R; ++r)
            b.xent_shard_stats(t[size_t(gathered)].view(int64_t(r) * 2 * N, {2, N}), t[size_t(shard[size_t(r)])],
                               t[size_t(tg)], r * Vl, vocab);
        b.xent_shard_loss(t[size_t(losses)], t[size_t(lse)], t[size_t(gathered)], t[size_t(tg)]);
        for (int r = 0; r < R; ++r)
            b.xent_shard_bwd(t[size_t(shard[size_t(r)])], t[size_t(tg)], t[size_t(lse)], r * Vl, vocab, dloss);
    });
    std::vector<float> valid;
    for (int64_t i = 0; i < N; ++i)
        for (int64_t col = 0; col < vocab; ++col)
            valid.push_back(logits[size_t(col / Vl)][size_t(i * Vl + col % Vl)]);
    OpCheck f;
    const int lg = f.values(DType::f32, {N, vocab}, valid);
    const int tg2 = f.values(DType::i32, {N}, targets);
    const int l2 = f.zeros(DType::f32, {N});
    f.run([&](Backend & b, const std::vector<Tensor> & t) {
        b.xent_fwd(t[size_t(l2)], t[size_t(lg)], t[size_t(tg2)]);
        b.xent_bwd(t[size_t(lg)], t[size_t(tg2)], dloss);
    });
    const std::vector<float> a = c.gpu(losses), e = f.gpu(l2), d = f.gpu(lg);
    for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(a[size_t(i)], e[size_t(i)], 1e-5 * (1 + std::fabs(e[size_t(i)])));
    for (int r = 0; r < R; ++r) {
        const std::vector<float> ds = c.gpu(shard[size_t(r)]);
        for (int64_t i = 0; i < N; ++i)
            for (int64_t j = 0; j < Vl && r * Vl + j < vocab; ++j)
                ASSERT_NEAR(ds[size_t(i * Vl + j)], d[size_t(i * vocab + r * Vl + j)], 1e-6)
                    << "shard " << r << " row " << i << " col " << j;
    }
}

// ---- sum of squares ---------------------------------------------------------------------------

TEST(CudaOptim, SumSquaresMatchesCpu) {
    MF_REQUIRE_GPU();
    OpCheck c;
    const int big = c.rand(DType::bf16, {3'000'001});
    const int f32 = c.rand(DType::f32, {1'234'567}, -3.0f, 3.0f);
    const int f16 = c.rand(DType::f16, {70'001});
    const int tiny = c.values(DType::f32, {3}, {1.0f, -2.0f, 0.5f});
    const int outs = c.zeros(DType::f32, {6});
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        const Tensor o = t[size_t(outs)];
        b.sum_squares(o.view(0, {1}), t[size_t(big)]);
        b.sum_squares(o.view(1, {1}), t[size_t(big)].view(1, {2'999'999}));   // unaligned start
        b.sum_squares(o.view(2, {1}), t[size_t(f32)]);
        b.sum_squares(o.view(3, {1}), t[size_t(f16)].view(3, {69'990}));
        b.sum_squares(o.view(4, {1}), t[size_t(tiny)]);
        b.sum_squares(o.view(5, {1}), t[size_t(big)]);   // again on the same stream: the same value
    });
    const std::vector<float> cpu = c.cpu(outs), gpu = c.gpu(outs);
    for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-6 * cpu[i]) << "sum " << i;
    EXPECT_EQ(gpu[4], 5.25f);
    EXPECT_EQ(gpu[0], gpu[5]) << "deterministic";
}

TEST(CudaOptim, SumSquaresPropagatesInfAndNan) {
    MF_REQUIRE_GPU();
    std::vector<float> v(100'003, 0.5f), w = v;
    v[77'777] = INFINITY;
    w[12] = NAN;
    OpCheck c;
    const int a = c.values(DType::bf16, {100'003}, v);
    const int b2 = c.values(DType::f32, {100'003}, w);
    const int outs = c.zeros(DType::f32, {2});
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        b.sum_squares(t[size_t(outs)].view(0, {1}), t[size_t(a)]);
        b.sum_squares(t[size_t(outs)].view(1, {1}), t[size_t(b2)]);
    });
    const std::vector<float> g = c.gpu(outs);
    EXPECT_EQ(g[0], INFINITY);
    EXPECT_TRUE(std::isnan(g[1]));
}

// ---- AdamW --------------------------------------------------------------------------------

struct AdamCase {
    DType grad = DType::f32;
    DType copy = DType::f32;   // f32: no param_copy
    float clip = 0.0f, grad_scale = 1.0f;
    int64_t offset = 0;        // elements skipped at the start of every tensor (unaligned views)
    int64_t grad_offset = 0;   // extra offset of the gradient alone
    DType moments = DType::f32;   // bf16: --optimizer adamw-bf16
};

void check_adamw(const AdamCase & k) {
    const int64_t n = 10'007;
    OpCheck c;
    const int param = c.rand(DType::f32, {n + 2}, -1.0f, 1.0f);
    const int grad = c.rand(k.grad, {n + 2}, -0.5f, 0.5f);
    const int m = c.rand(k.moments, {n + 2}, -0.05f, 0.05f);
    const int v = c.rand(k.moments, {n + 2}, 0.0f, 0.01f);
    const int copy = c.zeros(k.copy == DType::f32 ? DType::bf16 : k.copy, {n + 2});
    const int nsq = c.zeros(DType::f32, {1});
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f, h.t = 3, h.eps = 1e-6f, h.clip = k.clip, h.grad_scale = k.grad_scale;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto cut = [&](int i, int64_t extra = 0) { return t[size_t(i)].view(k.offset + extra, {n}); };
        b.sum_squares(t[size_t(nsq)], cut(grad, k.grad_offset));   // on the device for the GPU
        adamw_op(b, cut(param), cut(grad, k.grad_offset), cut(m), cut(v), t[size_t(nsq)],
                k.copy == DType::f32 ? Tensor{} : cut(copy), h);
    });
    EXPECT_LE(c.rel_err(param), 1e-5);
    // bf16 moments: both round the same f32 value to nearest even, up to one ulp where the
    // device's f32 arithmetic differs in its last bit.
    EXPECT_LE(c.rel_err(m), k.moments == DType::f32 ? 1e-5 : tol(DType::bf16));
    EXPECT_LE(c.rel_err(v), k.moments == DType::f32 ? 1e-5 : tol(DType::bf16));
    if (k.copy != DType::f32) {
        EXPECT_LE(c.rel_err(copy), tol(k.copy));
    }
}

TEST(CudaOptim, AdamWMatchesCpu) {
    MF_REQUIRE_GPU();
    // sqrt(sum of 10007 squares of U(-0.5, 0.5)) ~ 28.9: clip 1 is active, clip 1000 is not.
    check_adamw({});
    check_adamw({DType::f32, DType::f32, 1.0f, 1.0f, 0, 0});
    check_adamw({DType::f32, DType::f32, 1000.0f, 1.0f, 0, 0});
    check_adamw({DType::bf16, DType::bf16, 1.0f, 0.5f, 0, 0});
    check_adamw({DType::bf16, DType::bf16, 1000.0f, 0.25f, 0, 0});
    check_adamw({DType::f16, DType::f16, 1.0f, 1.0f, 0, 0});
    check_adamw({DType::f32, DType::bf16, 0.0f, 1.0f, 0, 0});
    check_adamw({DType::bf16, DType::f32, 1.0f, 1.0f, 0, 0});
}

TEST(CudaOptim, AdamWBf16MomentsMatchCpu) {
    MF_REQUIRE_GPU();
    AdamCase k;
    k.moments = DType::bf16;
    check_adamw(k);   // fp32: vectorized
    k.grad = DType::bf16, k.copy = DType::bf16, k.clip = 1.0f;
    check_adamw(k);
    k.offset = 1;     // unaligned: the scalar path
    check_adamw(k);
}

// --optimizer adamw-8bit on the device (backend/moments8.h): from random codes and scales, the
// weights and the new scales within float rounding of the CPU's, every code within one level
// (the two may contract multiply-adds differently, and a value at a level's edge rounds apart).
void check_adamw_8bit(DType grad_dt, DType copy_dt, float clip) {
    const int64_t n = 3 * int64_t(kMoments8Block) + 77, nb = int64_t(moments8_blocks(size_t(n)));
    std::mt19937 rng(41);
    std::uniform_int_distribution<int> code(0, 255);
    std::uniform_real_distribution<float> u(0.01f, 0.2f);
    std::vector<float> mc(static_cast<size_t>(n)), vc(static_cast<size_t>(n)), msc(static_cast<size_t>(nb)),
        vsc(static_cast<size_t>(nb));
    for (auto & x : mc) x = float(code(rng));
    for (auto & x : vc) x = float(code(rng));
    for (auto & x : msc) x = u(rng);
    for (auto & x : vsc) x = u(rng) * u(rng);
    OpCheck c;
    const int param = c.rand(DType::f32, {n}, -1.0f, 1.0f);
    const int grad = c.rand(grad_dt, {n}, -0.5f, 0.5f);
    const int m = c.values(DType::u8, {n}, mc), v = c.values(DType::u8, {n}, vc);
    const int ms = c.values(DType::f32, {nb}, msc), vs = c.values(DType::f32, {nb}, vsc);
    const int copy = c.zeros(copy_dt == DType::f32 ? DType::bf16 : copy_dt, {n});
    const int nsq = c.zeros(DType::f32, {1});
    OptimHyper h;
    h.lr = 1e-2f, h.weight_decay = 0.1f, h.t = 3, h.eps = 1e-6f, h.clip = clip;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        b.sum_squares(at(nsq), at(grad));
        adamw_8bit_op(b, at(param), at(grad), at(m), at(v), at(ms), at(vs), at(nsq),
                     copy_dt == DType::f32 ? Tensor{} : at(copy), h);
    });
    EXPECT_LE(c.rel_err(param), 1e-5);
    EXPECT_LE(c.rel_err(ms), 1e-5);
    EXPECT_LE(c.rel_err(vs), 1e-5);
    const std::vector<float> mcpu = c.cpu(m), mgpu = c.gpu(m), vcpu = c.cpu(v), vgpu = c.gpu(v);
    int moved = 0;
    for (size_t i = 0; i < size_t(n); ++i) {
        ASSERT_LE(std::abs(int(int8_t(uint8_t(mcpu[i]))) - int(int8_t(uint8_t(mgpu[i])))), 1) << i;
        ASSERT_LE(std::fabs(vcpu[i] - vgpu[i]), 1.0f) << i;
        moved += mcpu[i] != mc[i];
    }
    EXPECT_GT(moved, int(n / 2)) << "the step re-encoded the moments";
}

TEST(CudaOptim, AdamW8BitMomentsMatchCpu) {
    MF_REQUIRE_GPU();
    check_adamw_8bit(DType::f32, DType::f32, 0.0f);
    check_adamw_8bit(DType::bf16, DType::bf16, 1.0f);
}

// --master-weights bf16-sr: bf16 weights rounded stochastically with the same draws as the CPU's
// (the flat index sr_at + i). The f32 value before rounding may differ in its last bit where the
// two contract multiply-adds differently, so a weight may land one bf16 step apart, rarely.
void check_adamw_sr(bool eight) {
    const int64_t n = 3 * int64_t(kMoments8Block) + 77, nb = int64_t(moments8_blocks(size_t(n)));
    OpCheck c;
    const int param = c.rand(DType::bf16, {n}, -1.0f, 1.0f);
    const int grad = c.rand(DType::f32, {n}, -0.5f, 0.5f);
    const int m = eight ? c.zeros(DType::u8, {n}) : c.zeros(DType::f32, {n});
    const int v = eight ? c.zeros(DType::u8, {n}) : c.zeros(DType::f32, {n});
    const int ms = c.zeros(DType::f32, {nb}), vs = c.zeros(DType::f32, {nb});
    OptimHyper h;
    h.lr = 1e-3f, h.weight_decay = 0.1f, h.sr_seed = 99, h.sr_at = 12345;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        if (eight) adamw_8bit_op(b, at(param), at(grad), at(m), at(v), at(ms), at(vs), Tensor{}, Tensor{}, h);
        else adamw_op(b, at(param), at(grad), at(m), at(v), Tensor{}, Tensor{}, h);
    });
    const std::vector<float> a = c.cpu(param), b = c.gpu(param);
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] == b[i]) continue;
        ++differ;
        EXPECT_LE(std::fabs(a[i] - b[i]), std::ldexp(std::fabs(a[i]), -7)) << i;
    }
    EXPECT_LE(differ, int(n / 100)) << "the draws differ";
}

TEST(CudaOptim, AdamWBf16SrMatchesCpu) {
    MF_REQUIRE_GPU();
    check_adamw_sr(false);
    check_adamw_sr(true);
}

// --optimizer sgd on the device: the CPU's update (fp32 weights with a bf16 copy, clipped), and
// bf16-sr weights with the same draws.
TEST(CudaOptim, SgdMatchesCpu) {
    MF_REQUIRE_GPU();
    const int64_t n = 3001;
    OpCheck c;
    const int param = c.rand(DType::f32, {n}), grad = c.rand(DType::bf16, {n}, -0.5f, 0.5f);
    const int buf = c.rand(DType::f32, {n}, -0.1f, 0.1f), copy = c.zeros(DType::bf16, {n}), nsq = c.zeros(DType::f32, {1});
    const int w16 = c.rand(DType::bf16, {n}), buf16 = c.zeros(DType::f32, {n});
    OptimHyper h;
    h.lr = 0.05f, h.momentum = 0.9f, h.weight_decay = 0.01f, h.clip = 1.0f;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        b.sum_squares(at(nsq), at(grad));
        sgd_op(b, at(param), at(grad), at(buf), at(nsq), at(copy), h);
        OptimHyper sr = h;
        sr.sr_seed = 5;
        sgd_op(b, at(w16), at(grad), at(buf16), at(nsq), Tensor{}, sr);
    });
    for (int i : {param, buf}) EXPECT_LE(c.rel_err(i), 1e-5);
    EXPECT_LE(c.rel_err(copy), tol(DType::bf16));
    EXPECT_LE(c.rel_err(w16), tol(DType::bf16));
}

// --optimizer adafactor on the device: a factored 67 x 45 matrix with a bf16 copy (clipped by the
// global norm, and the update's RMS by its threshold over two steps) and a vector; the CPU's steps.
TEST(CudaOptim, AdafactorMatchesCpu) {
    MF_REQUIRE_GPU();
    const int64_t R = 67, C = 45;
    OpCheck c;
    const int param = c.rand(DType::f32, {R, C}), grad = c.rand(DType::bf16, {R, C}, -0.5f, 0.5f);
    const int stat = c.zeros(DType::f32, {R + C}), copy = c.zeros(DType::bf16, {R, C}), nsq = c.zeros(DType::f32, {1});
    const int vec = c.rand(DType::f32, {C}), vgrad = c.rand(DType::f32, {C}, -0.5f, 0.5f), vstat = c.zeros(DType::f32, {C});
    // --adafactor-beta1: a matrix with a first moment
    const int mp = c.rand(DType::f32, {R, C}), mstat = c.zeros(DType::f32, {R + C}), m = c.zeros(DType::f32, {R, C});
    OptimHyper h;
    h.lr = 0.01f, h.weight_decay = 0.1f, h.clip = 1.0f, h.clip_threshold = 0.5f;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        auto at = [&](int i) { return t[size_t(i)]; };
        b.sum_squares(at(nsq), at(grad));
        for (int s = 1; s <= 2; ++s) {
            h.t = s;
            h.adafactor_beta1 = 0;
            b.optimizer_step(Optimizer::adafactor, at(param), at(grad), OptimizerStates{{at(stat)}}, at(nsq), at(copy), h);
            b.optimizer_step(Optimizer::adafactor, at(vec), at(vgrad), OptimizerStates{{at(vstat)}}, Tensor{}, Tensor{}, h);
            h.adafactor_beta1 = 0.9f;
            b.optimizer_step(Optimizer::adafactor, at(mp), at(grad), OptimizerStates{{at(mstat), at(m)}}, at(nsq), Tensor{}, h);
        }
    });
    for (int i : {param, stat, vec, vstat, mp, mstat, m}) EXPECT_LE(c.rel_err(i), 1e-5);
    EXPECT_LE(c.rel_err(copy), tol(DType::bf16));
}

TEST(CudaOptim, AdamWUnalignedViewsMatchCpu) {
    MF_REQUIRE_GPU();
    check_adamw({DType::f32, DType::f32, 1.0f, 1.0f, 1, 0});
    check_adamw({DType::bf16, DType::bf16, 1.0f, 1.0f, 0, 1});
    check_adamw({DType::bf16, DType::bf16, 0.0f, 1.0f, 2, 0});
}

// norm_sq on the device, read by the kernel: NaN or inf with skip_nonfinite leaves everything;
// inf without it (and without clipping) still updates.
void check_adamw_nonfinite(float norm_sq, bool skip) {
    const int64_t n = 4099;
    OpCheck c;
    const int param = c.rand(DType::f32, {n});
    const int grad = c.rand(DType::bf16, {n});
    const int m = c.rand(DType::f32, {n}, -0.05f, 0.05f);
    const int v = c.rand(DType::f32, {n}, 0.0f, 0.01f);
    const int copy = c.zeros(DType::bf16, {n});
    const int nsq = c.values(DType::f32, {1}, {norm_sq});
    OptimHyper h;
    h.skip_nonfinite = skip;
    h.clip = skip ? 1.0f : 0.0f;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        adamw_op(b, t[size_t(param)], t[size_t(grad)], t[size_t(m)], t[size_t(v)], t[size_t(nsq)], t[size_t(copy)], h);
    });
    for (int i : {param, m, v, copy}) EXPECT_LE(c.rel_err(i), i == copy ? tol(DType::bf16) : 1e-5);
    // The compute copy starts at zero: still all zero exactly when the step was skipped.
    const std::vector<float> z = c.gpu(copy);
    bool all_zero = true;
    for (float x : z) all_zero = all_zero && x == 0.0f;
    EXPECT_EQ(all_zero, skip && !std::isfinite(norm_sq)) << "norm_sq " << norm_sq << " skip " << skip;
}

TEST(CudaOptim, AdamWSkipsNonFiniteSteps) {
    MF_REQUIRE_GPU();
    check_adamw_nonfinite(NAN, true);
    check_adamw_nonfinite(INFINITY, true);
    check_adamw_nonfinite(INFINITY, false);
    check_adamw_nonfinite(4.0f, true);   // finite: the step runs
}

TEST(CudaOptim, AdamWWithoutNormTensor) {
    MF_REQUIRE_GPU();
    const int64_t n = 1000;
    OpCheck c;
    const int param = c.rand(DType::f32, {n});
    const int grad = c.rand(DType::f32, {n});
    const int m = c.zeros(DType::f32, {n});
    const int v = c.zeros(DType::f32, {n});
    OptimHyper h;
    h.clip = 1.0f, h.t = 1;
    c.run([&](Backend & b, const std::vector<Tensor> & t) {
        adamw_op(b, t[size_t(param)], t[size_t(grad)], t[size_t(m)], t[size_t(v)], Tensor{}, Tensor{}, h);
    });
    for (int i : {param, m, v}) EXPECT_LE(c.rel_err(i), 1e-5);
}

// ---- dequantize ---------------------------------------------------------------------------

void check_dequantize(QuantFormat fmt, int64_t out, int64_t in, DType dt) {
    CudaBackend * g = gpu();
    const QuantDesc q{fmt, out, in};
    std::mt19937 rng(uint32_t(out * 131 + in));
    std::normal_distribution<float> nd(0.0f, 0.02f);
    std::vector<float> W(size_t(out * in));
    for (auto & x : W) x = nd(rng);
    for (int64_t k = 0; k < in; ++k) W[size_t(k)] = 0.0f;   // a zero row (zero scales / absmaxes)
    W[size_t(in + 1)] = 0.5f;                                // an outlier
    std::vector<uint8_t> packed(quant_bytes(q));
    CpuBackend cpu;
    cpu.quantize(q, packed.data(), W.data());
    std::vector<float> ref(W.size());
    cpu.dequantize(q, ref.data(), packed.data());

    Tensor pk(-1, DType::u8, {int64_t(packed.size())});
    Tensor w(-1, dt, {out, in});
    pk.data = g->allocator().allocate(pk.nbytes());
    w.data = g->allocator().allocate(w.nbytes());
    g->upload(pk.data, packed.data(), packed.size());
    cuda::dequantize(static_cast<cudaStream_t>(g->stream()), q, w, pk);
    std::vector<uint8_t> got(w.nbytes());
    g->download(got.data(), w.data, got.size());
    g->allocator().release(pk.data, pk.nbytes());
    g->allocator().release(w.data, w.nbytes());

    // The CPU's value rounded to dt; q * s + mean may or may not be an FMA on the host: 1 ulp.
    const double ulp = dt == DType::f32 ? 0x1p-23 : dt == DType::bf16 ? 0x1p-8 : 0x1p-11;
    int64_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        float x = 0, want = ref[i];
        if (dt == DType::f32) std::memcpy(&x, got.data() + 4 * i, 4);
        uint16_t hbits = 0;
        if (dt != DType::f32) std::memcpy(&hbits, got.data() + 2 * i, 2);
        if (dt == DType::bf16) x = bf16_to_f32(hbits), want = bf16_to_f32(f32_to_bf16(want));
        if (dt == DType::f16) x = f16_to_f32(hbits), want = f16_to_f32(f32_to_f16(want));
        if (std::fabs(double(x) - want) > 2 * ulp * std::fabs(double(want)) && bad++ < 5)
            ADD_FAILURE() << quant_format_name(fmt) << " " << dtype_name(dt) << " element " << i << ": " << x
                          << " vs " << want;
    }
    EXPECT_EQ(bad, 0) << quant_format_name(fmt) << " " << dtype_name(dt) << " " << out << "x" << in;
}

TEST(CudaQuant, DequantizeMatchesCpu) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
        check_dequantize(QuantFormat::int8, 96, 200, dt);   // in % 4 == 0: vector path
        check_dequantize(QuantFormat::int8, 37, 101, dt);   // scalar path, unaligned scales
        check_dequantize(QuantFormat::nf4, 48, 72, dt);     // rows straddle the 64-blocks
        check_dequantize(QuantFormat::nf4_dq, 48, 72, dt);
        // 1027 absmax blocks: 5 second-level scales, stored at an odd byte offset.
        check_dequantize(QuantFormat::nf4, 79, 832, dt);
        check_dequantize(QuantFormat::nf4_dq, 79, 832, dt);
        check_dequantize(QuantFormat::sparse24, 48, 72, dt);   // 2:4: the two largest of every four
        check_dequantize(QuantFormat::sparse24, 3, 200, dt);
    }
}

}  // namespace
}  // namespace memfit::test
