// Context parallelism over MPI ranks (model/context_parallel.h): each rank of a context group
// holds two mirrored chunks of every sequence, attention gathers the group's keys and values, the
// gradients are summed over data x context ranks. Against one process on the same batch: the
// losses and the whole model after a few AdamW steps equal it within fp32 rounding (the
// attention's sums run in another order), for GPT-2 (learned positions) and LLaMA (RoPE with
// Llama 3.1's scaling, grouped KV heads), with packed documents and recomputation; and each
// rank's measured peak bytes equal its program's plan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "comm/groups.h"
#include "train/engine.h"
#include "mpi_test_env.h"
#include "../test_util.h"

using namespace memfit;

namespace {

struct CpCase {
    bool llama = false;
    DType dt = DType::f32;
    int cp = 2, k = 1, zero = 0;
    bool documents = false;
    std::string recompute = "none";
    bool ring = false;   // --cp-comm-type p2p
};

struct CpRun {
    std::vector<float> losses, params;
    CategoryBytes planned_live, live_peak;
};

// Documents of 5 tokens (the last one cut by the row's end): their starts in the row.
std::vector<int32_t> doc_starts(int rows, int T) {
    std::vector<int32_t> d(size_t(rows) * size_t(T));
    for (size_t i = 0; i < d.size(); ++i) d[i] = int32_t(i % size_t(T) / 5 * 5);
    return d;
}

// This rank's rows of each of k micro-batches of G sequences (data index `seq` of G / B), and of
// each row its context chunks (the whole sequence when cp is 1).
std::vector<int32_t> mine(const std::vector<int32_t> & v, int k, int G, int T, int seq, int B, const ContextParallel & cp) {
    const int Tl = T / cp.ranks;
    std::vector<int32_t> out;
    for (int i = 0; i < k; ++i)
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < Tl; ++t)
                out.push_back(v[(size_t(i) * size_t(G) + size_t(seq * B + b)) * size_t(T) + size_t(cp.position(t, T))]);
    return out;
}

CpRun train(const ModelConfig & cfg, const CpCase & c, bool split, int G, int T, int steps) {
    CpuBackend backend;
    std::unique_ptr<ProcessGroups> pg;
    EngineOptions eo;
    ContextParallel cp;
    int sequences = 1, seq = 0;   // data-parallel groups of sequences, and this rank's
    if (split) {
        ParallelLayout l = derive_layout(test::world().size(), 1, 1);
        l.cp = c.cp;
        pg = std::make_unique<ProcessGroups>(test::world(), l);
        cp = ContextParallel{c.cp, pg->coords.dp % c.cp};
        sequences = l.dp / c.cp;
        seq = pg->coords.dp / c.cp;
        eo.data_parallel = l.dp;
        eo.rank = pg->coords.dp;
        eo.comm = pg->dp.get();
        eo.context_parallel = c.cp;
        eo.cp_rank = cp.rank;
        eo.cp_comm = pg->cp.get();
        eo.cp_ring = c.ring;
        eo.zero = c.zero;
    }
    eo.B = G / sequences;
    eo.T = T / cp.ranks;
    eo.grad_accum = c.k;
    eo.compute = c.dt;
    eo.flash_attention = true;
    eo.documents = c.documents;
    eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
    eo.with_eval = false;
    eo.checking = true;
    Engine e(cfg, backend, eo);
    e.init_params(7);
    OptimHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    h.clip = 1.0f;
    CpRun run;
    const std::vector<int32_t> ds = doc_starts(G * c.k, T);
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(size_t(G * T * c.k)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(500 + s));
        const std::vector<int32_t> my_in = mine(in, c.k, G, T, seq, eo.B, cp), my_tg = mine(tg, c.k, G, T, seq, eo.B, cp),
                                   my_ds = mine(ds, c.k, G, T, seq, eo.B, cp);
        run.losses.push_back(e.train_step(my_in.data(), my_tg.data(), h, c.documents ? my_ds.data() : nullptr).loss);
    }
    run.params = e.full_params();
    run.planned_live = e.planned_peak_live();
    run.live_peak = e.ledger().live_peak();
    return run;
}

void check(const CpCase & c) {
    const int N = test::world().size();
    SCOPED_TRACE(fmt::format("{} {} cp {} ({}) of {} ranks, micro-batches {}, zero {}, {}recompute {}",
                             c.llama ? "llama" : "gpt2", dtype_name(c.dt), c.cp, c.ring ? "ring" : "all-gather", N, c.k,
                             c.zero, c.documents ? "packed documents, " : "", c.recompute));
    ModelConfig cfg = test::small_family(c.llama, 37, 32, 2, 4, 48, 64);
    if (c.llama) {   // Llama 3.1's RoPE scaling, its factors chosen by the whole sequence
        cfg.rope_theta = 500000.0f;
        cfg.rope_scaling.scaling = RopeScaling::llama3;
        cfg.rope_scaling.factor = 8.0f;
        cfg.rope_scaling.original_context = 16;
        cfg.validate();
    }
    const int G = N / c.cp * 2, T = 16, steps = 3;
    const CpRun par = train(cfg, c, true, G, T, steps);
    const CpRun one = train(cfg, c, false, G, T, steps);
    const double tol = c.dt == DType::f32 ? 2e-5 : 2e-2;
    for (size_t s = 0; s < one.losses.size(); ++s)
        EXPECT_NEAR(par.losses[s], one.losses[s], tol * std::fabs(one.losses[s])) << "step " << s;
    ASSERT_EQ(par.params.size(), one.params.size());
    double worst = 0;
    for (size_t i = 0; i < one.params.size(); ++i)
        worst = std::max(worst, std::fabs(double(par.params[i]) - double(one.params[i])));
    EXPECT_LT(worst, c.dt == DType::f32 ? 1e-4 : 2.0 * 1e-2 * steps + 1e-3) << "largest parameter difference";
    for (size_t cat = 0; cat < size_t(kCategoryCount); ++cat)
        EXPECT_EQ(par.live_peak.v[cat], par.planned_live.v[cat]) << "live " << kCategoryNames[cat];
    // Each rank holds half of every sequence: its kept activations well below one process's.
    EXPECT_LT(par.planned_live[Category::activations], one.planned_live[Category::activations]);
}

}  // namespace

TEST(ContextParallel, EqualsOneProcessOnTheSameBatch) {
    ASSERT_GE(test::world().size(), 2) << "run under mpirun -np 2 or more";
    for (bool ring : {false, true})
        for (bool llama : {false, true})
            for (bool documents : {false, true}) {
                CpCase c;
                c.llama = llama;
                c.documents = documents;
                c.ring = ring;
                check(c);
            }
}

// The ring around every rank of the world (4 ranks: four hops a layer), with recomputation.
TEST(ContextParallel, RingAroundTheWholeWorld) {
    const int N = test::world().size();
    ASSERT_GE(N, 2);
    CpCase c;
    c.llama = true;
    c.cp = N;
    c.ring = true;
    c.documents = true;
    c.recompute = "selective";
    check(c);
}

TEST(ContextParallel, AccumulationRecomputationZeroAndBf16) {
    ASSERT_GE(test::world().size(), 2);
    CpCase c;
    c.llama = true;
    c.k = 2;
    c.recompute = "selective";
    check(c);
    c.recompute = "full";
    c.zero = 2;
    check(c);
    c.dt = DType::bf16;
    c.documents = true;
    check(c);
}
