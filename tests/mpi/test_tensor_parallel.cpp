// Tensor (Megatron-LM) and pipeline (GPipe, 1F1B) parallelism over MPI ranks, alone, together
// and with data parallel and ZeRO-1: heads, MLP width and vocabulary split over the tensor
// group; blocks split into stages that pass micro-batches' activations and gradients. Against
// one process on the same global batch: losses and the gathered whole model after a few AdamW
// steps equal it within fp32 rounding, and each rank's measured peak bytes equal its program's
// plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "model/sparsity.h"
#include "train/engine.h"
#include "core/units.h"
#include "app/report.h"
#include "mpi_test_env.h"
#include "../test_util.h"

using namespace memfit;

namespace {

struct TpCase {
    bool llama = false;
    DType dt = DType::f32;
    int tp = 2, k = 1, zero = 0;
    int pp = 1;
    bool sp = false;   // sequence parallel
    PipeSchedule schedule = PipeSchedule::one_f_one_b;
    int virtual_stages = 1;   // interleaved
    int layers = 2;
    int kv_heads = 0;         // llama: override (0: test::small_family's 2)
    std::string recompute = "none";
    int loss_chunk = 0;
    bool flash = true;
    // Own allocation per buffer, poisoned after its last use (reserved bytes are then not the plan's).
    bool checking = true;
    NmSparsity sparsity;      // --sparsity: pruned after sparsity.start steps
};

struct TpRun {
    std::vector<float> losses, params;
    CategoryBytes planned_live, planned_reserved, live_peak, reserved_peak;
};

// Global micro-batch G sequences of T tokens, k micro-batches per step. tp = 0: one process.
TpRun train(const ModelConfig & cfg, const TpCase & c, bool split, int G, int T, int steps) {
    CpuBackend backend;
    std::unique_ptr<ProcessGroups> pg;
    int D = 1, dp_rank = 0;
    EngineOptions eo;
    if (split) {
        pg = std::make_unique<ProcessGroups>(test::world(), derive_layout(test::world().size(), c.tp, c.pp));
        D = pg->layout.dp;
        dp_rank = pg->coords.dp;
        eo.data_parallel = D;
        eo.comm = D > 1 ? pg->dp.get() : nullptr;
        eo.tensor_parallel = c.tp;
        eo.sequence_parallel = c.sp;
        eo.tp_comm = pg->tp.get();
        eo.pipeline_parallel = c.pp;
        eo.pp_comm = pg->pp.get();
        eo.emb_comm = pg->emb.get();
        eo.schedule = c.schedule;
        eo.virtual_stages = c.virtual_stages;
        eo.zero = c.zero;
    }
    eo.B = G / D;
    eo.T = T;
    eo.grad_accum = c.k;
    eo.compute = c.dt;
    eo.flash_attention = c.flash;
    eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
    eo.loss_chunk = c.loss_chunk;
    eo.with_eval = false;
    eo.checking = c.checking;
    eo.sparsity = c.sparsity;
    Engine e(cfg, backend, eo);
    e.init_params(7);
    OptimHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    h.clip = 1.0f;
    TpRun run;
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(size_t(G * T * c.k)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(300 + s));
        // This data rank's rows of every micro-batch.
        const std::vector<int32_t> my_in = test::rank_rows(in, c.k, G, T, dp_rank, eo.B),
                                   my_tg = test::rank_rows(tg, c.k, G, T, dp_rank, eo.B);
        run.losses.push_back(e.train_step(my_in.data(), my_tg.data(), h).loss);
    }
    run.params = e.full_params();
    run.planned_live = e.planned_peak_live();
    run.planned_reserved = e.planned_reserved();
    run.live_peak = e.ledger().live_peak();
    run.reserved_peak = e.ledger().reserved_peak();
    return run;
}

std::string describe(const TpCase & c, int N) {
    return fmt::format("{} {} tp {}{} pp {} ({}) dp {} micro-batches {} zero {} recompute {} chunk {}{}",
                       c.llama ? "llama" : "gpt2", dtype_name(c.dt), c.tp, c.sp ? " sp" : "", c.pp,
                       c.schedule == PipeSchedule::interleaved ? fmt::format("interleaved:{}", c.virtual_stages)
                                                               : std::string(schedule_name(c.schedule)),
                       N / (c.tp * c.pp), c.k, c.zero, c.recompute, c.loss_chunk,
                       c.flash ? "" : " (probabilities kept)");
}

