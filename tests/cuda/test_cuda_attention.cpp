// CUDA attention kernels against the CPU backend (tests/cuda/op_check.h): the naive attention
// (forward and backward), flash attention (forward and backward; the tensor-core path for
// bf16/f16 at head dims 64 and 128, the CUDA-core path for f32, other head dims and unaligned
// tensors), flash against naive on the GPU, the flash backward's determinism, and attention
// over a KV cache with grouped-query heads.
//
// Bounds: tol(dtype) except where the GPU computes a bf16/f16 result in a different way than
// the CPU, not only in a different order:
//   - flash bf16/f16 dqkv: kTolLowBwd. The tensor-core backward rounds P and dS to bf16/f16 as
//     mma operands (the CPU keeps them fp32), an extra relative error of 2^-9 (bf16) per term;
//     naive bf16 dqkv too: each backend's backward reads its own forward's probabilities,
//     rounded to bf16, which may differ by one ulp (2^-8) where the fp32 values differ slightly;
//   - flash bf16/f16 lse (fp32): kTolLse. Same bf16 products summed in fp32 in another order,
//     exp2 with the scale folded in: far below 1e-4 of max|lse|;
//   - f16 outputs: kTolF16Out. P rounded to f16 for P V adds up to 2^-11 per term, about the
//     size of kTolF16 itself;
//   - flash against naive on the GPU at bf16: the naive backward reads the probabilities
//     rounded to bf16 (att is stored in the compute dtype), the flash one recomputes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "op_check.h"

namespace memfit::test {
namespace {

struct Shape {
    int64_t B, T, NH, hd;
    int64_t C() const { return NH * hd; }
};


// Flash scratch large enough for both backends (each uses its own layout within it).
int64_t flash_scratch_floats(const Shape & s) {
    CpuBackend cpu;
    const size_t bytes = std::max(cpu.flash_attention_workspace(s.B, s.T, s.C(), int(s.NH), DType::bf16),  // >= fp32's
                                  cuda_flash_attention_workspace(s.B, s.T, s.C(), int(s.NH)));
    return int64_t(bytes / sizeof(float)) + 1;
}

TEST(CudaAttention, NaiveForwardBackward) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16})
        for (Shape s : {Shape{2, 100, 3, 64}, Shape{2, 37, 4, 128}, Shape{1, 5, 2, 32}}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B=" << s.B << " T=" << s.T << " NH=" << s.NH
                                            << " hd=" << s.hd);
            const int64_t B = s.B, T = s.T, C = s.C();
            OpCheck op;
            const int qkv = op.rand(dt, {B, T, 3 * C});
            const int out = op.zeros(dt, {B, T, C});
            const int att = op.zeros(dt, {B, s.NH, T, T});
            const int dout = op.rand(dt, {B, T, C});
            const int dqkv = op.zeros(dt, {B, T, 3 * C});
            const int scratch = op.zeros(DType::f32, {B * s.NH * T});
            op.run([&](Backend & be, const std::vector<Tensor> & t) {
                be.attention_fwd(t[out], t[att], t[qkv], int(s.NH));
                be.attention_bwd(t[dqkv], t[scratch], t[dout], t[qkv], t[att], int(s.NH));
            });
            EXPECT_LT(op.rel_err(out), out_tol(dt));
            EXPECT_LT(op.rel_err(att), out_tol(dt));
            EXPECT_LT(op.rel_err(dqkv), bwd_tol(dt));
        }
}

// Flash forward then backward on both backends; offset > 0 views every tensor one element into
// its allocation (unaligned: the CUDA-core path for bf16/f16 too).
void check_flash(DType dt, const Shape & s, int64_t offset = 0) {
    SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B=" << s.B << " T=" << s.T << " NH=" << s.NH << " hd=" << s.hd
                                    << " offset=" << offset);
    const int64_t B = s.B, T = s.T, C = s.C(), NH = s.NH;
    OpCheck op;
    const int qkv = op.rand(dt, {B * T * 3 * C + offset}, -2.0f, 2.0f);  // wider scores: a peakier softmax
    const int out = op.zeros(dt, {B * T * C + offset});
    const int lse = op.zeros(DType::f32, {B * NH * T});
    const int dout = op.rand(dt, {B * T * C + offset});
    const int dqkv = op.zeros(dt, {B * T * 3 * C + offset});
    const int scratch = op.zeros(DType::f32, {flash_scratch_floats(s)});
    op.run([&](Backend & be, const std::vector<Tensor> & t) {
        const Tensor q = t[qkv].view(offset, {B, T, 3 * C}), o = t[out].view(offset, {B, T, C});
        const Tensor g = t[dout].view(offset, {B, T, C}), d = t[dqkv].view(offset, {B, T, 3 * C});
        be.flash_attention_fwd(o, t[lse], q, int(NH));
        be.flash_attention_bwd(d, t[scratch], g, o, q, t[lse], int(NH));
    });
    EXPECT_LT(op.rel_err(out), out_tol(dt));
    EXPECT_LT(op.rel_err(lse), dt == DType::f32 ? tol(dt) : kTolLse);
    EXPECT_LT(op.rel_err(dqkv), bwd_tol(dt));
}

