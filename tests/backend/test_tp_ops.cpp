// The tensor-parallel ops of the backend and the graph, on one process:
//   - the vocabulary-parallel embedding: R shards of ceil(V/R) rows (the last one padded with
//     garbage rows no token reaches) summed give encoder_fwd's output bit for bit (f32 and bf16),
//     and their dwte, concatenated, equal encoder_bwd's (dwpe from every shard, every token);
//   - the vocabulary-parallel cross-entropy: stats, their concatenation, loss and backward on
//     column shards (padding columns full of garbage) agree with xent_fwd / xent_bwd on the full
//     logits, a shard without a valid column included;
//   - the Graph's tensor-group collectives over a single communicator (identity and copies, one
//     recorded op each, an abort without a tensor communicator) and its recorded wrappers of the
//     ops above. Several ranks: tests/mpi.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/graph.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::randn;

constexpr float kGarbage = 1e9f;
constexpr float kInf = std::numeric_limits<float>::infinity();

template <class T>
constexpr DType dtype_in() {
    if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
    else return dtype_of<T>();
}

template <class T>
Tensor view(std::vector<T> & v, std::initializer_list<int64_t> dims) {
    Tensor t(-1, dtype_in<T>(), dims);
    MF_ASSERT(size_t(t.numel()) == v.size());
    t.data = v.data();
    return t;
}

std::vector<float> floats(const std::vector<bf16_t> & v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = to_f32(v[i]);
    return f;
}

std::vector<bf16_t> bf16s(const std::vector<float> & v) {
    std::vector<bf16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = from_f32<bf16_t>(v[i]);
    return h;
}

