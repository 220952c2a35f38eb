// ZeRO in one process: with one rank every shard is the whole buffer and every collective a
// copy, so stages 1-3 must train bit for bit like stage 0 while running the sharded program
// (bucket gradients reduce-scattered into the shard, stage 3's per-layer gathered weights).
// The multi-rank equivalence runs under mpirun (tests/mpi/test_data_parallel.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/recompute.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;

namespace {

struct ZeroRun {
    std::vector<float> losses, params;
    TrainState state;
};

// Two sequences of 8 tokens at ZeRO stage `zero`.
EngineOptions options(int zero) {
    EngineOptions eo;
    eo.B = 2;
    eo.T = 8;
    eo.zero = zero;
    return eo;
}

ZeroRun run(const ModelConfig & cfg, DType dt, int k, int zero, const std::string & recompute, bool checking) {
    CpuBackend backend;
    EngineOptions eo = options(zero);
    eo.grad_accum = k;
    eo.compute = dt;
    eo.checking = checking;
    eo.recompute = parse_recompute(recompute, cfg.n_layer);
    Engine e(cfg, backend, eo);
    e.init_params(5);
    OptimHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    ZeroRun r;
    for (int s = 0; s < 3; ++s) {
        std::vector<int32_t> in(size_t(eo.B * eo.T * k)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(40 + s));
        r.losses.push_back(e.train_step(in.data(), tg.data(), h).loss);
    }
    r.params = e.full_params();
    r.state = e.export_state();
    if (!checking)
        for (size_t c = 0; c < kCategoryCount; ++c) {
            EXPECT_EQ(e.planned_peak_live().v[c], e.ledger().live_peak().v[c]) << kCategoryNames[c];
            EXPECT_EQ(e.planned_reserved().v[c], e.ledger().reserved_peak().v[c]) << kCategoryNames[c];
        }
    return r;
}

ModelConfig config(bool llama) { return test::small_family(llama, 41, 32, 3, 4, 48, 32); }

}  // namespace

TEST(ZeroOneProcess, EveryStageTrainsBitwiseLikeStageZero) {
    for (bool llama : {false, true})
        for (DType dt : {DType::f32, DType::bf16})
            for (int k : {1, 2})
                for (const char * rc : {"none", "selective"}) {
                    const ModelConfig cfg = config(llama);
                    const ZeroRun ref = run(cfg, dt, k, 0, rc, false);
                    for (int zero : {1, 2, 3}) {
                        SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + std::string(dtype_name(dt)) +
                                     " accum " + std::to_string(k) + " recompute " + rc + " zero " +
                                     std::to_string(zero));
                        // Checking mode (poisoned buffers) on one family and precision: the
                        // lifetimes of every stage's buffers, accumulation and recomputation.
                        for (bool checking : {false, true}) {
                            if (checking && !(llama && dt == DType::bf16)) continue;
                            const ZeroRun z = run(cfg, dt, k, zero, rc, checking);
                            ASSERT_EQ(ref.params.size(), z.params.size());
                            if (k == 1 || zero < 2) {
                                EXPECT_EQ(ref.losses, z.losses);
                                EXPECT_EQ(0, std::memcmp(ref.params.data(), z.params.data(), ref.params.size() * 4));
                            } else if (dt == DType::f32) {
                                // Accumulating, stage 0 adds each micro-batch's weight gradients into
                                // one buffer, stages 2-3 sum a micro-batch's bucket and then add it to
                                // the shard: the same sums, rounded in another order.
                                for (size_t s = 0; s < ref.losses.size(); ++s)
                                    EXPECT_NEAR(ref.losses[s], z.losses[s], 1e-5 * ref.losses[s]);
                                double worst = 0;
                                for (size_t i = 0; i < ref.params.size(); ++i)
                                    worst = std::max(worst, double(std::fabs(ref.params[i] - z.params[i])));
                                EXPECT_LT(worst, 1e-4);
                            } else {
                                // bf16, stages 2-3: each micro-batch's gradients rounded to bf16 in
                                // their bucket before the fp32 shard sums them (FSDP's and DeepSpeed's
                                // mixed precision); stage 0 sums them in fp32. Losses within bf16's
                                // rounding; AdamW's first steps move a weight by about lr whatever its
                                // gradient's size, so where micro-batches' gradients cancel a weight
                                // can move the other way: bounded over the whole model, not one by one.
                                for (size_t s = 0; s < ref.losses.size(); ++s)
                                    EXPECT_NEAR(ref.losses[s], z.losses[s], 1e-3 * ref.losses[s]);
                                double d2 = 0, r2 = 0;
                                for (size_t i = 0; i < ref.params.size(); ++i) {
                                    d2 += double(ref.params[i] - z.params[i]) * double(ref.params[i] - z.params[i]);
                                    r2 += double(ref.params[i]) * double(ref.params[i]);
                                }
                                EXPECT_LT(std::sqrt(d2 / r2), 0.02) << std::sqrt(d2 / r2);
                            }
                            EXPECT_EQ(z.state.offset, 0u);
                            EXPECT_EQ(z.state.total, ref.params.size());
                        }
                    }
                }
}

