// Packed documents (doc_start, backend/backend.h) in the CUDA kernels, against the CPU backend
// (tests/cuda/op_check.h) with the same doc_start: flash attention forward and backward (the
// tensor-core path for bf16/f16 at head dims 64 and 128, the CUDA-core path for f32, head dims
// 32 and 96 and unaligned tensors), also against the CPU's naive attention; the naive attention;
// RoPE; the GPT-2 encoder and its backward (dwpe's colliding rows summed in the CPU's order: bit
// for bit). Layouts as tests/backend/test_kernels_documents.cpp's: documents crossing 64-key (and
// 16/32-row) tiles, of one token, starting on a tile boundary, whole rows.
//
// Every check also asks that the result be far from what ignoring doc_start gives (the CPU
// backend run without it, on the CPU only), so that a kernel dropping the documents fails here
// (not the naive backward: its mask is in the saved probabilities, and given them it computes
// the same with or without doc_start). The flash backward run twice gives the same bits. A
// doc_start of zeros (one document per row, given explicitly) must give the bits of no doc_start
// at all: the masks and skips are then no-ops. (The skipped tile pairs and queries would add
// exact zeros: skipping them is for speed, which no output shows.)
//
// Bounds are test_cuda_attention.cpp's (its comment says why bf16/f16 need more than tol()).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "op_check.h"