void check(const TpCase & c) {
    const int N = test::world().size();
    SCOPED_TRACE(describe(c, N));
    // vocabulary 37: not a multiple of 2 or 4, so the last vocabulary slice is padded
    ModelConfig cfg = test::small_family(c.llama, 37, 32, c.layers, 4, 48);
    if (c.kv_heads > 0) cfg.n_kv_head = c.kv_heads;
    const int G = 4, T = 8, steps = 3;
    const TpRun par = train(cfg, c, true, G, T, steps);
    const TpRun one = train(cfg, c, false, G, T, steps);
    const double tol = c.dt == DType::f32 ? 2e-5 : 2e-2;
    for (size_t s = 0; s < one.losses.size(); ++s)
        EXPECT_NEAR(par.losses[s], one.losses[s], tol * std::fabs(one.losses[s])) << "step " << s;
    ASSERT_EQ(par.params.size(), one.params.size());
    double worst = 0;
    for (size_t i = 0; i < one.params.size(); ++i)
        worst = std::max(worst, std::fabs(double(par.params[i]) - double(one.params[i])));
    EXPECT_LT(worst, c.dt == DType::f32 ? 1e-4 : 2.0 * 1e-2 * steps + 1e-3) << "largest parameter difference";
    // Every rank gathered the same whole model.
    const size_t bytes = par.params.size() * sizeof(float);
    std::vector<float> all(par.params.size() * size_t(N));
    test::world().all_gather(par.params.data(), all.data(), bytes);
    for (int q = 1; q < N; ++q)
        EXPECT_EQ(0, std::memcmp(all.data(), all.data() + size_t(q) * par.params.size(), bytes)) << "rank " << q;
    if (c.sparsity.enabled()) {   // pruned on the gathered whole model, masked slice by slice
        EXPECT_EQ(nm_violations(cfg, make_param_layout(cfg), par.params.data(), c.sparsity), 0u);
    }
    // Each rank holds its slice or stage: well under the whole model's parameter bytes.
    const uint64_t mine = par.planned_live[Category::parameters], whole = one.planned_live[Category::parameters];
    EXPECT_LT(double(mine), 0.8 * double(whole)) << "a rank's parameters against the whole model's";
    // Exact memory: measured peak live (and, placed in the plan's regions, reserved) bytes are
    // the plan's, per category.
    for (size_t cat = 0; cat < size_t(kCategoryCount); ++cat) {
        EXPECT_EQ(par.live_peak.v[cat], par.planned_live.v[cat]) << "live " << kCategoryNames[cat];
        if (!c.checking) {
            EXPECT_EQ(par.reserved_peak.v[cat], par.planned_reserved.v[cat]) << "reserved " << kCategoryNames[cat];
        }
    }
}

}  // namespace

TEST(TensorParallel, EqualsOneProcessOnTheSameGlobalBatch) {
    ASSERT_GE(test::world().size(), 2) << "run under mpirun -np 2 or more";
    for (bool llama : {false, true})
        for (int k : {1, 2}) {
            TpCase c;
            c.llama = llama;
            c.k = k;
            check(c);
        }
}

// --sparsity 2:4 pruned after the first step: every rank prunes the same gathered weights and
// masks its own slice or stage; the one process's steps.
TEST(TensorParallel, SparsityOnSlicesAndStages) {
    ASSERT_GE(test::world().size(), 2);
    for (bool llama : {false, true}) {
        TpCase c;
        c.llama = llama;
        c.sparsity = NmSparsity{2, 4, 1};
        check(c);   // tensor parallel
        c.tp = 1, c.pp = 2, c.k = 2;
        check(c);   // pipeline
    }
}

TEST(TensorParallel, RecomputationChunkedLossAndKeptProbabilities) {
    ASSERT_GE(test::world().size(), 2);
    for (bool llama : {false, true})
        for (const char * rc : {"full", "every:2", "selective"}) {
            TpCase c;
            c.llama = llama;
            c.recompute = rc;
            c.loss_chunk = 12;   // 32 rows in chunks of 12: three vocabulary-parallel losses
            c.flash = std::string(rc) != "selective";
            check(c);
        }
}

