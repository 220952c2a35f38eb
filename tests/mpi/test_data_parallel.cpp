// Data parallel over MPI ranks against one process on the same global batch: each rank runs
// its slice of every micro-batch, the gradients are summed bucket by bucket (non-blocking, one
// bucket per layer), and the losses and parameters after a few AdamW steps equal the single
// process's within fp32 rounding (bf16: within bf16 rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/communicator.h"
#include "model/sparsity.h"
#include "train/engine.h"
#include "../test_util.h"

using namespace memfit;

namespace {

Communicator & world() {
    static std::unique_ptr<Communicator> c = make_communicator();
    return *c;
}

ModelConfig tiny(bool llama, int layers = 2) { return test::small_family(llama, 37, 32, layers, 4, 48); }

struct DpRun {
    std::vector<float> losses, params;
    CategoryBytes planned_live, planned_reserved, live_peak, reserved_peak;
    std::vector<BufferDecl> buffers;   // the training program's
};

// Global batch G sequences of T tokens per micro-batch, k micro-batches per step.
DpRun train(const ModelConfig & cfg, DType dt, int G, int T, int k, int steps, Communicator * comm, int zero = 0,
            size_t bucket_bytes = 0, bool checking = true, const NmSparsity & sparsity = {}) {
    CpuBackend backend;
    const int N = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
    EngineOptions eo;
    eo.B = G / N;
    eo.T = T;
    eo.grad_accum = k;
    eo.compute = dt;
    eo.flash_attention = true;
    eo.with_eval = false;
    eo.data_parallel = N;
    eo.comm = N > 1 ? comm : nullptr;
    eo.zero = zero;
    eo.bucket_bytes = bucket_bytes;
    eo.checking = checking;   // own allocation per buffer, poisoned after its last use
    eo.sparsity = sparsity;
    Engine e(cfg, backend, eo);
    e.init_params(11);
    OptimHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    DpRun run;
    for (int s = 0; s < steps; ++s) {
        // The same global batch on every rank; this rank takes rows r*B .. r*B+B-1 of each micro-batch.
        std::vector<int32_t> in(size_t(G * T * k)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(100 + s));
        // This data rank's rows of every micro-batch.
        const std::vector<int32_t> my_in = test::rank_rows(in, k, G, T, r, eo.B),
                                   my_tg = test::rank_rows(tg, k, G, T, r, eo.B);
        run.losses.push_back(e.train_step(my_in.data(), my_tg.data(), h).loss);
    }
    run.params = e.full_params();
    run.planned_live = e.planned_peak_live();
    run.planned_reserved = e.planned_reserved();
    run.live_peak = e.ledger().live_peak();
    run.reserved_peak = e.ledger().reserved_peak();
    run.buffers = e.step().program().buffers();
    return run;
}

}  // namespace

// Parameters after training: fp32 within fp32 rounding of the one-process run; bf16 within
// what per-rank rounding of 16-bit gradients can move AdamW by: its normalised update can move a
// parameter with a tiny gradient by up to 2 lr per step. The relative RMS difference of the
// tiny GPT-2 in bf16 measured 0.0089-0.0104 at 2 and 4 ranks (0.0104 since the LM head's
// backward takes the logit gradients in bf16 on CPUs with native bf16 matmuls); bound 2e-2,
// the losses' tolerance.
void expect_same_params(const DpRun & dp, const DpRun & one, DType dt, int steps, float lr) {
    ASSERT_EQ(dp.params.size(), one.params.size());
    double worst = 0, diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < one.params.size(); ++i) {
        const double d = double(dp.params[i]) - double(one.params[i]);
        worst = std::max(worst, std::fabs(d));
        diff2 += d * d;
        norm2 += double(one.params[i]) * double(one.params[i]);
    }
    if (dt == DType::f32) {
        EXPECT_LT(worst, 1e-4) << "largest parameter difference";
    } else {
        EXPECT_LT(worst, 2.0 * lr * steps + 1e-3) << "largest parameter difference";
        EXPECT_LT(std::sqrt(diff2 / norm2), 2e-2) << "relative RMS parameter difference";
    }
}

// Every rank holds (or gathered) the same whole model, bit for bit.
void expect_ranks_agree(Communicator & c, const std::vector<float> & params) {
    const size_t bytes = params.size() * sizeof(float);
    std::vector<float> all(params.size() * size_t(c.size()));
    c.all_gather(params.data(), all.data(), bytes);
    for (int q = 1; q < c.size(); ++q)
        EXPECT_EQ(0, std::memcmp(all.data(), all.data() + size_t(q) * params.size(), bytes))
            << "rank " << q << " holds different weights from rank 0";
}

