// Mixed precision: bf16/fp16 weights and activations with fp32 master weights and AdamW moments
// (16 bytes per parameter; fp32 gradients when accumulating), planned == measured, a short bf16
// run tracking fp32's loss curve, and fp16 dynamic loss scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::random_batch;
using memfit::test::small_config;

namespace {

EngineOptions options(DType compute, int B, int T, int accum = 1) {
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.grad_accum = accum;
    eo.compute = compute;
    eo.flash_attention = true;
    return eo;
}

// A learnable stream: token t+1 = (token t * 5 + 3) mod V with occasional noise.
void pattern_batch(std::vector<int32_t> & in, std::vector<int32_t> & tg, int V, int T, uint64_t seed) {
    std::mt19937 rng{uint32_t(seed)};
    for (size_t s = 0; s < in.size() / size_t(T); ++s) {
        int x = int(rng() % uint32_t(V));
        for (int t = 0; t < T; ++t) {
            const int y = rng() % 8 == 0 ? int(rng() % uint32_t(V)) : (x * 5 + 3) % V;
            in[s * size_t(T) + size_t(t)] = x;
            tg[s * size_t(T) + size_t(t)] = y;
            x = y;
        }
    }
}

}  // namespace

TEST(Precision, SixteenBytesPerParameterAndHalfTheActivations) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(64, 64, 2, 4);
    const StepPlans f32(cfg, backend, options(DType::f32, 4, 32));
    const StepPlans b16(cfg, backend, options(DType::bf16, 4, 32));
    const StepPlans acc(cfg, backend, options(DType::bf16, 2, 32, 2));
    const uint64_t P = f32.train->layout().total;
    const CategoryBytes a = f32.peak_live(), b = b16.peak_live(), c = acc.peak_live();
    EXPECT_EQ(a[Category::parameters], 4 * P);
    EXPECT_EQ(b[Category::parameters], 2 * P);          // bf16 compute weights
    EXPECT_EQ(b[Category::gradients], 2 * P);           // bf16 gradients (one micro-batch)
    EXPECT_EQ(b[Category::master_weights], 4 * P);      // fp32 master weights
    EXPECT_EQ(b[Category::optimizer_states], 8 * P);    // fp32 AdamW m and v
    EXPECT_EQ(b[Category::parameters] + b[Category::gradients] + b[Category::master_weights] +
                  b[Category::optimizer_states],
              16 * P);
    EXPECT_EQ(c[Category::gradients], 4 * P);           // fp32 when accumulated over micro-batches
    // Activations are stored in bf16; only the small f32 statistics, logits and batch stay f32.
    EXPECT_LT(double(b[Category::activations]), 0.6 * double(a[Category::activations]));
    EXPECT_GT(double(b[Category::activations]), 0.4 * double(a[Category::activations]));
}

TEST(Precision, PlannedEqualsMeasuredInBf16AndFp16) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(61, 32, 2, 2);
    for (DType dt : {DType::bf16, DType::f16})
        for (int accum : {1, 2}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " accum " + std::to_string(accum));
            Engine e(cfg, backend, options(dt, 2, 16, accum));
            e.init_params(1);
            std::vector<int32_t> in(size_t(2 * 16 * accum)), tg(in.size());
            for (int s = 0; s < 2; ++s) {
                random_batch(in, tg, 61, uint64_t(s));
                e.train_step(in.data(), tg.data(), OptimHyper{});
                e.eval_loss(in.data(), tg.data());
            }
            for (size_t c = 0; c < kCategoryCount; ++c) {
                EXPECT_EQ(e.planned_peak_live().v[c], e.ledger().live_peak().v[c]) << kCategoryNames[c];
                EXPECT_EQ(e.planned_reserved().v[c], e.ledger().reserved_peak().v[c]) << kCategoryNames[c];
            }
        }
}

// Documented tolerance (README, "Mixed precision"): over 40 steps of a small model learning a
// pattern, the bf16 loss stays within 3% of fp32's at every step (bf16 keeps 8 mantissa bits;
// the fp32 master weights keep the updates exact), and both learn (the loss falls by half).
TEST(Precision, Bf16LossTracksFp32) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(32, 64, 2, 4);
    const int B = 4, T = 32, steps = 40;
    std::vector<float> curve[2];
    for (DType dt : {DType::f32, DType::bf16}) {
        Engine e(cfg, backend, options(dt, B, T));
        e.init_params(9);
        std::vector<int32_t> in(size_t(B * T)), tg(in.size());
        for (int s = 0; s < steps; ++s) {
            pattern_batch(in, tg, 32, T, uint64_t(s));
            curve[dt == DType::bf16].push_back(e.train_step(in.data(), tg.data(), OptimHyper{3e-3f}).loss);
        }
    }
    for (int s = 0; s < steps; ++s)
        EXPECT_NEAR(curve[1][size_t(s)], curve[0][size_t(s)], 0.03 * curve[0][size_t(s)]) << "step " << s;
    EXPECT_LT(curve[0].back(), 0.5 * curve[0].front());
    EXPECT_LT(curve[1].back(), 0.5 * curve[1].front());
}

