// Context parallelism's attention kernels (kernel_list.h's cp_attention_fwd / _bwd) on the GPU
// against the CPU backend (tests/cuda/op_check.h): rank 1 of 2 in the mirrored layout (chunks 1
// and 2 of 4), grouped KV heads, one document per row and packed documents; and on the CPU,
// against flash attention over the whole sequence for the rows a rank holds.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/context_parallel.h"
#include "op_check.h"

namespace memfit::test {
namespace {

// meta [2,B,Tl] of rank `cp.rank`: positions, first keys (documents of `doc` positions, 0: none).
std::vector<float> cp_meta(const ContextParallel & cp, int B, int T, int doc) {
    const int Tl = T / cp.ranks;
    std::vector<float> m(size_t(2 * B * Tl));
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tl; ++t) {
            const int pos = cp.position(t, T);
            m[size_t(b * Tl + t)] = float(pos);
            m[size_t(B * Tl + b * Tl + t)] = float(doc > 0 ? pos / doc * doc : 0);
        }
    return m;
}

TEST(CudaContextParallel, AttentionMatchesTheCpu) {
    MF_REQUIRE_GPU();
    const ContextParallel cp{2, 1};
    for (DType dt : {DType::f32, DType::bf16})
        for (const int doc : {0, 7}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " documents of " << doc);
            const int64_t B = 2, T = 24, Tl = T / cp.ranks, NH = 4, KVH = 2, hd = 32;
            OpCheck op;
            const int qkv = op.rand(dt, {B, Tl, (NH + 2 * KVH) * hd});
            const int kv = op.rand(dt, {B, T, 2 * KVH * hd});
            const int meta = op.values(DType::i32, {2, B, Tl}, cp_meta(cp, int(B), int(T), doc));
            const int out = op.zeros(dt, {B, Tl, NH * hd});
            const int lse = op.zeros(DType::f32, {B, NH, Tl});
            const int dout = op.rand(dt, {B, Tl, NH * hd});
            const int dqkv = op.rand(dt, {B, Tl, (NH + 2 * KVH) * hd});   // k, v columns must come back zero
            const int dkv = op.rand(dt, {B, T, 2 * KVH * hd});
            const int scratch = op.zeros(DType::f32, {B * Tl * NH});
            op.run([&](Backend & be, const std::vector<Tensor> & t) {
                be.cp_attention_fwd(t[out], t[lse], t[qkv], t[kv], t[meta], int(NH), int(KVH));
                be.cp_attention_bwd(t[dqkv], t[dkv], t[scratch], t[dout], t[out], t[qkv], t[kv], t[lse], t[meta],
                                    int(NH), int(KVH));
            });
            EXPECT_LT(op.rel_err(out), out_tol(dt));
            EXPECT_LT(op.rel_err(lse), kTolLse);
            EXPECT_LT(op.rel_err(dqkv), bwd_tol(dt));
            EXPECT_LT(op.rel_err(dkv), bwd_tol(dt));
            const std::vector<float> g = op.gpu(dqkv);
            for (int64_t r = 0; r < B * Tl; ++r)
                for (int64_t i = NH * hd; i < (NH + 2 * KVH) * hd; ++i)
                    ASSERT_EQ(g[size_t(r * (NH + 2 * KVH) * hd + i)], 0.0f) << "a k or v column of dqkv";
        }
}