TEST(DataParallel, EqualsOneProcessOnTheSameGlobalBatch) {
    Communicator & c = world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int G = 4;   // sequences per micro-batch: 2 per rank at N = 2, 1 at N = 4
    for (bool llama : {false, true})
        for (DType dt : {DType::f32, DType::bf16})
            for (int k : {1, 2}) {
                SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + std::string(dtype_name(dt)) + " accum " +
                             std::to_string(k));
                const ModelConfig cfg = tiny(llama);
                const int batch = std::max(G, c.size());
                const DpRun dp = train(cfg, dt, batch, 8, k, 3, &c);
                const DpRun one = train(cfg, dt, batch, 8, k, 3, nullptr);
                const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
                for (size_t s = 0; s < one.losses.size(); ++s)
                    EXPECT_NEAR(dp.losses[s], one.losses[s], tol * std::fabs(one.losses[s])) << "step " << s;
                expect_same_params(dp, one, dt, 3, 1e-2f);
                expect_ranks_agree(c, dp.params);
            }
}

namespace {
// Persistent bytes of one category in a program.
uint64_t persistent_bytes(const std::vector<BufferDecl> & buffers, Category c) {
    uint64_t n = 0;
    for (const auto & b : buffers)
        if (b.persistent && b.category == c) n += b.bytes;
    return n;
}
}  // namespace

// ZeRO stages 1-3 against one process: the same losses and final parameters (within fp32, or
// bf16, rounding), every rank's measured memory equal to its plan, and the model states per rank
// following the ZeRO paper's 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N (mixed precision; fp32:
// 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N), with shards Ψ/N rounded up to 32 elements.
TEST(Zero, EveryStageEqualsOneProcessAndShardsTheModelStates) {
    Communicator & c = world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int N = c.size(), G = std::max(4, N), T = 8, steps = 3;
    for (bool llama : {false, true})
        for (DType dt : {DType::f32, DType::bf16})
            for (int k : {1, 2}) {
                // Six blocks, so that the one or two buckets in flight are less than the whole model.
                const ModelConfig cfg = tiny(llama, 6);
                const DpRun one = train(cfg, dt, G, T, k, steps, nullptr);
                const uint64_t cs = dtype_size(dt), gs = k > 1 ? 4 : cs;
                size_t block = 0;   // elements of one block
                for (const auto & p : make_param_layout(cfg).params)
                    if (p.name.find("h.0.") != std::string::npos || p.name.find("layers.0.") != std::string::npos)
                        block += p.numel;
                for (int zero : {1, 2, 3}) {
                    SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + std::string(dtype_name(dt)) + " accum " +
                                 std::to_string(k) + " zero " + std::to_string(zero));
                    // Buckets of two blocks at stage 2 without accumulation (merging is exercised),
                    // one per block otherwise.
                    const size_t bucket = zero == 2 && k == 1 ? block * gs + 1 : 0;
                    const DpRun dp = train(cfg, dt, G, T, k, steps, &c, zero, bucket);
                    const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
                    for (size_t s = 0; s < one.losses.size(); ++s)
                        EXPECT_NEAR(dp.losses[s], one.losses[s], tol * std::fabs(one.losses[s])) << "step " << s;
                    expect_same_params(dp, one, dt, steps, 1e-2f);
                    expect_ranks_agree(c, dp.params);
                    // Measured = planned, in the arenas a real run uses (the run above checked lifetimes).
                    const DpRun mem = train(cfg, dt, G, T, k, 1, &c, zero, bucket, false);
                    for (size_t cat = 0; cat < kCategoryCount; ++cat) {
                        EXPECT_EQ(mem.planned_live.v[cat], mem.live_peak.v[cat]) << "live " << kCategoryNames[cat];
                        EXPECT_EQ(mem.planned_reserved.v[cat], mem.reserved_peak.v[cat])
                            << "reserved " << kCategoryNames[cat];
                    }
                    // Model states per rank (persistent buffers) against ZeRO's formulas.
                    const uint64_t psi = uint64_t(cfg.num_params());
                    const uint64_t shard = (psi + uint64_t(N) * 32 - 1) / (uint64_t(N) * 32) * 32;
                    const auto & b = dp.buffers;
                    EXPECT_EQ(persistent_bytes(b, Category::parameters), (zero >= 3 ? shard : psi) * cs);
                    EXPECT_EQ(persistent_bytes(b, Category::gradients), (zero >= 2 ? shard : psi) * gs);
                    EXPECT_EQ(persistent_bytes(b, Category::master_weights), dt == DType::f32 ? 0 : shard * 4);
                    EXPECT_EQ(persistent_bytes(b, Category::optimizer_states), shard * 8);
                    const uint64_t states = persistent_bytes(b, Category::parameters) +
                                            persistent_bytes(b, Category::gradients) +
                                            persistent_bytes(b, Category::master_weights) +
                                            persistent_bytes(b, Category::optimizer_states);
                    if (dt == DType::bf16 && k == 1) {
                        const uint64_t want[4] = {16 * psi, 4 * psi + 12 * shard, 2 * psi + 14 * shard, 16 * shard};
                        EXPECT_EQ(states, want[zero]);
                    }
                    // Stage 2/3: the whole gradient (weights) never exist at once beside the shard:
                    // the rest's buckets and one or two blocks' at a time.
                    auto transient = [&](Category cat) {
                        return mem.planned_live.v[size_t(cat)] - persistent_bytes(b, cat);
                    };
                    if (zero >= 2) {
                        EXPECT_LT(transient(Category::gradients), psi * gs * 3 / 4);
                    }
                    if (zero >= 3) {
                        EXPECT_LT(transient(Category::parameters), psi * cs * 3 / 4);
                    }
                }
            }
}