namespace memfit::test {
namespace {

using Ts = std::vector<Tensor>;
// What ignoring doc_start must at least change (relative, as rel()): well above every bound.
constexpr double kIgnored = 0.1;


bool on_cpu(Backend & be) { return dynamic_cast<CpuBackend *>(&be) != nullptr; }

// Documents of the given lengths, one after the other in each row (a row's lengths sum to T).
// With a sliding window W, each token's attention start instead: max(t - W + 1, its document's).
struct Layout {
    int64_t T = 0;
    std::vector<std::vector<int>> rows;   // per row: document lengths
    int window = 0;                       // sliding window (0: none)
    int64_t B() const { return int64_t(rows.size()); }
    std::vector<float> starts() const {   // doc_start, as OpCheck::values takes it
        std::vector<float> s;
        for (const auto & r : rows) {
            int at = 0;
            for (const int len : r) {
                for (int i = 0; i < len; ++i) {
                    const int t = int(s.size() % size_t(T));
                    s.push_back(float(window > 0 ? std::max(at, t - window + 1) : at));
                }
                at += len;
            }
            EXPECT_EQ(at, T);
        }
        return s;
    }
    std::string str() const {
        std::string s = "T=" + std::to_string(T) + " W=" + std::to_string(window) + " {";
        for (const auto & r : rows) {
            s += "{";
            for (const int len : r) s += std::to_string(len) + ",";
            s += "}";
        }
        return s + "}";
    }
};

// test_kernels_documents.cpp's, and one whose documents start on 16- and 32-row tiles and end
// one row before a 64-row tile.
const Layout kLayouts[] = {
    {7, {{3, 4}, {1, 1, 5}}},
    {130, {{64, 66}, {1, 70, 1, 58}, {130}}},
    {200, {{10, 54, 64, 1, 71}, {150, 50}}},
    {97, {{97}, {33, 33, 31}}},
    {96, {{16, 16, 32, 31, 1}}},
};

// Documents of lengths cycling through 1 .. 97 over B rows of T (the last one cut at the row's end).
Layout long_layout(int64_t B, int64_t T) {
    Layout L{T, {}};
    int len = 1;
    for (int64_t b = 0; b < B; ++b) {
        L.rows.emplace_back();
        for (int64_t at = 0; at < T; at += L.rows.back().back()) {
            L.rows.back().push_back(int(std::min<int64_t>(len, T - at)));
            len = len % 97 + 1;
        }
    }
    return L;
}

// Flash scratch large enough for both backends (each uses its own layout within it).
int64_t flash_scratch_floats(int64_t B, int64_t T, int64_t C, int64_t NH) {
    CpuBackend cpu;
    const size_t bytes = std::max(cpu.flash_attention_workspace(B, T, C, int(NH), DType::bf16),  // >= fp32's
                                  cuda_flash_attention_workspace(B, T, C, int(NH)));
    return int64_t(bytes / sizeof(float)) + 1;
}

// Flash forward then backward with the documents on both backends, against each other and
// against the CPU's naive attention; offset > 0 views every tensor one element into its
// allocation (unaligned: the CUDA-core path for bf16/f16 too).
void check_flash(DType dt, const Layout & L, int64_t NH, int64_t hd, int64_t offset = 0) {
    SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << L.str() << " NH=" << NH << " hd=" << hd
                                    << " offset=" << offset);
    const int64_t B = L.B(), T = L.T, C = NH * hd;
    OpCheck op;
    const int qkv = op.rand(dt, {B * T * 3 * C + offset}, -2.0f, 2.0f);   // a peakier softmax
    const int out = op.zeros(dt, {B * T * C + offset});
    const int lse = op.zeros(DType::f32, {B * NH * T});
    const int dout = op.rand(dt, {B * T * C + offset});
    const int dqkv = op.zeros(dt, {B * T * 3 * C + offset});
    const int scratch = op.zeros(DType::f32, {flash_scratch_floats(B, T, C, NH)});
    const int ds = op.values(DType::i32, {B, T}, L.starts());
    // CPU only: the naive attention with the documents; flash without them (the forward, and the
    // backward from the forward with them).
    const int out_n = op.zeros(dt, {B, T, C}), att = op.zeros(dt, {B, NH, T, T});
    const int dq_n = op.zeros(dt, {B, T, 3 * C}), scr_n = op.zeros(DType::f32, {B * NH * T});
    const int out_x = op.zeros(dt, {B, T, C}), lse_x = op.zeros(DType::f32, {B * NH * T});
    const int dq_x = op.zeros(dt, {B, T, 3 * C});
    const int dq_2 = op.zeros(dt, {B * T * 3 * C + offset});   // GPU only: the backward again
    op.run([&](Backend & be, const Ts & t) {
        const Tensor q = t[qkv].view(offset, {B, T, 3 * C}), o = t[out].view(offset, {B, T, C});
        const Tensor g = t[dout].view(offset, {B, T, C}), d = t[dqkv].view(offset, {B, T, 3 * C});
        be.flash_attention_fwd(o, t[lse], q, int(NH), t[ds]);
        be.flash_attention_bwd(d, t[scratch], g, o, q, t[lse], int(NH), t[ds]);
        if (!on_cpu(be)) {
            be.flash_attention_bwd(t[dq_2].view(offset, {B, T, 3 * C}), t[scratch], g, o, q, t[lse], int(NH), t[ds]);
            return;
        }
        be.attention_fwd(t[out_n], t[att], q, int(NH), t[ds]);
        be.attention_bwd(t[dq_n], t[scr_n], g, q, t[att], int(NH), t[ds]);
        be.flash_attention_fwd(t[out_x], t[lse_x], q, int(NH));
        be.flash_attention_bwd(t[dq_x], t[scratch], g, o, q, t[lse], int(NH));
    });
    EXPECT_LT(op.rel_err(out), out_tol(dt));
    EXPECT_LT(op.rel_err(lse), dt == DType::f32 ? tol(dt) : kTolLse);
    EXPECT_LT(op.rel_err(dqkv), bwd_tol(dt));
    auto body = [&](int i, int64_t width) {   // the tensor without its offset element
        std::vector<float> v = op.gpu(i);
        return std::vector<float>(v.begin() + offset, v.begin() + offset + B * T * width);
    };
    EXPECT_LT(rel(op.cpu(out_n), body(out, C)), out_tol(dt)) << "against the CPU's naive attention";
    EXPECT_LT(rel(op.cpu(dq_n), body(dqkv, 3 * C)), bwd_tol(dt)) << "against the CPU's naive attention";
    EXPECT_GT(rel(op.cpu(out_x), body(out, C)), kIgnored) << "the documents make no difference";
    EXPECT_GT(rel(op.cpu(dq_x), body(dqkv, 3 * C)), kIgnored) << "the documents make no difference";
    EXPECT_EQ(op.gpu(dqkv), op.gpu(dq_2)) << "the backward is not deterministic";
}

TEST(CudaDocuments, FlashF32) {
    MF_REQUIRE_GPU();
    for (const Layout & L : kLayouts)
        for (int64_t hd : {32, 64, 96, 128}) check_flash(DType::f32, L, 2, hd);
    for (int64_t hd : {32, 128}) check_flash(DType::f32, long_layout(2, 300), 1, hd);   // many short documents
}

TEST(CudaDocuments, FlashBf16) {
    MF_REQUIRE_GPU();
    for (const Layout & L : kLayouts)
        for (int64_t hd : {64, 128}) check_flash(DType::bf16, L, 2, hd);   // tensor cores
    for (int64_t hd : {64, 128}) check_flash(DType::bf16, long_layout(2, 300), 1, hd);
    for (const Layout & L : kLayouts) {
        check_flash(DType::bf16, L, 2, 32);       // CUDA-core path: head dim without mma
        check_flash(DType::bf16, L, 2, 64, 1);    // CUDA-core path: unaligned tensors
    }
}

// Sliding-window attention: the kernels take each query's first key where they take document
// starts (max(t - W + 1, the document's)): windows of one key, inside a 64-key tile, of a whole
// tile, crossing tiles, with documents; every head dimension the flash kernels take.
TEST(CudaDocuments, SlidingWindowFlash) {
    MF_REQUIRE_GPU();
    const Layout windows[] = {{130, {{130}, {64, 66}}, 1}, {130, {{130}, {1, 70, 1, 58}}, 5},
                              {200, {{200}, {10, 54, 64, 1, 71}}, 64}, {97, {{97}, {33, 33, 31}}, 40}};
    for (const Layout & L : windows) {
        for (int64_t hd : {32, 64, 96, 128}) check_flash(DType::f32, L, 2, hd);
        for (int64_t hd : {64, 128}) check_flash(DType::bf16, L, 2, hd);
    }
}

TEST(CudaDocuments, FlashF16) {
    MF_REQUIRE_GPU();
    for (const Layout & L : kLayouts)
        for (int64_t hd : {64, 128}) check_flash(DType::f16, L, 2, hd);
    check_flash(DType::f16, kLayouts[2], 2, 96);   // CUDA-core path
}

// The saved probabilities are 0 outside a query's document's keys, on the GPU exactly.
TEST(CudaDocuments, NaiveAttention) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
        for (const Layout & L : kLayouts)
            for (int64_t hd : {64, 32}) {
                if (hd == 32 && dt != DType::f32) continue;
                const int64_t NH = hd == 64 ? 2 : 3, B = L.B(), T = L.T, C = NH * hd;
                SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << L.str() << " NH=" << NH << " hd=" << hd);
                OpCheck op;
                const int qkv = op.rand(dt, {B, T, 3 * C}, -2.0f, 2.0f);
                const int out = op.zeros(dt, {B, T, C});
                const int att = op.zeros(dt, {B, NH, T, T});
                const int dout = op.rand(dt, {B, T, C});
                const int dqkv = op.zeros(dt, {B, T, 3 * C});
                const int scratch = op.zeros(DType::f32, {B * NH * T});
                const int ds = op.values(DType::i32, {B, T}, L.starts());
                const int out_x = op.zeros(dt, {B, T, C}), att_x = op.zeros(dt, {B, NH, T, T});
                op.run([&](Backend & be, const Ts & t) {
                    be.attention_fwd(t[out], t[att], t[qkv], int(NH), t[ds]);
                    be.attention_bwd(t[dqkv], t[scratch], t[dout], t[qkv], t[att], int(NH), t[ds]);
                    if (on_cpu(be)) be.attention_fwd(t[out_x], t[att_x], t[qkv], int(NH));
                });
                EXPECT_LT(op.rel_err(out), out_tol(dt));
                EXPECT_LT(op.rel_err(att), out_tol(dt));
                EXPECT_LT(op.rel_err(dqkv), bwd_tol(dt));
                EXPECT_GT(rel(op.cpu(out_x), op.gpu(out)), kIgnored) << "the documents make no difference";
                // (The backward given these probabilities, 0 outside the documents, gives the same
                // gradients with or without doc_start: the mask is in att.)
                const std::vector<float> a = op.gpu(att), starts = L.starts();
                int64_t outside = 0;
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t h = 0; h < NH; ++h)
                        for (int64_t i = 0; i < T; ++i)
                            for (int64_t j = 0; j < T; ++j)
                                if (j < int64_t(starts[size_t(b * T + i)]) || j > i)
                                    outside += a[size_t(((b * NH + h) * T + i) * T + j)] != 0.0f;
                EXPECT_EQ(outside, 0) << "probabilities outside the documents";
            }
}