TEST(CudaAttention, FlashF32) {
    MF_REQUIRE_GPU();
    for (Shape s : {Shape{2, 100, 3, 64}, Shape{2, 256, 4, 64}, Shape{2, 100, 3, 128}, Shape{2, 256, 4, 128},
                    Shape{2, 70, 3, 32}, Shape{1, 50, 2, 96}, Shape{1, 1, 2, 64}})
        check_flash(DType::f32, s);
}

TEST(CudaAttention, FlashBf16) {
    MF_REQUIRE_GPU();
    for (Shape s : {Shape{2, 100, 3, 64}, Shape{2, 256, 4, 64}, Shape{2, 100, 3, 128}, Shape{2, 256, 4, 128},
                    Shape{1, 1, 2, 64}, Shape{2, 65, 3, 128}})
        check_flash(DType::bf16, s);
    check_flash(DType::bf16, Shape{2, 100, 3, 32});      // CUDA-core path: head dim without mma
    check_flash(DType::bf16, Shape{2, 100, 3, 64}, 1);   // CUDA-core path: unaligned tensors
}

TEST(CudaAttention, FlashF16) {
    MF_REQUIRE_GPU();
    for (Shape s : {Shape{2, 100, 3, 64}, Shape{2, 256, 4, 128}}) check_flash(DType::f16, s);
}

// On the GPU alone: flash and naive attention agree, and the flash backward gives equal bits
// when run twice.
TEST(CudaAttention, FlashMatchesNaiveAndIsDeterministic) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16})
        for (Shape s : {Shape{2, 100, 3, 64}, Shape{2, 130, 2, 128}}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T=" << s.T << " hd=" << s.hd);
            const int64_t B = s.B, T = s.T, C = s.C(), NH = s.NH;
            OpCheck op;
            const int qkv = op.rand(dt, {B, T, 3 * C});
            const int dout = op.rand(dt, {B, T, C});
            const int out_n = op.zeros(dt, {B, T, C}), att = op.zeros(dt, {B, NH, T, T});
            const int dq_n = op.zeros(dt, {B, T, 3 * C}), scr_n = op.zeros(DType::f32, {B * NH * T});
            const int out_f = op.zeros(dt, {B, T, C}), lse = op.zeros(DType::f32, {B, NH, T});
            const int dq_f = op.zeros(dt, {B, T, 3 * C}), dq_f2 = op.zeros(dt, {B, T, 3 * C});
            const int scr_f = op.zeros(DType::f32, {flash_scratch_floats(s)});
            op.run([&](Backend & be, const std::vector<Tensor> & t) {
                be.attention_fwd(t[out_n], t[att], t[qkv], int(NH));
                be.attention_bwd(t[dq_n], t[scr_n], t[dout], t[qkv], t[att], int(NH));
                be.flash_attention_fwd(t[out_f], t[lse], t[qkv], int(NH));
                be.flash_attention_bwd(t[dq_f], t[scr_f], t[dout], t[out_f], t[qkv], t[lse], int(NH));
                be.flash_attention_bwd(t[dq_f2], t[scr_f], t[dout], t[out_f], t[qkv], t[lse], int(NH));
            });
            EXPECT_LT(rel(op.gpu(out_n), op.gpu(out_f)), out_tol(dt));
            EXPECT_LT(rel(op.gpu(dq_n), op.gpu(dq_f)), bwd_tol(dt));
            EXPECT_EQ(op.gpu(dq_f), op.gpu(dq_f2));
        }
}