// The ring's block kernels: rank 1 of 2 attending to rank 0's block (merged into accumulators
// that hold its own block's attention), the block's backward added into dq and its dk | dv, and
// the fp32 gradients written into dqkv.
TEST(CudaContextParallel, RingBlocksMatchTheCpu) {
    MF_REQUIRE_GPU();
    const ContextParallel cp{2, 1}, other{2, 0};
    for (DType dt : {DType::f32, DType::bf16})
        for (const bool first : {true, false}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << (first ? " first block" : " merged"));
            const int64_t B = 2, T = 24, Tl = T / cp.ranks, NH = 4, KVH = 2, hd = 32;
            std::vector<float> kpos(static_cast<size_t>(Tl));
            for (int t = 0; t < Tl; ++t) kpos[size_t(t)] = float(other.position(t, int(T)));
            OpCheck op;
            const int qkv = op.rand(dt, {B, Tl, (NH + 2 * KVH) * hd});
            const int kv = op.rand(dt, {B, Tl, 2 * KVH * hd});
            const int kp = op.values(DType::i32, {Tl}, kpos);
            const int meta = op.values(DType::i32, {2, B, Tl}, cp_meta(cp, int(B), int(T), 7));
            const int acc = op.rand(DType::f32, {B, Tl, NH * hd});
            const int lse = op.rand(DType::f32, {B, NH, Tl}, 1.0f, 3.0f);
            const int out = op.rand(dt, {B, Tl, NH * hd});
            const int dout = op.rand(dt, {B, Tl, NH * hd});
            const int dq = op.rand(DType::f32, {B, Tl, NH * hd});
            const int dkv = op.rand(DType::f32, {B, Tl, 2 * KVH * hd});
            const int scratch = op.zeros(DType::f32, {B * Tl * NH});
            const int dqkv = op.zeros(dt, {B, Tl, (NH + 2 * KVH) * hd});
            op.run([&](Backend & be, const std::vector<Tensor> & t) {
                be.cp_block_bwd(t[dq], t[dkv], t[scratch], t[dout], t[out], t[qkv], t[kv], t[lse], t[kp], t[meta],
                                int(NH), int(KVH));
                be.cp_qkv_grad(t[dqkv], t[dq], t[dkv], int(NH), int(KVH));
                be.cp_block_fwd(t[acc], t[lse], t[qkv], t[kv], t[kp], t[meta], int(NH), int(KVH), first);
            });
            EXPECT_LT(op.rel_err(acc), kTolF32 * 10);
            EXPECT_LT(op.rel_err(lse), kTolLse);
            EXPECT_LT(op.rel_err(dq), kTolF32 * 10);
            EXPECT_LT(op.rel_err(dkv), kTolF32 * 10);
            EXPECT_LT(op.rel_err(dqkv), tol(dt));
        }
}

// The embedding under context parallelism: a rank's rows hold positions past its T (its later
// chunk), given as doc_start = t - position; the learned positions' gradient lands on those rows.
TEST(CudaContextParallel, PositionsPastTheRowsLength) {
    MF_REQUIRE_GPU();
    const ContextParallel cp{2, 0};
    const int64_t B = 2, T = 8, whole = 16, C = 32, V = 40;
    std::vector<float> ds(size_t(B * T));
    for (int64_t i = 0; i < B * T; ++i) ds[size_t(i)] = float(i % T - cp.position(int(i % T), int(whole)));
    OpCheck op;
    const int tokens = op.ints({B, T}, 0, int(V));
    const int doc = op.values(DType::i32, {B, T}, ds);
    const int wte = op.rand(DType::f32, {V, C});
    const int wpe = op.rand(DType::f32, {whole, C});
    const int out = op.zeros(DType::f32, {B, T, C});
    const int dout = op.rand(DType::f32, {B, T, C});
    const int dwte = op.zeros(DType::f32, {V, C});
    const int dwpe = op.zeros(DType::f32, {whole, C});
    op.run([&](Backend & be, const std::vector<Tensor> & t) {
        be.encoder_fwd(t[out], t[tokens], t[wte], t[wpe], t[doc]);
        be.encoder_bwd(t[dwte], t[dwpe], t[dout], t[tokens], t[doc]);
    });
    EXPECT_LT(op.rel_err(out), kTolF32);
    EXPECT_LT(op.rel_err(dwte), kTolF32);
    EXPECT_LT(op.rel_err(dwpe), kTolF32);
    const std::vector<float> g = op.gpu(dwpe);
    double later = 0;   // rank 0's later chunk: positions 12 .. 15
    for (int64_t i = 12 * C; i < whole * C; ++i) later += std::fabs(g[size_t(i)]);
    EXPECT_GT(later, 0.0);
}

}  // namespace
}  // namespace memfit::test