// Small heads, and hd = 128 (a whole block of angle pairs).
TEST(CudaDocuments, Rope) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
        for (const Layout & L : kLayouts)
            for (auto [NH, KVH, hd] : {std::array<int, 3>{4, 2, 16}, {2, 1, 128}}) {
                SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << L.str() << " hd=" << hd);
                const int64_t B = L.B(), T = L.T, W = int64_t(NH + 2 * KVH) * hd;
                OpCheck op;
                const int qkv = op.rand(dt, {B, T, W});
                const int dqkv = op.rand(dt, {B, T, W});
                const int ds = op.values(DType::i32, {B, T}, L.starts());
                const int x = op.zeros(dt, {B, T, W}), dx = op.zeros(dt, {B, T, W});   // CPU only
                op.run([&](Backend & be, const Ts & t) {
                    if (on_cpu(be)) {   // first: the inputs, rotated without the documents
                        be.copy(t[x], t[qkv]);
                        be.copy(t[dx], t[dqkv]);
                        be.rope_fwd(t[x], NH, KVH, 10000.0f, 0);
                        be.rope_bwd(t[dx], NH, KVH, 500000.0f, 0);
                    }
                    be.rope_fwd(t[qkv], NH, KVH, 10000.0f, 0, t[ds]);
                    be.rope_bwd(t[dqkv], NH, KVH, 500000.0f, 0, t[ds]);
                });
                EXPECT_LT(op.rel_err(qkv), tol(dt));
                EXPECT_LT(op.rel_err(dqkv), tol(dt));
                EXPECT_GT(rel(op.cpu(x), op.gpu(qkv)), kIgnored) << "the documents make no difference";
                EXPECT_GT(rel(op.cpu(dx), op.gpu(dqkv)), kIgnored) << "the documents make no difference";
            }
}