TEST(ZeroOneProcess, StateMovesBetweenStages) {
    // A stage-0 state imported into a stage-3 engine continues exactly as stage 0 does.
    const ModelConfig cfg = config(false);
    CpuBackend backend;
    Engine a(cfg, backend, options(0));
    a.init_params(9);
    Engine b(cfg, backend, options(3));
    b.import_state(a.export_state());
    std::vector<int32_t> in(16), tg(16);
    test::random_batch(in, tg, cfg.vocab_size, 3);
    OptimHyper h;
    EXPECT_EQ(a.train_step(in.data(), tg.data(), h).loss, b.train_step(in.data(), tg.data(), h).loss);
    EXPECT_EQ(a.full_params(), b.full_params());
    // A state that does not cover the shard is refused with the ranges.
    TrainState bad = a.export_state();
    bad.params.resize(10);
    bad.m.resize(10);
    bad.v.resize(10);
    try {
        b.import_state(bad);
        FAIL() << "a short state was accepted";
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find("[0, 10)"), std::string::npos) << e.what();
    }
}

TEST(ZeroOneProcess, BadStageAndSegmentsAreClearErrors) {
    const ModelConfig cfg = config(false);
    CpuBackend backend;
    EXPECT_THROW(Engine(cfg, backend, options(4)), ConfigError);
    EngineOptions eo = options(3);
    eo.recompute = parse_recompute("every:2", cfg.n_layer);
    try {
        Engine e(cfg, backend, eo);
        FAIL() << "zero 3 with segment recomputation was accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("--zero 3"), std::string::npos) << e.what();
    }
}

// ZeRO 2/3 with accumulation in bf16 (FSDP's and DeepSpeed's mixed precision): each micro-batch's
// buckets stay bf16, reduce-scattered in place and added into the fp32 shard, so the gradient
// bytes do not grow with --grad-accum: the same for every k > 1, the buckets as at k = 1, no
// receive buffers, and past k = 1 only the shard's widening to fp32. Planned for rank 0 of 4
// (StepPlans records and places a rank's programs without communicators).
TEST(ZeroAccumulation, GradientBytesDoNotGrowWithAccumulation) {
    for (bool llama : {false, true})
        for (int zero : {2, 3}) {
            SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " zero " + std::to_string(zero));
            const ModelConfig cfg = config(llama);
            CpuBackend backend;
            auto plans = [&](int k) {
                EngineOptions eo = options(zero);
                eo.compute = DType::bf16;
                eo.grad_accum = k;
                eo.data_parallel = 4;
                return std::make_unique<StepPlans>(cfg, backend, eo);
            };
            auto bytes_of = [](const TrainStep & st, const std::string & prefix) {
                size_t n = 0;
                for (const auto & b : st.program().buffers())
                    if (b.name.rfind(prefix, 0) == 0) n += b.bytes;
                return n;
            };
            const auto one = plans(1);
            const size_t g1 = one->peak_live()[Category::gradients];
            const size_t shard16 = one->train->program().buffer(one->train->grads).bytes;
            std::vector<size_t> g;
            for (int k : {2, 4, 8}) {
                const auto p = plans(k);
                g.push_back(p->peak_live()[Category::gradients]);
                for (const TrainStep * st : {p->train.get(), p->first.get()}) {
                    EXPECT_EQ(st->grad_dtype(), DType::f32);
                    EXPECT_EQ(st->program().buffer(st->grads).bytes, 2 * shard16);   // the fp32 shard
                    EXPECT_EQ(bytes_of(*st, "gradients.bucket"), bytes_of(*one->train, "gradients.bucket"));
                    EXPECT_EQ(bytes_of(*st, "gradients.recv"), 0u);
                }
                EXPECT_EQ(g.back(), g1 + shard16);   // the shard's widening, nothing else
            }
            EXPECT_EQ(g[0], g[1]);
            EXPECT_EQ(g[1], g[2]);
        }
}