// An fp32 data-parallel run (lr 1e-2) against one process: the losses, the weights on every rank,
// and the plan equal to the measurement.
void expect_fp32_equal(Communicator & c, const DpRun & dp, const DpRun & one, int steps) {
    for (size_t s = 0; s < one.losses.size(); ++s)
        EXPECT_NEAR(dp.losses[s], one.losses[s], 2e-5 * std::fabs(one.losses[s])) << "step " << s;
    expect_same_params(dp, one, DType::f32, steps, 1e-2f);
    expect_ranks_agree(c, dp.params);
    for (size_t cat = 0; cat < kCategoryCount; ++cat)
        EXPECT_EQ(dp.planned_live.v[cat], dp.live_peak.v[cat]) << "live " << kCategoryNames[cat];
}

// Cross-layer sharing (--share-layers 2, six layers in three stored blocks) under data parallel
// at ZeRO 0, 1 and 2 against one process: the same losses and parameters. A shared block's
// gradient bucket opens at its group's highest layer (ZeRO-2 zeroes it there) and is reduced
// after its lowest, so every use's gradient is in the sum.
TEST(DataParallel, SharedBlocksEqualOneProcessAtEveryZeroStage) {
    Communicator & c = world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int G = std::max(4, c.size()), T = 8, steps = 3;
    for (bool llama : {false, true})
        for (int k : {1, 2}) {
            ModelConfig cfg = tiny(llama, 6);
            cfg.share_layers = 2;
            const DpRun one = train(cfg, DType::f32, G, T, k, steps, nullptr);
            ASSERT_EQ(one.params.size(), size_t(cfg.num_params()));
            for (int zero : {0, 1, 2, 3}) {   // ZeRO-3: a group's weights gathered once per direction
                SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " accum " + std::to_string(k) + " zero " +
                             std::to_string(zero));
                const DpRun dp = train(cfg, DType::f32, G, T, k, steps, &c, zero);
                expect_fp32_equal(c, dp, one, steps);
            }
        }
}

// --sparsity 2:4 under data parallel at every ZeRO stage: every rank prunes the same gathered
// weights after the first (dense) step, the masked updates of each rank's shard keep the zeros,
// and losses and weights are the one process's; the plan is still the measurement.
TEST(DataParallel, SparsityEqualsOneProcessAtEveryZeroStage) {
    Communicator & c = world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int G = std::max(4, c.size()), T = 8, steps = 3;
    const NmSparsity sparse{2, 4, 1};
    for (bool llama : {false, true}) {
        const ModelConfig cfg = tiny(llama);
        const ParamLayout layout = make_param_layout(cfg);
        const DpRun one = train(cfg, DType::f32, G, T, 1, steps, nullptr, 0, 0, false, sparse);
        ASSERT_EQ(nm_violations(cfg, layout, one.params.data(), sparse), 0u);
        for (int zero : {0, 1, 2, 3}) {
            SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " zero " + std::to_string(zero));
            const DpRun dp = train(cfg, DType::f32, G, T, 1, steps, &c, zero, 0, false, sparse);
            expect_fp32_equal(c, dp, one, steps);
            EXPECT_EQ(nm_violations(cfg, layout, dp.params.data(), sparse), 0u);
        }
    }
}

// A mixture of experts under data parallel at every ZeRO stage (ZeRO-3 gathers each layer's
// router and experts with the rest of it): without the router losses (a per-rank mean, as
// transformers' under DDP) the one process's losses and weights; with them, every stage the same.
TEST(DataParallel, MixtureOfExpertsAtEveryZeroStage) {
    Communicator & c = world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int G = std::max(4, c.size()), T = 8, steps = 3;
    ModelConfig cfg = model_preset("qwen3-moe-nano");
    cfg.vocab_size = 37;
    cfg.moe.aux_coef = 0;
    const DpRun one = train(cfg, DType::f32, G, T, 1, steps, nullptr);
    for (int zero : {0, 1, 2, 3}) {
        SCOPED_TRACE("zero " + std::to_string(zero));
        expect_fp32_equal(c, train(cfg, DType::f32, G, T, 1, steps, &c, zero), one, steps);
    }
    cfg.moe.aux_coef = 0.01f;
    const DpRun base = train(cfg, DType::f32, G, T, 1, steps, &c, 0);
    for (int zero : {1, 2, 3}) {
        SCOPED_TRACE("with the aux loss, zero " + std::to_string(zero));
        expect_fp32_equal(c, train(cfg, DType::f32, G, T, 1, steps, &c, zero), base, steps);
    }
}