// Positions restart at each document: the same bits as the CPU.
TEST(CudaDocuments, EncoderForward) {
    MF_REQUIRE_GPU();
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
        for (const Layout & L : kLayouts)
            for (int64_t C : {37, 40}) {
                SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << L.str() << " C=" << C);
                const int64_t B = L.B(), T = L.T, V = 11;
                OpCheck op;
                const int out = op.zeros(dt, {B, T, C});
                const int tok = op.ints({B, T}, 0, int(V));
                const int wte = op.rand(dt, {V, C});
                const int wpe = op.rand(dt, {T, C});
                const int ds = op.values(DType::i32, {B, T}, L.starts());
                const int out_x = op.zeros(dt, {B, T, C});
                op.run([&](Backend & be, const Ts & t) {
                    be.encoder_fwd(t[out], t[tok], t[wte], t[wpe], t[ds]);
                    if (on_cpu(be)) be.encoder_fwd(t[out_x], t[tok], t[wte], t[wpe]);
                });
                EXPECT_EQ(mismatches(op, out), 0);
                EXPECT_GT(rel(op.cpu(out_x), op.gpu(out)), kIgnored) << "the documents make no difference";
            }
}

// dwte and dwpe each f32, the compute dtype or absent; dwpe's rows collide (positions repeat
// within a row) and are summed as the CPU sums them: bit for bit. N = 5000 rows (dwpe alone)
// spans two scan chunks of the table-gradient kernel.
TEST(CudaDocuments, EncoderBackward) {
    MF_REQUIRE_GPU();
    std::vector<Layout> layouts(std::begin(kLayouts), std::end(kLayouts));
    layouts.push_back(long_layout(2, 2500));
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
        for (int ge = 0; ge < 3; ++ge)
            for (int gp = 0; gp < 3; ++gp)
                for (const Layout & L : layouts) {
                    const DType gts[] = {DType::f32, dt, DType::f32};   // index 2: invalid
                    SCOPED_TRACE(testing::Message() << dtype_name(dt) << " dwte "
                                                    << (ge == 2 ? "none" : dtype_name(gts[ge])) << " dwpe "
                                                    << (gp == 2 ? "none" : dtype_name(gts[gp])) << " "
                                                    << (L.T > 1000 ? "long" : L.str()));
                    if (L.T > 1000 && ge != 2) continue;   // dwte's kernel is the one without documents
                    const int64_t B = L.B(), T = L.T, C = 24, V = 11;
                    OpCheck op;
                    const int dwte = op.rand(gts[ge], {V, C});
                    const int dwpe = op.rand(gts[gp], {T, C});
                    const int dout = op.rand(dt, {B, T, C});
                    const int tok = op.ints({B, T}, 0, int(V));
                    const int ds = op.values(DType::i32, {B, T}, L.starts());
                    const int dwpe_x = op.rand(gts[gp], {T, C});   // CPU only, without the documents
                    op.run([&](Backend & be, const Ts & t) {
                        be.encoder_bwd(ge == 2 ? Tensor{} : t[dwte], gp == 2 ? Tensor{} : t[dwpe], t[dout], t[tok],
                                       t[ds]);
                        if (on_cpu(be) && gp != 2) be.encoder_bwd(Tensor{}, t[dwpe_x], t[dout], t[tok]);
                    });
                    EXPECT_EQ(mismatches(op, dwte), 0);
                    EXPECT_EQ(mismatches(op, dwpe), 0);
                    if (gp != 2) {
                        // dwpe - its start value, with and without the documents
                        const std::vector<float> x = op.cpu(dwpe_x), g = op.gpu(dwpe);
                        double diff = 0, ref = 0;
                        for (size_t i = 0; i < x.size(); ++i) {
                            diff = std::max(diff, double(std::fabs(x[i] - g[i])));
                            ref = std::max(ref, double(std::fabs(x[i])));
                        }
                        EXPECT_GT(diff / ref, kIgnored) << "the documents make no difference";
                    }
                }
}

