// LoRA and QLoRA sharded, against one process. Under ZeRO 3 the frozen base (in the compute
// dtype, int8 or nf4) is sharded over the data-parallel ranks like the adapters and gathered layer
// by layer (FSDP-QLoRA), so each rank holds its shard of the base's bytes, while the losses, the
// trained adapters and the base as the kernels see it are the one process's. Under tensor
// parallelism the adapters split with their projections and each tensor rank quantizes its own
// slice of the base: the run equals one process computing with that same (dequantized) base. The
// plan is the measurement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/groups.h"
#include "mpi_test_env.h"
#include "train/engine.h"
#include "../test_util.h"

using namespace memfit;

namespace {

struct LoraRun {
    std::vector<float> losses, adapters, base;
    CategoryBytes planned_live, planned_reserved, live_peak, reserved_peak;
    uint64_t base_bytes = 0;   // this rank's persistent frozen-base buffers
};

// Global batch G sequences of T tokens per micro-batch, k micro-batches per step, this data rank's
// rows; clipped at a norm below the gradients' so that every step clips.
LoraRun run_steps(Engine & e, const ModelConfig & cfg, int G, int T, int k, int steps, int dp_rank, uint64_t seed0) {
    OptimHyper h;
    h.lr = 1e-2f;
    h.clip = 0.05f;
    LoraRun run;
    const int B = e.options().B;
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(size_t(G * T * k)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, seed0 + uint64_t(s));
        const std::vector<int32_t> my_in = test::rank_rows(in, k, G, T, dp_rank, B),
                                   my_tg = test::rank_rows(tg, k, G, T, dp_rank, B);
        h.t = s + 1;
        run.losses.push_back(e.train_step(my_in.data(), my_tg.data(), h).loss);
    }
    run.adapters = e.full_params();
    run.base = e.base_weights();
    run.planned_live = e.planned_peak_live();
    run.planned_reserved = e.planned_reserved();
    run.live_peak = e.ledger().live_peak();
    run.reserved_peak = e.ledger().reserved_peak();
    for (const auto & b : e.step().program().buffers())
        if (b.persistent && (b.name == "parameters" || b.name == "parameters.quantized")) run.base_bytes += b.bytes;
    return run;
}

// Measured = planned, in the arenas a real run uses.
void expect_plan_is_measured(const LoraRun & mem) {
    for (size_t cat = 0; cat < kCategoryCount; ++cat) {
        EXPECT_EQ(mem.planned_live.v[cat], mem.live_peak.v[cat]) << "live " << kCategoryNames[cat];
        EXPECT_EQ(mem.planned_reserved.v[cat], mem.reserved_peak.v[cat]) << "reserved " << kCategoryNames[cat];
    }
}

LoraRun train(const ModelConfig & cfg, DType dt, BaseWeights bw, int G, int T, int k, int steps, Communicator * comm,
              int zero, bool checking) {
    CpuBackend backend;
    const int N = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
    EngineOptions eo;
    eo.B = G / N;
    eo.T = T;
    eo.grad_accum = k;
    eo.compute = dt;
    eo.with_eval = false;
    eo.data_parallel = N;
    eo.comm = N > 1 ? comm : nullptr;
    eo.zero = zero;
    eo.checking = checking;
    eo.lora = test::lora_options(cfg, 4, bw);
    Engine e(cfg, backend, eo);
    e.init_params(5);
    return run_steps(e, cfg, G, T, k, steps, r, 300);
}

}  // namespace