// Fewer KV heads than tensor ranks: each KV head is held by the ranks whose query heads read it,
// its gradient summed over them. 2 ranks: one KV head (multi-query); 4 ranks: 2 KV heads.
TEST(TensorParallel, ReplicatedKvHeads) {
    const int N = test::world().size();
    ASSERT_GE(N, 2);
    for (DType dt : {DType::f32, DType::bf16}) {
        TpCase c;
        c.llama = true;
        c.dt = dt;
        c.checking = dt == DType::f32;
        c.k = 2;
        if (N == 4) c.tp = 4;
        else c.kv_heads = 1;
        check(c);
        c.sp = true;   // and sequence parallel
        c.recompute = "full";
        check(c);
    }
}

TEST(TensorParallel, MixedPrecision) {
    ASSERT_GE(test::world().size(), 2);
    for (bool llama : {false, true}) {
        TpCase c;
        c.llama = llama;
        c.dt = DType::bf16;
        c.checking = false;
        check(c);
    }
}

TEST(TensorParallel, WithDataParallelAndZeroOne) {
    const int N = test::world().size();
    if (N < 4) GTEST_SKIP() << "tensor x data parallel needs 4 ranks (this run has " << N << ")";
    for (bool llama : {false, true})
        for (int zero : {0, 1}) {
            TpCase c;
            c.llama = llama;
            c.zero = zero;
            c.k = 2;
            check(c);
        }
    TpCase four;   // the whole group of 4 as one tensor group (gpt2: 4 heads)
    four.tp = 4;
    check(four);
}