template <class T>
bool same_bits(const std::vector<T> & a, const std::vector<T> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Rows (or columns) per shard when V entries are split over R ranks: ceil(V / R).
int64_t shard_size(int64_t V, int R) { return (V + R - 1) / R; }

// Rows lo .. lo+S-1 of a [V, C] table; the rows past V are padding filled with `pad`.
template <class T>
std::vector<T> table_rows(const std::vector<T> & full, int64_t V, int64_t C, int64_t lo, int64_t S, T pad) {
    std::vector<T> out(size_t(S * C), pad);
    const int64_t n = std::clamp<int64_t>(V - lo, 0, S);
    std::copy(full.begin() + lo * C, full.begin() + (lo + n) * C, out.begin());
    return out;
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel embedding

constexpr int kB = 2, kT = 5, kC = 40, kV = 13;   // C > 32: two column blocks in the fp32 backward

std::vector<int32_t> tokens_over_the_vocab(std::mt19937 & rng) {
    std::vector<int32_t> tok(size_t(kB) * kT);
    for (auto & t : tok) t = int32_t(rng() % kV);
    tok[0] = kV - 1, tok[1] = 0, tok[7] = tok[3];   // the last token (the short shard) and a repeat
    return tok;
}

// f32: the shards' outputs sum to encoder_fwd's exactly (each element has at most two nonzero
// terms, wte and wpe, added once in either order); dwte shards and dwpe equal encoder_bwd's.
TEST(VocabEncoder, ShardsSumToTheFullEmbeddingF32) {
    CpuBackend be;
    std::mt19937 rng(3);
    std::vector<int32_t> tok = tokens_over_the_vocab(rng);
    std::vector<float> wte = randn(size_t(kV) * kC, rng), wpe = randn(size_t(kT) * kC, rng);
    std::vector<float> dout = randn(size_t(kB) * kT * kC, rng);
    const Tensor ttok = view(tok, {kB, kT});
    for (bool with_wpe : {true, false}) {
        std::vector<float> want(size_t(kB) * kT * kC);
        be.encoder_fwd(view(want, {kB, kT, kC}), ttok, view(wte, {kV, kC}), with_wpe ? view(wpe, {kT, kC}) : Tensor{});
        std::vector<float> dwte_want = randn(size_t(kV) * kC, rng), dwpe_want(size_t(kT) * kC, 0.5f);
        const std::vector<float> dwte0 = dwte_want;
        be.encoder_bwd(view(dwte_want, {kV, kC}), with_wpe ? view(dwpe_want, {kT, kC}) : Tensor{},
                       view(dout, {kB, kT, kC}), ttok);
        for (int R : {1, 2, 3}) {
            SCOPED_TRACE(testing::Message() << "R = " << R << (with_wpe ? ", wpe" : ", no wpe"));
            const int64_t S = shard_size(kV, R);
            std::vector<float> sum(want.size(), 0.0f);
            for (int r = 0; r < R; ++r) {
                const int64_t lo = r * S;
                std::vector<float> w = table_rows(wte, kV, kC, lo, S, kGarbage);
                std::vector<float> out(want.size(), kGarbage);   // written, not accumulated
                const bool wpe_here = with_wpe && r == 0;
                be.vocab_encoder_fwd(view(out, {kB, kT, kC}), ttok, view(w, {S, kC}),
                                     wpe_here ? view(wpe, {kT, kC}) : Tensor{}, lo);
                for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];

                // Backward: this shard's rows of dwte (pre-filled: +=), its padding untouched; dwpe
                // receives every token, whichever shard holds it.
                std::vector<float> dw = table_rows(dwte0, kV, kC, lo, S, kGarbage);
                std::vector<float> dwpe(size_t(kT) * kC, 0.5f);
                be.vocab_encoder_bwd(view(dw, {S, kC}), with_wpe ? view(dwpe, {kT, kC}) : Tensor{},
                                     view(dout, {kB, kT, kC}), ttok, lo);
                EXPECT_TRUE(same_bits(dw, table_rows(dwte_want, kV, kC, lo, S, kGarbage))) << "dwte shard " << r;
                if (with_wpe) {
                    EXPECT_TRUE(same_bits(dwpe, dwpe_want)) << "dwpe, shard " << r;
                    // A frozen table: dwpe alone.
                    std::vector<float> dwpe_only(size_t(kT) * kC, 0.5f);
                    be.vocab_encoder_bwd(Tensor{}, view(dwpe_only, {kT, kC}), view(dout, {kB, kT, kC}), ttok, lo);
                    EXPECT_TRUE(same_bits(dwpe_only, dwpe_want)) << "dwpe with a frozen wte, shard " << r;
                }
            }
            EXPECT_TRUE(same_bits(sum, want));
        }
    }
}

// bf16 storage: the sum of the shards, rounded once, is encoder_fwd's bf16 output (one shard adds
// round(wte + wpe) or a term alone, exactly); bf16 and f32 gradients match encoder_bwd's bits.
TEST(VocabEncoder, ShardsSumToTheFullEmbeddingBf16) {
    CpuBackend be;
    std::mt19937 rng(5);
    std::vector<int32_t> tok = tokens_over_the_vocab(rng);
    std::vector<bf16_t> wte = bf16s(randn(size_t(kV) * kC, rng)), wpe = bf16s(randn(size_t(kT) * kC, rng));
    std::vector<bf16_t> dout = bf16s(randn(size_t(kB) * kT * kC, rng));
    const Tensor ttok = view(tok, {kB, kT});
    std::vector<bf16_t> want(size_t(kB) * kT * kC);
    be.encoder_fwd(view(want, {kB, kT, kC}), ttok, view(wte, {kV, kC}), view(wpe, {kT, kC}));
    const std::vector<bf16_t> dwte0 = bf16s(randn(size_t(kV) * kC, rng)), dwpe0 = bf16s(randn(size_t(kT) * kC, rng));
    std::vector<bf16_t> dwte_want = dwte0, dwpe_want = dwpe0;   // bf16 gradients: the grouped path
    be.encoder_bwd(view(dwte_want, {kV, kC}), view(dwpe_want, {kT, kC}), view(dout, {kB, kT, kC}), ttok);
    std::vector<float> dwte32_want(size_t(kV) * kC, 0.25f), dwpe32_want(size_t(kT) * kC, 0.25f);
    be.encoder_bwd(view(dwte32_want, {kV, kC}), view(dwpe32_want, {kT, kC}), view(dout, {kB, kT, kC}), ttok);
    const bf16_t pad = from_f32<bf16_t>(kGarbage);
    for (int R : {1, 2, 3}) {
        SCOPED_TRACE(testing::Message() << "R = " << R);
        const int64_t S = shard_size(kV, R);
        std::vector<float> sum(want.size(), 0.0f);
        for (int r = 0; r < R; ++r) {
            const int64_t lo = r * S;
            std::vector<bf16_t> w = table_rows(wte, kV, kC, lo, S, pad);
            std::vector<bf16_t> out(want.size(), pad);
            const Tensor p = r == 0 ? view(wpe, {kT, kC}) : Tensor{};
            be.vocab_encoder_fwd(view(out, {kB, kT, kC}), ttok, view(w, {S, kC}), p, lo);
            const std::vector<float> o = floats(out);
            for (size_t i = 0; i < sum.size(); ++i) sum[i] += o[i];

            std::vector<bf16_t> dw = table_rows(dwte0, kV, kC, lo, S, pad), dwpe = dwpe0;
            be.vocab_encoder_bwd(view(dw, {S, kC}), view(dwpe, {kT, kC}), view(dout, {kB, kT, kC}), ttok, lo);
            EXPECT_TRUE(same_bits(dw, table_rows(dwte_want, kV, kC, lo, S, pad))) << "bf16 dwte shard " << r;
            EXPECT_TRUE(same_bits(dwpe, dwpe_want)) << "bf16 dwpe, shard " << r;
            std::vector<float> dw32 = table_rows(std::vector<float>(size_t(kV) * kC, 0.25f), kV, kC, lo, S, kGarbage);
            std::vector<float> dwpe32(size_t(kT) * kC, 0.25f);
            be.vocab_encoder_bwd(view(dw32, {S, kC}), view(dwpe32, {kT, kC}), view(dout, {kB, kT, kC}), ttok, lo);
            EXPECT_TRUE(same_bits(dw32, table_rows(dwte32_want, kV, kC, lo, S, kGarbage))) << "f32 dwte shard " << r;
            EXPECT_TRUE(same_bits(dwpe32, dwpe32_want)) << "f32 dwpe, shard " << r;
        }
        EXPECT_TRUE(same_bits(bf16s(sum), want));
    }
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel cross-entropy

constexpr int kN = 7;

struct XentCase {
    std::vector<float> logits;     // [N, V]
    std::vector<int32_t> targets;  // some -100
    std::vector<float> losses;     // xent_fwd's
    std::vector<float> dlogits;    // xent_bwd's
    float dloss = 0.5f;
};

XentCase full_xent(CpuBackend & be, std::mt19937 & rng) {
    XentCase x;
    x.logits = randn(size_t(kN) * kV, rng, 3.0f);
    x.targets = {kV - 1, 0, -100, 6, 12, -100, 9};
    x.losses.assign(kN, kGarbage);
    x.dlogits = x.logits;
    be.xent_fwd(view(x.losses, {kN}), view(x.dlogits, {kN, kV}), view(x.targets, {kN}));
    be.xent_bwd(view(x.dlogits, {kN, kV}), view(x.targets, {kN}), x.dloss);
    return x;
}

// Columns lo .. lo+S-1 of x's logits; the padding columns (at or past V) hold garbage.
std::vector<float> logit_columns(const XentCase & x, int64_t lo, int64_t S) {
    std::vector<float> out(size_t(kN * S), kGarbage);
    for (int i = 0; i < kN; ++i)
        for (int64_t j = 0; j < S && lo + j < kV; ++j) out[size_t(i * S + j)] = x.logits[size_t(i * kV + lo + j)];
    return out;
}

// R shards of S columns each (R * S >= V): losses within 1e-5 relative of xent_fwd's, dlogits
// within 1e-6 of xent_bwd's, padding columns and ignored rows 0, stats leaving logits untouched.
void check_sharded_xent(int R, int64_t S) {
    SCOPED_TRACE(testing::Message() << "R = " << R << ", S = " << S);
    CpuBackend be;
    std::mt19937 rng(uint32_t(7 + R));
    XentCase x = full_xent(be, rng);
    Tensor targets = view(x.targets, {kN});
    std::vector<std::vector<float>> shards;
    std::vector<float> gathered(size_t(R) * 2 * kN);
    for (int r = 0; r < R; ++r) {
        shards.push_back(logit_columns(x, r * S, S));
        const std::vector<float> before = shards.back();
        std::vector<float> stats(2 * kN, kGarbage);
        be.xent_shard_stats(view(stats, {2, kN}), view(shards.back(), {kN, S}), targets, r * S, kV);
        EXPECT_TRUE(same_bits(shards.back(), before)) << "stats modified the logits of shard " << r;
        std::copy(stats.begin(), stats.end(), gathered.begin() + r * 2 * kN);
        if (r * S >= kV) {
            for (int i = 0; i < kN; ++i) {
                EXPECT_EQ(stats[size_t(i)], -kInf) << "a shard with no valid column, row " << i;
            }
        }
    }
    std::vector<float> losses(kN, kGarbage), lse(kN, kGarbage);
    be.xent_shard_loss(view(losses, {kN}), view(lse, {kN}), view(gathered, {R, 2, kN}), targets);
    for (int i = 0; i < kN; ++i) {
        if (x.targets[size_t(i)] == -100) {
            EXPECT_EQ(losses[size_t(i)], 0.0f) << "ignored row " << i;
        } else {
            EXPECT_NEAR(losses[size_t(i)], x.losses[size_t(i)], 1e-5 * std::abs(x.losses[size_t(i)])) << "row " << i;
        }
    }
    for (int r = 0; r < R; ++r) {
        const int64_t lo = r * S;
        std::vector<float> & d = shards[size_t(r)];
        be.xent_shard_bwd(view(d, {kN, S}), targets, view(lse, {kN}), lo, kV, x.dloss);
        for (int i = 0; i < kN; ++i) {
            for (int64_t j = 0; j < S; ++j) {
                const float got = d[size_t(i * S + j)];
                if (lo + j >= kV) {
                    EXPECT_EQ(got, 0.0f) << "padding column " << lo + j << ", row " << i;
                } else {
                    EXPECT_NEAR(got, x.dlogits[size_t(i * kV + lo + j)], 1e-6) << "row " << i << ", column " << lo + j;
                }
            }
        }
    }
}

TEST(VocabXent, ShardsAgreeWithTheFullSoftmax) {
    check_sharded_xent(1, 13);
    check_sharded_xent(2, 7);
    check_sharded_xent(3, 5);
    check_sharded_xent(2, 13);   // the second shard is all padding
}

// ---------------------------------------------------------------------------------------------
// Graph

struct PersistentProgram {
    Program p;
    BufferId declare(const char * name, int64_t elems, DType dt) {
        return p.declare(name, Category::activations, size_t(elems) * dtype_size(dt), true);
    }
};

TEST(GraphTensorParallel, CollectivesOverOneRankAreIdentityAndCopies) {
    PersistentProgram pp;
    const int n = 6;
    const BufferId b_a = pp.declare("a", n, DType::f32), b_h = pp.declare("h", n, DType::bf16),
                   b_s = pp.declare("scratch", n, DType::f32), b_in = pp.declare("in", n, DType::bf16),
                   b_out = pp.declare("out", n, DType::bf16), b_rs = pp.declare("rs", n, DType::f32),
                   b_rsout = pp.declare("rs_out", n, DType::f32);
    const Tensor a(b_a, DType::f32, {n}), h(b_h, DType::bf16, {2, 3}), scratch(b_s, DType::f32, {n}),
        in(b_in, DType::bf16, {n}), out(b_out, DType::bf16, {n}), rs(b_rs, DType::f32, {n}),
        rs_out(b_rsout, DType::f32, {n});
    auto step = [&](Graph & g) {
        g.tp_all_reduce(a);
        g.tp_all_reduce(h, scratch);
        g.tp_all_gather(out, in);
        g.tp_reduce_scatter(rs_out, rs);
    };
    {
        Graph rec(pp.p, nullptr);
        step(rec);
    }
    pp.p.finalize();
    ASSERT_EQ(pp.p.num_ops(), 4);
    const auto & ops = pp.p.ops();
    EXPECT_STREQ(ops[0].name, "tp_all_reduce");
    EXPECT_STREQ(ops[1].name, "tp_all_reduce");
    EXPECT_STREQ(ops[2].name, "tp_all_gather");
    EXPECT_STREQ(ops[3].name, "tp_reduce_scatter");
    EXPECT_EQ(ops[0].uses, (std::vector<BufferId>{b_a}));
    EXPECT_EQ(ops[1].uses, (std::vector<BufferId>{b_h, b_s}));
    EXPECT_EQ(ops[2].uses, (std::vector<BufferId>{b_out, b_in}));
    EXPECT_EQ(ops[3].uses, (std::vector<BufferId>{b_rsout, b_rs}));

    const MemoryPlan plan = plan_memory(pp.p);
    Ledger ledger;
    StepMemory mem(pp.p, plan, ledger, host_allocator());
    std::mt19937 rng(13);
    const std::vector<float> av = randn(n, rng), rsv = randn(n, rng);
    const std::vector<bf16_t> hv = bf16s(randn(n, rng)), inv = bf16s(randn(n, rng));
    auto fill = [&](BufferId id, const auto & v) { std::memcpy(mem.base(id), v.data(), v.size() * sizeof(v[0])); };
    auto holds = [&](BufferId id, const auto & v) {
        return std::memcmp(mem.base(id), v.data(), v.size() * sizeof(v[0])) == 0;
    };
    fill(b_a, av), fill(b_h, hv), fill(b_in, inv), fill(b_rs, rsv);
    fill(b_out, std::vector<float>(n / 2, kGarbage)), fill(b_rsout, std::vector<float>(n, kGarbage));
    CpuBackend be;
    auto comm = make_single_communicator();
    {
        Graph g(pp.p, mem, be);
        g.set_tensor_communicator(comm.get());
        step(g);
        EXPECT_EQ(g.ops_issued(), 4);
    }
    EXPECT_TRUE(holds(b_a, av));
    EXPECT_TRUE(holds(b_h, hv));
    EXPECT_TRUE(holds(b_out, inv));
    EXPECT_TRUE(holds(b_rs, rsv));
    EXPECT_TRUE(holds(b_rsout, rsv));

    // The data-parallel communicator does not stand in for the tensor-parallel one.
    EXPECT_DEATH(
        {
            Graph g(pp.p, mem, be);
            g.set_communicator(comm.get());
            step(g);
        },
        "set_tensor_communicator");
}

// The wrappers record one op each (name, FLOPs, buffers) and execute the backend's ops.
TEST(GraphTensorParallel, ShardedOpsRecordAndRun) {
    const int64_t S = shard_size(kV, 2), lo = S;   // the second (short) shard of two
    PersistentProgram pp;
    const BufferId b_tok = pp.declare("tokens", kB * kT, DType::i32), b_wte = pp.declare("wte", S * kC, DType::f32),
                   b_wpe = pp.declare("wpe", kT * kC, DType::f32), b_x = pp.declare("x", kB * kT * kC, DType::f32),
                   b_dwte = pp.declare("dwte", S * kC, DType::f32), b_tgt = pp.declare("targets", kN, DType::i32),
                   b_lg = pp.declare("logits", kN * S, DType::f32), b_st = pp.declare("stats", 2 * kN, DType::f32),
                   b_ga = pp.declare("gathered", 2 * kN, DType::f32), b_lo = pp.declare("losses", kN, DType::f32),
                   b_lse = pp.declare("lse", kN, DType::f32);
    const Tensor tok(b_tok, DType::i32, {kB, kT}), wte(b_wte, DType::f32, {S, kC}), wpe(b_wpe, DType::f32, {kT, kC}),
        x(b_x, DType::f32, {kB, kT, kC}), dwte(b_dwte, DType::f32, {S, kC}), tgt(b_tgt, DType::i32, {kN}),
        lg(b_lg, DType::f32, {kN, S}), st(b_st, DType::f32, {2, kN}), ga(b_ga, DType::f32, {1, 2, kN}),
        losses(b_lo, DType::f32, {kN}), lse(b_lse, DType::f32, {kN});
    auto step = [&](Graph & g) {
        g.vocab_encoder_fwd(x, tok, wte, wpe, lo);
        g.vocab_encoder_bwd(dwte, Tensor{}, x, tok, lo);
        g.xent_shard_stats(st, lg, tgt, lo, kV);
        g.tp_all_gather(ga, st);
        g.xent_shard_loss(losses, lse, ga, tgt);
        g.xent_shard_bwd(lg, tgt, lse, lo, kV, 0.25f);
    };
    {
        Graph rec(pp.p, nullptr);
        step(rec);
    }
    pp.p.finalize();
    ASSERT_EQ(pp.p.num_ops(), 6);
    const auto & ops = pp.p.ops();
    const char * names[] = {"vocab_encoder_fwd", "vocab_encoder_bwd", "xent_shard_stats",
                            "tp_all_gather",     "xent_shard_loss",   "xent_shard_bwd"};
    for (int i = 0; i < 6; ++i) EXPECT_STREQ(ops[size_t(i)].name, names[i]);
    EXPECT_EQ(ops[0].uses, (std::vector<BufferId>{b_x, b_tok, b_wte, b_wpe}));
    EXPECT_EQ(ops[1].uses, (std::vector<BufferId>{b_dwte, b_x, b_tok}));   // the invalid dwpe is skipped
    EXPECT_EQ(ops[2].uses, (std::vector<BufferId>{b_st, b_lg, b_tgt}));
    EXPECT_EQ(ops[4].uses, (std::vector<BufferId>{b_lo, b_lse, b_ga, b_tgt}));
    EXPECT_EQ(ops[5].uses, (std::vector<BufferId>{b_lg, b_tgt, b_lse}));
    EXPECT_EQ(ops[0].flops, double(kB * kT * kC));
    EXPECT_EQ(ops[1].flops, 2.0 * kB * kT * kC);
    EXPECT_EQ(ops[2].flops, 4.0 * kN * S);
    EXPECT_EQ(ops[4].flops, 5.0 * kN);
    EXPECT_EQ(ops[5].flops, 3.0 * kN * S);

    const MemoryPlan plan = plan_memory(pp.p);
    Ledger ledger;
    StepMemory mem(pp.p, plan, ledger, host_allocator());
    std::mt19937 rng(17);
    std::vector<int32_t> tokv = tokens_over_the_vocab(rng), tgtv = {kV - 1, 0, -100, 6, 12, -100, 9};
    std::vector<float> wtev = randn(size_t(S * kC), rng), wpev = randn(size_t(kT * kC), rng),
                       dwtev = randn(size_t(S * kC), rng), lgv = randn(size_t(kN * S), rng);
    auto fill = [&](BufferId id, const auto & v) { std::memcpy(mem.base(id), v.data(), v.size() * sizeof(v[0])); };
    fill(b_tok, tokv), fill(b_tgt, tgtv), fill(b_wte, wtev), fill(b_wpe, wpev), fill(b_dwte, dwtev), fill(b_lg, lgv);
    CpuBackend be;
    auto comm = make_single_communicator();
    {
        Graph g(pp.p, mem, be);
        g.set_tensor_communicator(comm.get());
        step(g);
    }
    // The same ops on plain copies through the backend.
    std::vector<float> xv(size_t(kB * kT * kC)), stv(2 * kN), lossv(kN), lsev(kN);
    be.vocab_encoder_fwd(view(xv, {kB, kT, kC}), view(tokv, {kB, kT}), view(wtev, {S, kC}), view(wpev, {kT, kC}), lo);
    be.vocab_encoder_bwd(view(dwtev, {S, kC}), Tensor{}, view(xv, {kB, kT, kC}), view(tokv, {kB, kT}), lo);
    be.xent_shard_stats(view(stv, {2, kN}), view(lgv, {kN, S}), view(tgtv, {kN}), lo, kV);
    be.xent_shard_loss(view(lossv, {kN}), view(lsev, {kN}), view(stv, {1, 2, kN}), view(tgtv, {kN}));
    be.xent_shard_bwd(view(lgv, {kN, S}), view(tgtv, {kN}), view(lsev, {kN}), lo, kV, 0.25f);
    auto holds = [&](BufferId id, const std::vector<float> & v) {
        return std::memcmp(mem.base(id), v.data(), v.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(holds(b_x, xv));
    EXPECT_TRUE(holds(b_dwte, dwtev));
    EXPECT_TRUE(holds(b_st, stv));
    EXPECT_TRUE(holds(b_ga, stv));
    EXPECT_TRUE(holds(b_lo, lossv));
    EXPECT_TRUE(holds(b_lse, lsev));
    EXPECT_TRUE(holds(b_lg, lgv));
}

}  // namespace
}  // namespace memfit