TEST(Zero3, LoraShardsTheFrozenBaseAndEqualsOneProcess) {
    Communicator & c = test::world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int N = c.size(), G = std::max(4, N), T = 8, steps = 3;
    for (bool llama : {true, false})
        for (BaseWeights bw : {BaseWeights::compute, BaseWeights::int8, BaseWeights::nf4})
            for (int k : {1, 2}) {
                const DType dt = bw == BaseWeights::compute && !llama ? DType::f32 : DType::bf16;
                SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + base_weights_name(bw) + " " +
                             std::string(dtype_name(dt)) + " accum " + std::to_string(k));
                // Four blocks of 64 channels: the nf4 projections hold whole 64-element blocks.
                const ModelConfig cfg = test::small_family(llama, 37, 64, 4, 4, 128);
                const LoraRun one = train(cfg, dt, bw, G, T, k, steps, nullptr, 0, true);
                const LoraRun z3 = train(cfg, dt, bw, G, T, k, steps, &c, 3, true);
                const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
                for (size_t s = 0; s < one.losses.size(); ++s)
                    EXPECT_NEAR(z3.losses[s], one.losses[s], tol * std::fabs(one.losses[s])) << "step " << s;
                ASSERT_EQ(z3.adapters.size(), one.adapters.size());
                double diff2 = 0, norm2 = 0;
                for (size_t i = 0; i < one.adapters.size(); ++i) {
                    diff2 += std::pow(double(z3.adapters[i]) - one.adapters[i], 2);
                    norm2 += std::pow(double(one.adapters[i]), 2);
                }
                EXPECT_LT(std::sqrt(diff2 / norm2), dt == DType::f32 ? 1e-5 : 2e-2) << "relative RMS adapter difference";
                // The base gathered from the shards is the one process's, bit for bit.
                EXPECT_EQ(z3.base, one.base);
                // Each rank holds its shard: 1/N of the base's bytes, up to the shards' alignment.
                EXPECT_LE(z3.base_bytes, one.base_bytes / uint64_t(N) + 2 * 64 * 4);
                EXPECT_GE(z3.base_bytes * uint64_t(N), one.base_bytes);
                expect_plan_is_measured(train(cfg, dt, bw, G, T, k, 1, &c, 3, false));
            }
}

namespace {

// tp > 1: over the world as tp x dp, an nf4 base; else one process computing in fp32 with
// `base` (the whole model's weights as the tensor-parallel run's kernels saw them).
LoraRun train_tp(const ModelConfig & cfg, int tp, int k, int steps, const std::vector<float> & base, bool checking) {
    CpuBackend backend;
    std::unique_ptr<ProcessGroups> pg;
    EngineOptions eo;
    const int G = 4, T = 8;
    int D = 1, dp_rank = 0;
    if (tp > 1) {
        pg = std::make_unique<ProcessGroups>(test::world(), derive_layout(test::world().size(), tp, 1));
        D = pg->layout.dp;
        dp_rank = pg->coords.dp;
        eo.data_parallel = D;
        eo.comm = D > 1 ? pg->dp.get() : nullptr;
        eo.tensor_parallel = tp;
        eo.tp_comm = pg->tp.get();
        eo.zero = D > 1 ? 3 : 0;
    }
    eo.B = G / D;
    eo.T = T;
    eo.grad_accum = k;
    eo.with_eval = false;
    eo.checking = checking;
    eo.lora = test::lora_options(cfg, 4, tp > 1 ? BaseWeights::nf4 : BaseWeights::compute);
    Engine e(cfg, backend, eo);
    e.init_params(5);
    if (tp == 1) e.set_base(base.data());
    return run_steps(e, cfg, G, T, k, steps, dp_rank, 500);
}

}  // namespace

TEST(TensorParallel, QloraEqualsOneProcessOnItsDequantizedBase) {
    Communicator & c = test::world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    ASSERT_EQ(c.size() % 2, 0);
    for (bool llama : {true, false})
        for (int k : {1, 2}) {
            SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " accum " + std::to_string(k));
            // Every projection adapted: a column-parallel one's B split by rows, a row-parallel
            // one's A by columns (2 KV heads over 2 tensor ranks).
            const ModelConfig cfg = test::small_family(llama, 37, 64, 2, 4, 128);
            const LoraRun tp = train_tp(cfg, 2, k, 3, {}, true);
            const LoraRun one = train_tp(cfg, 1, k, 3, tp.base, true);
            ASSERT_EQ(one.base, tp.base) << "the one process computes with the tensor-parallel run's base";
            for (size_t s = 0; s < one.losses.size(); ++s)
                EXPECT_NEAR(tp.losses[s], one.losses[s], 2e-5 * std::fabs(one.losses[s])) << "step " << s;
            ASSERT_EQ(tp.adapters.size(), one.adapters.size());
            double diff2 = 0, norm2 = 0;
            for (size_t i = 0; i < one.adapters.size(); ++i) {
                diff2 += std::pow(double(tp.adapters[i]) - one.adapters[i], 2);
                norm2 += std::pow(double(one.adapters[i]), 2);
            }
            EXPECT_LT(std::sqrt(diff2 / norm2), 1e-5) << "relative RMS adapter difference";
            expect_plan_is_measured(train_tp(cfg, 2, k, 1, {}, false));
        }
}