TEST(CudaAttention, CachedGroupedQuery) {
    MF_REQUIRE_GPU();
    // window > 0: a sliding window's rolling cache (position p in row p % cap), wrapping or not.
    struct Case { int64_t B, Tn, pos0, cap, NH, KVH, hd, window = 0; };
    for (DType dt : {DType::f32, DType::bf16})
        for (Case c : {Case{2, 5, 17, 40, 4, 2, 64}, Case{2, 1, 30, 32, 6, 2, 128}, Case{1, 8, 0, 8, 4, 1, 64},
                       Case{2, 3, 9, 16, 3, 3, 32}, Case{2, 4, 37, 12, 4, 2, 64, 9}, Case{1, 1, 100, 7, 2, 1, 32, 7},
                       Case{2, 6, 3, 16, 4, 2, 64, 5}}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " Tn=" << c.Tn << " pos0=" << c.pos0 << " NH=" << c.NH
                                            << " KVH=" << c.KVH << " hd=" << c.hd << " window=" << c.window);
            OpCheck op;
            const int qkv = op.rand(dt, {c.B, c.Tn, (c.NH + 2 * c.KVH) * c.hd});
            const int kc = op.rand(dt, {c.B, c.cap, c.KVH * c.hd});
            const int vc = op.rand(dt, {c.B, c.cap, c.KVH * c.hd});
            const int out = op.zeros(dt, {c.B, c.Tn, c.NH * c.hd});
            op.run([&](Backend & be, const std::vector<Tensor> & t) {
                be.cached_attention_fwd(t[out], t[qkv], t[kc], t[vc], int(c.pos0), int(c.NH), int(c.KVH),
                                        int(c.window));
            });
            EXPECT_LT(op.rel_err(out), out_tol(dt));
            EXPECT_EQ(op.rel_err(kc), 0.0);
            EXPECT_EQ(op.rel_err(vc), 0.0);
        }
}

// A paged step: rows of three sequences (a prompt chunk, single decode tokens, padding rows),
// their blocks scattered over the pool, with and without a sliding window; the pools' written
// rows and every output equal the CPU's.
TEST(CudaAttention, PagedGroupedQuery) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16})
        for (const int window : {0, 6})
            for (const bool int8 : {false, true}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " window=" << window << (int8 ? " int8" : ""));
            PagedKv kv;
            kv.block = 4, kv.blocks = 20, kv.seqs = 8, kv.max_blocks = 6, kv.tokens = 16, kv.int8 = int8;
            const int64_t NH = 4, KVH = 2, hd = 32, n = 16;
            // Row i: sequence and position; 5 rows of slot 2 (positions 7..11), slot 5 at 19, slot 0 at 3.
            std::vector<float> meta(size_t(kv.meta_words()), -1.0f);
            auto set = [&](int i, int seq, int pos) {
                meta[size_t(kv.seq_at() + i)] = float(seq);
                meta[size_t(kv.pos_at() + i)] = float(pos);
                meta[size_t(kv.doc_at() + i)] = float(i - pos);
            };
            for (int i = 0; i < n; ++i) set(i, -1, 0);
            for (int i = 0; i < 5; ++i) set(i, 2, 7 + i);
            set(5, 5, 19);
            set(6, 0, 3);
            const int tables[3][6] = {{13, -1, -1, -1, -1, -1}, {4, 17, 9, 0, -1, -1}, {2, 11, 6, 15, 19, -1}};
            const int slots[3] = {0, 2, 5};
            for (int q = 0; q < 3; ++q)
                for (int j = 0; j < kv.max_blocks; ++j)
                    meta[size_t(kv.table_at() + slots[q] * kv.max_blocks + j)] = float(tables[q][j]);
            OpCheck op;
            const int qkv = op.rand(dt, {1, n, (NH + 2 * KVH) * hd});
            // int8 pools (bytes: codes, then a scale per KV head) start zero: unwritten keys score 0.
            const int64_t width = int8 ? KVH * hd + 4 * KVH : KVH * hd;
            const int kp = int8 ? op.zeros(DType::u8, {kv.pool_rows(), width}) : op.rand(dt, {kv.pool_rows(), width});
            const int vp = int8 ? op.zeros(DType::u8, {kv.pool_rows(), width}) : op.rand(dt, {kv.pool_rows(), width});
            const int m = op.values(DType::i32, {kv.meta_words()}, meta);
            const int out = op.zeros(dt, {1, n, NH * hd});
            op.run([&](Backend & be, const std::vector<Tensor> & t) {
                be.paged_attention_fwd(t[out], t[qkv], t[kp], t[vp], t[m], kv, int(NH), int(KVH), window);
            });
            EXPECT_LT(op.rel_err(out), out_tol(dt));
            EXPECT_EQ(op.rel_err(kp), 0.0);
            EXPECT_EQ(op.rel_err(vp), 0.0);
            const std::vector<float> o = op.gpu(out);
            for (int64_t i = 7 * NH * hd; i < n * NH * hd; ++i) ASSERT_EQ(o[size_t(i)], 0.0f) << "padding row output";
        }
}

}  // namespace
}  // namespace memfit::test