TEST(Precision, LossScalerHalvesOnOverflowAndGrowsAfterCleanSteps) {
    LossScaler s;
    EXPECT_EQ(s.scale, 65536.0f);
    s.growth_interval = 3;
    EXPECT_FALSE(s.update(false));
    EXPECT_EQ(s.scale, 32768.0f);
    EXPECT_EQ(s.skipped, 1);
    EXPECT_TRUE(s.update(true));
    EXPECT_TRUE(s.update(true));
    EXPECT_EQ(s.scale, 32768.0f);
    EXPECT_TRUE(s.update(true));
    EXPECT_EQ(s.scale, 65536.0f);   // doubled after 3 clean steps
    EXPECT_FALSE(s.update(false));
    EXPECT_TRUE(s.update(true));
    EXPECT_EQ(s.clean, 1);          // an overflow restarts the count
}

TEST(Precision, Fp16SkipsOverflowingStepsWithoutTouchingTheWeights) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(32, 32, 2, 2);
    Engine e(cfg, backend, options(DType::f16, 2, 16));
    e.init_params(4);
    EXPECT_EQ(e.loss_scaler().scale, 65536.0f);
    // A scale that overflows fp16 gradients for sure: the step must be skipped.
    TrainState st = e.export_state();
    st.scaler.scale = 1e30f;
    e.import_state(st);
    std::vector<int32_t> in(32), tg(32);
    random_batch(in, tg, 32, 1);
    const std::vector<float> before(e.params(), e.params() + e.step().layout().total);
    const StepResult r = e.train_step(in.data(), tg.data(), OptimHyper{1e-2f});
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(e.loss_scaler().skipped, 1);
    EXPECT_EQ(e.loss_scaler().scale, 5e29f);
    EXPECT_EQ(e.steps_done(), 0);
    EXPECT_EQ(0, std::memcmp(before.data(), e.params(), before.size() * 4));
    // From the default scale on, an occasional overflow halves the scale and skips that step;
    // the rest apply and learn.
    st = e.export_state();
    st.scaler.scale = 65536.0f;
    st.scaler.skipped = 0;
    e.import_state(st);
    float first = 0, last = 0;
    for (int s = 0; s < 30; ++s) {
        pattern_batch(in, tg, 32, 16, uint64_t(s));
        const StepResult q = e.train_step(in.data(), tg.data(), OptimHyper{3e-3f});
        EXPECT_EQ(q.skipped, !std::isfinite(q.grad_norm)) << s;
        (s == 0 ? first : last) = q.loss;
    }
    EXPECT_EQ(e.steps_done() + e.loss_scaler().skipped, 30);
    EXPECT_LE(e.loss_scaler().skipped, 3);
    EXPECT_LT(last, first);
}

// --master-weights bf16-sr: no fp32 master weights (planned and measured: 0 bytes), the bf16
// weights updated with stochastic rounding; the loss tracks the fp32 master weights' run, a
// state exported mid-run and imported resumes bit for bit, and offloading the moments too
// changes nothing.
TEST(Precision, Bf16SrDropsTheMasterWeights) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(64, 32, 2, 2);
    const int B = 4, T = 16, steps = 12;
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    auto run = [&](EngineOptions eo, int resume_at, CategoryBytes * live) {
        auto e = std::make_unique<Engine>(cfg, backend, eo);
        e->init_params(2);
        OptimHyper h;
        h.lr = 3e-3f;
        std::vector<float> losses;
        for (int s = 0; s < steps; ++s) {
            if (s == resume_at) {
                const TrainState mid = e->export_state();
                e = std::make_unique<Engine>(cfg, backend, eo);
                e->import_state(mid);
            }
            pattern_batch(in, tg, cfg.vocab_size, T, uint64_t(s));
            losses.push_back(e->train_step(in.data(), tg.data(), h).loss);
        }
        if (live) {
            *live = e->planned_peak_live();
            EXPECT_EQ(e->planned_peak_live().total(), e->ledger().live_peak().total());
        }
        losses.push_back(0);
        const std::vector<float> p = e->export_state().params;
        losses.insert(losses.end(), p.begin(), p.end());
        return losses;
    };
    EngineOptions eo = options(DType::bf16, B, T);
    eo.with_eval = false;
    CategoryBytes master_live, sr_live;
    const std::vector<float> master = run(eo, -1, &master_live);
    eo.sr_master = true;
    const std::vector<float> sr = run(eo, -1, &sr_live), resumed = run(eo, 5, nullptr);
    EXPECT_GT(master_live[Category::master_weights], 0u);
    EXPECT_EQ(sr_live[Category::master_weights], 0u);
    EXPECT_EQ(master_live.total() - sr_live.total(), master_live[Category::master_weights]);
    for (int s = 0; s < steps; ++s) EXPECT_NEAR(sr[size_t(s)], master[size_t(s)], 0.03 * master[size_t(s)]) << s;
    EXPECT_LT(sr[steps - 1], sr[0]);
    EXPECT_NE(sr, master);
    EXPECT_EQ(resumed, sr);
    eo.offload = 1, eo.offload_dir = ::testing::TempDir(), eo.offload_unit = 512;
    EXPECT_EQ(run(eo, -1, nullptr), sr);
}