// doc_start all zeros is one document per row: on the GPU, the same bits as no doc_start, for
// every kernel (flash on both paths, naive, RoPE, the encoder and its backward).
TEST(CudaDocuments, ZeroDocStartIsBitwiseNoDocuments) {
    MF_REQUIRE_GPU();
    struct Case { DType dt; int64_t hd; };
    for (Case c : {Case{DType::f32, 32}, Case{DType::bf16, 64}, Case{DType::f16, 128}, Case{DType::bf16, 96}}) {
        SCOPED_TRACE(testing::Message() << dtype_name(c.dt) << " hd=" << c.hd);
        const DType dt = c.dt;
        const int64_t B = 2, T = 150, NH = 2, C = NH * c.hd, W = 3 * C, V = 11;
        OpCheck op;
        const int zeros = op.zeros(DType::i32, {B, T});
        const int qkv = op.rand(dt, {B, T, 3 * C}, -2.0f, 2.0f);
        const int dout = op.rand(dt, {B, T, C});
        const int scratch = op.zeros(DType::f32, {flash_scratch_floats(B, T, C, NH)});
        int o[2], l[2], d[2], on[2], a[2], dn[2], r[2], e[2], gw[2], gp[2];
        for (int k = 0; k < 2; ++k) {
            o[k] = op.zeros(dt, {B, T, C});
            l[k] = op.zeros(DType::f32, {B, NH, T});
            d[k] = op.zeros(dt, {B, T, 3 * C});
            on[k] = op.zeros(dt, {B, T, C});
            a[k] = op.zeros(dt, {B, NH, T, T});
            dn[k] = op.zeros(dt, {B, T, 3 * C});
            r[k] = op.zeros(dt, {B, T, W});
            e[k] = op.zeros(dt, {B, T, C});
            gw[k] = op.zeros(DType::f32, {V, C});
            gp[k] = op.zeros(dt, {T, C});
        }
        const int tok = op.ints({B, T}, 0, int(V));
        const int wte = op.rand(dt, {V, C});
        const int wpe = op.rand(dt, {T, C});
        op.run([&](Backend & be, const Ts & t) {
            if (on_cpu(be)) return;
            for (int k = 0; k < 2; ++k) {
                const Tensor ds = k ? t[zeros] : Tensor{};
                be.flash_attention_fwd(t[o[k]], t[l[k]], t[qkv], int(NH), ds);
                be.flash_attention_bwd(t[d[k]], t[scratch], t[dout], t[o[k]], t[qkv], t[l[k]], int(NH), ds);
                be.attention_fwd(t[on[k]], t[a[k]], t[qkv], int(NH), ds);
                be.attention_bwd(t[dn[k]], t[scratch], t[dout], t[qkv], t[a[k]], int(NH), ds);
                be.copy(t[r[k]], t[qkv]);
                be.rope_fwd(t[r[k]], int(NH), int(NH), 10000.0f, 0, ds);
                be.rope_bwd(t[r[k]], int(NH), int(NH), 10000.0f, 0, ds);
                be.encoder_fwd(t[e[k]], t[tok], t[wte], t[wpe], ds);
                be.encoder_bwd(t[gw[k]], t[gp[k]], t[dout], t[tok], ds);
            }
        });
        const char * what[] = {"flash out", "lse", "flash dqkv", "naive out", "att", "naive dqkv", "rope",
                               "encoder out", "dwte", "dwpe"};
        int i = 0;
        for (const int * x : {o, l, d, on, a, dn, r, e, gw, gp}) EXPECT_EQ(op.gpu(x[0]), op.gpu(x[1])) << what[i++];
    }
}

}  // namespace
}  // namespace memfit::test