// The layouts (T, P, D) on 2 ranks (1,2,1) and on 4 ranks (2,2,1), (1,2,2), plus four
// stages (middle stages; the tied GPT-2 table's two ends), under both schedules, with 4
// micro-batches per step so that 1F1B's steady state runs.
TEST(PipelineParallel, EqualsOneProcessOnTheSameGlobalBatch) {
    const int N = test::world().size();
    ASSERT_GE(N, 2);
    struct L { int tp, pp; };
    std::vector<L> layouts = {{1, 2}};
    if (N == 4) layouts = {{2, 2}, {1, 2}, {1, 4}};
    for (const L & l : layouts)
        for (PipeSchedule sch : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
            for (bool llama : {false, true}) {
                TpCase c;
                c.llama = llama;
                c.tp = l.tp;
                c.pp = l.pp;
                c.schedule = sch;
                c.k = 4;
                c.layers = 4;
                check(c);
            }
}

TEST(PipelineParallel, RecomputationMixedPrecisionAndZeroOne) {
    const int N = test::world().size();
    ASSERT_GE(N, 2);
    for (bool llama : {false, true}) {
        TpCase c;
        c.llama = llama;
        c.tp = 1;
        c.pp = 2;
        c.k = 3;
        c.layers = 4;
        c.recompute = "every:2";
        c.zero = N >= 4 ? 1 : 0;
        check(c);
        c.recompute = "selective";
        c.flash = false;
        c.dt = DType::bf16;
        c.checking = false;
        check(c);
    }
}

// Sequence parallel: the same results, with the residual stream's activations (norm outputs,
// residual sums, their statistics) divided by the tensor ranks; under recomputation, mixed
// precision, the chunked loss and a pipeline too.
TEST(SequenceParallel, EqualsOneProcessAndDividesTheResidualStream) {
    const int N = test::world().size();
    ASSERT_GE(N, 2);
    for (bool llama : {false, true})
        for (const char * rc : {"none", "selective", "every:2"}) {
            TpCase c;
            c.llama = llama;
            c.sp = true;
            c.recompute = rc;
            c.flash = std::string(rc) != "selective";
            c.loss_chunk = std::string(rc) == "every:2" ? 12 : 0;
            c.k = 2;
            check(c);
        }
    TpCase bf;
    bf.sp = true;
    bf.dt = DType::bf16;
    bf.checking = false;
    check(bf);
    if (N == 4) {   // with a pipeline: (2, 2, 1) and sp; then with bf16 and recomputation too
        TpCase p;
        p.sp = true;
        p.pp = 2;
        p.k = 4;
        p.layers = 4;
        check(p);
        p.dt = DType::bf16;
        p.recompute = "selective";
        p.flash = false;
        p.checking = false;
        check(p);
        p.schedule = PipeSchedule::interleaved;
        p.virtual_stages = 2;
        p.recompute = "full";
        check(p);
    }
    // The residual stream's buffers hold 1/T of the rows: ln_1's output of block 0, for one.
    const ModelConfig cfg = test::small_family(false, 37, 32, 2, 4, 48);
    auto ln1_bytes = [&](bool sp) {
        ModelOptions mo;
        mo.with_backward = true;
        mo.tp.ranks = 2;
        mo.tp.rank = 0;
        mo.tp.vocab = cfg.vocab_size;
        mo.tp.sequence = sp;
        Program prog;
        Transformer t(tp_local_config(cfg, 2), 4, 8, prog, mo);
        for (const auto & b : prog.buffers())
            if (b.name == "h.0.ln_1.out") return b.bytes;
        return size_t(0);
    };
    EXPECT_EQ(ln1_bytes(true) * 2, ln1_bytes(false));
}

// Interleaved 1F1B: V chunks per stage (virtual stage v on stage v mod P), sends started at once
// and completed once the peer has answered them (interleaved_send_waits), receives blocking; (1,2,1)
// on 2 ranks with V = 2 and 3 (6 blocks), (2,2,1) and (1,4,1) (8 blocks, two per stage) on 4;
// each rank's plan equal to its measurement (check).
TEST(PipelineParallel, InterleavedEqualsOneProcess) {
    const int N = test::world().size();
    ASSERT_GE(N, 2);
    struct L { int tp, pp, layers, v; };
    std::vector<L> layouts = {{1, 2, 4, 2}, {1, 2, 6, 3}};
    if (N == 4) layouts = {{2, 2, 4, 2}, {1, 4, 8, 2}};
    for (const L & l : layouts)
        for (bool llama : {false, true}) {
            TpCase c;
            c.llama = llama;
            c.tp = l.tp;
            c.pp = l.pp;
            c.schedule = PipeSchedule::interleaved;
            c.virtual_stages = l.v;
            c.k = 2 * l.pp;
            c.layers = l.layers;
            check(c);
        }
}

// The report's hints re-plan the step with one option changed: from the whole model (the step's
// own config is this rank's slice, which the options would split again: 6 heads -> 3 -> refused),
// so each hint's peak is this rank's (and pipeline stage's) plan with that option.
TEST(TensorParallel, ReportHintsReplanThisRanksSlice) {
    ASSERT_GE(test::world().size(), 2);
    const int P = test::world().size() >= 4 ? 2 : 1;   // 4 ranks: tensor x pipeline, no data parallel
    const ProcessGroups pg(test::world(), derive_layout(test::world().size(), 2, P));
    ASSERT_EQ(pg.layout.dp, 1);
    const ModelConfig cfg = test::small_family(false, 37, 48, 4, 6, 48);   // 6 heads of 8
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 4;
    eo.T = 32;
    eo.with_eval = false;
    eo.tensor_parallel = 2;
    eo.tp_comm = pg.tp.get();
    eo.pipeline_parallel = P;
    eo.pp_comm = pg.pp.get();
    eo.emb_comm = pg.emb.get();
    Engine e(cfg, backend, eo);
    e.init_params(3);
    Timeline tl;
    e.set_timeline(&tl);
    std::vector<int32_t> in(size_t(eo.B * eo.T)), tg(in.size());
    test::random_batch(in, tg, cfg.vocab_size, 5);
    e.train_step(in.data(), tg.data(), OptimHyper{});
    ReportData rep;
    ASSERT_NO_THROW(rep = build_report(e, tl, "tp", nlohmann::json::object(), 0));
    // This rank's plan with one option changed, built without communicators (planning only).
    EngineOptions alt = eo;
    alt.tp_comm = alt.pp_comm = alt.emb_comm = nullptr;
    alt.tp_rank = pg.coords.tp;
    alt.pp_rank = pg.coords.pp;
    alt.recompute = parse_recompute("full", cfg.n_layer);
    const uint64_t want = StepPlans(cfg, backend, alt).train_plan.peak_live_total;
    // A hint is given when the option saves at least 1%.
    const bool saves = double(want) < 0.99 * double(e.plan().peak_live_total);
    bool found = false;
    for (const auto & h : rep.hints)
        if (h.starts_with("--recompute full")) {
            found = true;
            EXPECT_NE(h.find("to " + format_bytes(want) + " "), std::string::npos) << h << " (want "
                                                                                 << format_bytes(want) << ")";
        }
    EXPECT_EQ(found, saves) << "the --recompute full hint; this rank's plan " << format_bytes(e.plan().peak_live_total)
                            << ", with full recomputation " << format_bytes(want);
}
