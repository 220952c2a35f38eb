// The engine against its own plan: planned == measured bytes per category, checking mode
// (per-buffer allocations poisoned after their declared last use) gives bitwise-equal results,
// budgets refuse plans that do not fit, and the reference fixture replays within 1e-4.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/moments8.h"
#include "memory/budget.h"
#include "memory/timeline.h"
#include "train/engine.h"
#include "app/verify.h"
#include "test_util.h"
#include "optim_ops.h"

using namespace memfit;

using memfit::test::random_batch;
using memfit::test::small_config;

struct PlanCase { int V, C, L, NH, B, T, chunk = 0; bool flash = false; const char * recompute = "none"; };

class PlannedEqualsMeasured : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlannedEqualsMeasured, PerCategoryByteForByte) {
    const PlanCase pc = GetParam();
    CpuBackend backend;
    EngineOptions eo;
    eo.B = pc.B;
    eo.T = pc.T;
    eo.loss_chunk = pc.chunk;
    eo.flash_attention = pc.flash;
    eo.recompute = parse_recompute(pc.recompute, pc.L);
    Engine e(small_config(pc.V, pc.C, pc.L, pc.NH), backend, eo);
    e.init_params(1);
    std::vector<int32_t> in(static_cast<size_t>(pc.B * pc.T)), tg(in.size());
    for (int s = 0; s < 2; ++s) {
        random_batch(in, tg, pc.V, uint64_t(s));
        e.train_step(in.data(), tg.data(), OptimHyper{});
        e.eval_loss(in.data(), tg.data());
    }
    const CategoryBytes plan_live = e.planned_peak_live(), plan_rsv = e.planned_reserved();
    const Ledger & L = e.ledger();
    for (size_t c = 0; c < kCategoryCount; ++c) {
        SCOPED_TRACE(std::string(kCategoryNames[c]));
        EXPECT_EQ(plan_live.v[c], L.live_peak().v[c]);
        EXPECT_EQ(plan_rsv.v[c], L.reserved_peak().v[c]);
    }
    EXPECT_EQ(e.plan().peak_live_total, L.live_total_peak());
    // Persistent model state: 4 bytes per parameter each for weights, gradients, and 2x for AdamW.
    const uint64_t P = uint64_t(e.step().layout().total) * 4;
    EXPECT_EQ(L.live_peak()[Category::parameters], P);
    EXPECT_EQ(L.live_peak()[Category::gradients], P);
    EXPECT_EQ(L.live_peak()[Category::optimizer_states], 2 * P);
    // The arena is at least the live peak of the transient buffers and not absurdly larger.
    const uint64_t act_transient_peak = plan_live[Category::activations] - e.plan().persistent_live[Category::activations];
    EXPECT_GE(e.plan().transient[Category::activations], act_transient_peak);
    EXPECT_LE(double(e.plan().transient[Category::activations]), 1.25 * double(act_transient_peak) + 4096);
}

INSTANTIATE_TEST_SUITE_P(Configs, PlannedEqualsMeasured,
                         ::testing::Values(PlanCase{256, 64, 2, 4, 4, 32}, PlanCase{101, 48, 1, 3, 2, 13},
                                           PlanCase{512, 128, 3, 4, 2, 64}, PlanCase{1000, 32, 2, 2, 8, 16},
                                           PlanCase{1000, 32, 2, 2, 8, 16, 24}, PlanCase{101, 48, 1, 3, 2, 13, 5},
                                           PlanCase{256, 64, 2, 4, 2, 64, 0, true},
                                           PlanCase{300, 48, 2, 3, 2, 50, 33, true},
                                           PlanCase{256, 64, 3, 4, 2, 32, 0, false, "full"},
                                           PlanCase{256, 64, 5, 4, 2, 32, 16, true, "every:2"},
                                           PlanCase{256, 64, 3, 4, 2, 32, 0, false, "selective"}),
                         [](const ::testing::TestParamInfo<PlanCase> & i) {
                             const PlanCase & c = i.param;
                             return "V" + std::to_string(c.V) + "_C" + std::to_string(c.C) + "_L" +
                                    std::to_string(c.L) + "_B" + std::to_string(c.B) + "_T" + std::to_string(c.T) +
                                    "_chunk" + std::to_string(c.chunk) + (c.flash ? "_flash" : "") + "_rc" +
                                    std::string(c.recompute).substr(0, 3) + (std::string(c.recompute).find(':') != std::string::npos ? std::string(c.recompute).substr(6) : "");
                         });

TEST(Engine, ActivationsGrowWithBatchAndQuadraticallyWithSeq) {
    CpuBackend backend;
    auto act = [&](int B, int T) {
        EngineOptions eo;
        eo.B = B;
        eo.T = T;
        eo.with_eval = false;
        TrainStep s(small_config(256, 64, 2, 4, 128), B, T, StepMode::train, &backend);
        return plan_memory(s.program()).peak_live[Category::activations];
    };
    EXPECT_GT(act(4, 32), act(2, 32));
    // Saved attention probabilities are B*NH*T*T: doubling T more than doubles activations.
    EXPECT_GT(act(2, 64), 2 * act(2, 32));
}

TEST(Engine, CheckingModeGivesBitwiseEqualResults) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(128, 32, 2, 2);
    std::vector<float> params[2];
    float losses[2];
    for (int mode = 0; mode < 2; ++mode) {
        EngineOptions eo;
        eo.B = 2;
        eo.T = 16;
        eo.checking = mode == 1;
        Engine e(cfg, backend, eo);
        e.init_params(7);
        std::vector<int32_t> in(32), tg(32);
        for (int s = 0; s < 3; ++s) {
            random_batch(in, tg, 128, uint64_t(s));
            losses[mode] = e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}).loss;
        }
        losses[mode] += e.eval_loss(in.data(), tg.data());
        params[mode].assign(e.params(), e.params() + e.step().layout().total);
    }
    EXPECT_EQ(losses[0], losses[1]);
    ASSERT_EQ(params[0].size(), params[1].size());
    EXPECT_EQ(0, std::memcmp(params[0].data(), params[1].data(), params[0].size() * 4));
}

TEST(Engine, BudgetRefusesBeforeAllocating) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 4;
    eo.T = 32;
    eo.budget = 1024 * 1024;   // 1 MiB: far too small
    try {
        Engine e(small_config(256, 64, 2, 4), backend, eo);
        FAIL() << "expected OutOfMemory";
    } catch (const OutOfMemory & err) {
        const std::string m = err.what();
        EXPECT_NE(m.find("budget is 1.00 MiB"), std::string::npos) << m;
        EXPECT_NE(m.find("activations"), std::string::npos) << m;
        EXPECT_NE(m.find("hint:"), std::string::npos) << m;
    }
}

TEST(Engine, LossDecreasesOnARepeatedBatch) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2;
    eo.T = 16;
    Engine e(small_config(64, 32, 2, 2), backend, eo);
    e.init_params(3);
    std::vector<int32_t> in(32), tg(32);
    random_batch(in, tg, 64, 9);
    const float first = e.train_step(in.data(), tg.data(), OptimHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1}).loss;
    float last = first;
    for (int s = 0; s < 30; ++s) last = e.train_step(in.data(), tg.data(), OptimHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1}).loss;
    EXPECT_NEAR(first, std::log(64.0f), 0.3f);   // near-uniform predictions at initialisation
    EXPECT_LT(last, 0.5f * first);
}

TEST(Verify, SharedGpt2FixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/gpt2_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_TRUE(r.json["errors"].contains("grad.h.1.attn.c_attn.weight"));
    EXPECT_TRUE(r.json["errors"].contains("step2.wte.weight"));
}

// GPT-2 with the exact GELU (activation_function "gelu"), made by tests/data/make_gpt2_fixtures.py:
// its loss, logits, gradients and two AdamW steps within 1e-4, where the tanh GELU is not.
TEST(Verify, Gpt2WithTheExactGeluWithin1e4) {
    const std::string path = std::string(MEMFIT_TEST_DATA) + "/gpt2_gelu_tiny.safetensors";
    const VerifyReport r = verify_fixture(path);
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_TRUE(r.json["errors"].contains("grad.h.1.mlp.c_fc.weight"));
    EXPECT_TRUE(r.json["errors"].contains("step2.h.0.mlp.c_fc.weight"));
}

TEST(Verify, FixtureInCheckingModeToo) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/gpt2_tiny.safetensors", 1e-4, true);
    EXPECT_TRUE(r.ok) << r.json.dump(2);
}

TEST(Verify, RelativeError) {
    const float a[3] = {1, 2, 3}, b[3] = {1, 2, 4}, z[3] = {0, 0, 0};
    EXPECT_NEAR(relative_error(a, b, 3), 1.0 / std::sqrt(21.0), 1e-12);
    EXPECT_NEAR(relative_error(a, z, 3), std::sqrt(14.0), 1e-12);
    EXPECT_EQ(relative_error(a, a, 3), 0.0);
}

TEST(Engine, TimelineRecordsEveryOpWithLedgerBytes) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2;
    eo.T = 16;
    eo.with_eval = false;
    Engine e(small_config(64, 32, 2, 2), backend, eo);
    e.init_params(1);
    Timeline tl;
    e.set_timeline(&tl);
    std::vector<int32_t> in(32), tg(32);
    random_batch(in, tg, 64, 1);
    e.train_step(in.data(), tg.data(), OptimHyper{});
    const Program & p = e.step().program();
    ASSERT_EQ(int(tl.events.size()), p.num_ops());
    uint64_t peak = 0;
    for (size_t i = 0; i < tl.events.size(); ++i) {
        EXPECT_EQ(tl.events[i].op, int(i));
        EXPECT_STREQ(tl.events[i].name, p.ops()[i].name);
        EXPECT_EQ(tl.events[i].phase, p.ops()[i].phase);
        EXPECT_LE(tl.events[i].begin_us, tl.events[i].end_us);
        peak = std::max(peak, tl.events[i].live.total());
    }
    EXPECT_EQ(peak, e.plan().peak_live_total);
    EXPECT_EQ(tl.events[size_t(e.plan().peak_op)].live.total(), e.plan().peak_live_total);
    // A second step replaces the first step's events.
    e.train_step(in.data(), tg.data(), OptimHyper{});
    EXPECT_EQ(int(tl.events.size()), p.num_ops());
    e.set_timeline(nullptr);
}

TEST(Engine, ChunkedLossMatchesTheWholeBatchAndStoresLess) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(500, 32, 2, 2);
    std::vector<float> params[2];
    float losses[2] = {0, 0}, evals[2] = {0, 0};
    uint64_t act_peak[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
        EngineOptions eo;
        eo.B = 4;
        eo.T = 16;
        eo.loss_chunk = k == 0 ? 0 : 7;   // 64 rows: 9 full chunks and a remainder of 1
        Engine e(cfg, backend, eo);
        e.init_params(11);
        std::vector<int32_t> in(64), tg(64);
        for (int s = 0; s < 3; ++s) {
            random_batch(in, tg, 500, uint64_t(s));
            losses[k] = e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}).loss;
        }
        evals[k] = e.eval_loss(in.data(), tg.data());
        params[k].assign(e.params(), e.params() + e.step().layout().total);
        act_peak[k] = e.plan().peak_live[Category::activations];
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-5 * std::fabs(losses[0]));
    EXPECT_NEAR(evals[1], evals[0], 1e-5 * std::fabs(evals[0]));
    EXPECT_LT(relative_error(params[1].data(), params[0].data(), params[0].size()), 1e-5);
    // The whole logits are 64 x 500 floats; chunks hold 7 x 500.
    EXPECT_LE(act_peak[1] + (64 - 7) * 500 * 4 - 64 * 32 * 4, act_peak[0]);
}

TEST(Engine, FlashAttentionMatchesNaiveAndDropsTheQuadraticTerm) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(97, 48, 2, 3, 128);
    std::vector<float> params[2];
    float losses[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
        EngineOptions eo;
        eo.B = 2;
        eo.T = 70;   // not a multiple of any tile size
        eo.flash_attention = k == 1;
        Engine e(cfg, backend, eo);
        e.init_params(21);
        std::vector<int32_t> in(140), tg(140);
        for (int s = 0; s < 3; ++s) {
            random_batch(in, tg, 97, uint64_t(s));
            losses[k] = e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}).loss;
        }
        params[k].assign(e.params(), e.params() + e.step().layout().total);
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-5 * std::fabs(losses[0]));
    EXPECT_LT(relative_error(params[1].data(), params[0].data(), params[0].size()), 1e-5);

    // Activations: naive grows faster than 2x when T doubles (B*NH*T*T probabilities), flash
    // grows linearly (plus the per-query log-sum-exp).
    auto act = [&](int T, bool flash) {
        ModelOptions mo;
        mo.flash_attention = flash;
        TrainStep s(small_config(97, 48, 2, 3, 256), 2, T, StepMode::train, &backend, mo);
        return plan_memory(s.program()).peak_live[Category::activations];
    };
    EXPECT_GT(act(128, false), 2 * act(64, false));
    EXPECT_LE(act(128, true), 2 * act(64, true) + 4096);
    EXPECT_LT(act(128, true), act(128, false));
}

TEST(Engine, RecomputationIsBitwiseEqualAndSavesActivations) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(97, 48, 5, 3, 64);
    const std::vector<std::string> policies = {"none", "full", "every:2", "every:3", "sqrt", "selective"};
    std::vector<std::vector<float>> params;
    std::vector<float> losses;
    std::vector<uint64_t> act;
    for (const auto & policy : policies) {
        for (bool flash : {false, true}) {
            EngineOptions eo;
            eo.B = 2;
            eo.T = 24;
            eo.flash_attention = flash;
            eo.recompute = parse_recompute(policy, cfg.n_layer);
            Engine e(cfg, backend, eo);
            e.init_params(5);
            std::vector<int32_t> in(48), tg(48);
            float loss = 0;
            for (int s = 0; s < 2; ++s) {
                random_batch(in, tg, 97, uint64_t(s));
                loss = e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}).loss;
            }
            if (flash) continue;   // flash vs naive differ by rounding; compare policies within naive
            params.emplace_back(e.params(), e.params() + e.step().layout().total);
            losses.push_back(loss);
            act.push_back(e.plan().peak_live[Category::activations]);
        }
    }
    for (size_t i = 1; i < policies.size(); ++i) {
        SCOPED_TRACE(policies[i]);
        EXPECT_EQ(losses[i], losses[0]);
        EXPECT_EQ(0, std::memcmp(params[i].data(), params[0].data(), params[0].size() * 4));
        EXPECT_LT(act[i], act[0]);
    }
    EXPECT_LE(act[1], act[2]);   // full keeps the least
    EXPECT_LT(act[1], act[5]);   // selective keeps the matmul outputs
    EXPECT_THROW(parse_recompute("every:0", 4), ConfigError);
    EXPECT_THROW(parse_recompute("sometimes", 4), ConfigError);
    EXPECT_EQ(parse_recompute("sqrt", 12).segment, 4);
}

TEST(Engine, AccumulatingMicroBatchesEqualsOneBatch) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(61, 32, 2, 2);
    const int T = 12, total = 6;   // 6 sequences per optimizer step
    std::vector<int32_t> in(size_t(total * T)), tg(in.size());
    std::vector<std::vector<float>> params;
    std::vector<float> losses, norms;
    for (int k : {1, 2, 3, 6}) {
        EngineOptions eo;
        eo.B = total / k;
        eo.T = T;
        eo.grad_accum = k;
        eo.with_eval = false;
        Engine e(cfg, backend, eo);
        e.init_params(4);
        StepResult r;
        for (int s = 0; s < 3; ++s) {
            random_batch(in, tg, 61, uint64_t(s));
            tg[size_t(s * 7)] = -100;
            r = e.train_step(in.data(), tg.data(), OptimHyper{2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
        }
        params.emplace_back(e.params(), e.params() + e.step().layout().total);
        losses.push_back(r.loss);
        norms.push_back(r.grad_norm);
        // Planned == measured with the extra micro-step programs too.
        EXPECT_EQ(e.planned_peak_live().total(), e.ledger().live_peak().total()) << "k=" << k;
        EXPECT_EQ(e.planned_reserved().total(), e.ledger().reserved_peak().total()) << "k=" << k;
    }
    for (size_t i = 1; i < params.size(); ++i) {
        EXPECT_NEAR(losses[i], losses[0], 1e-5f * losses[0]);
        EXPECT_NEAR(norms[i], norms[0], 1e-4f * norms[0]);
        EXPECT_LT(relative_error(params[i].data(), params[0].data(), params[0].size()), 1e-5);
    }
}

// --skip-spikes' loss limit (OptimHyper::skip_above_loss): decided on the whole step's loss
// (every micro-batch's, not only the last one's, which runs the update) before the update
// begins; a step above it leaves the weights bitwise as they were and is not counted.
TEST(Engine, LossLimitLeavesTheWholeStepOut) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2;
    eo.T = 16;
    eo.grad_accum = 2;
    Engine e(small_config(64, 32, 2, 2), backend, eo);
    e.init_params(5);
    const size_t BT = 32;
    std::vector<int32_t> x_in(BT), x_tg(BT), y_in(BT), y_tg(BT);
    random_batch(x_in, x_tg, 64, 11);
    random_batch(y_in, y_tg, 64, 12);
    auto step_of = [&](const std::vector<int32_t> & a, const std::vector<int32_t> & b, std::vector<int32_t> & out) {
        out = a;
        out.insert(out.end(), b.begin(), b.end());
    };
    std::vector<int32_t> in, tg;
    step_of(x_in, x_in, in);
    step_of(x_tg, x_tg, tg);
    const OptimHyper base{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1};
    for (int s = 0; s < 20; ++s) e.train_step(in.data(), tg.data(), base);   // X is learnt, Y is not
    const double lx = e.eval_loss(x_in.data(), x_tg.data()), ly = e.eval_loss(y_in.data(), y_tg.data());
    ASSERT_GT(ly, 2 * lx);
    const double whole = (lx + ly) / 2;   // both micro-batches have 31 targets
    step_of(y_in, x_in, in);   // X last: its own loss is below the step's
    step_of(y_tg, x_tg, tg);
    const size_t P = e.step().layout().total;
    const std::vector<float> before(e.params(), e.params() + P);
    const int done = e.steps_done();

    OptimHyper h = base;
    h.skip_above_loss = float((whole + lx) / 2);
    const StepResult out = e.train_step(in.data(), tg.data(), h);
    EXPECT_TRUE(out.skipped && out.loss_outlier);
    EXPECT_NEAR(out.loss, whole, 1e-4 * whole);
    EXPECT_EQ(0, std::memcmp(before.data(), e.params(), P * 4)) << "a step above the limit changed the weights";
    EXPECT_EQ(e.steps_done(), done);

    h.skip_above_loss = float(whole * 1.01);
    const StepResult in_limit = e.train_step(in.data(), tg.data(), h);
    EXPECT_FALSE(in_limit.skipped || in_limit.loss_outlier);
    EXPECT_NE(0, std::memcmp(before.data(), e.params(), P * 4));
    EXPECT_EQ(e.steps_done(), done + 1);
}

// --optimizer adamw-bf16 and adamw-8bit: the moments take 4 bytes per parameter, and 2 plus
// their block scales, instead of 8, planned and measured alike; the run trains (its loss after a
// few steps near the fp32 moments' run's), and the host's f32 view of the moments holds values
// the storage represents exactly (storing it back changes nothing).
TEST(Engine, SmallerMomentsShrinkTheOptimizerStates) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(64, 32, 2, 2);
    std::vector<int32_t> in(32), tg(32);
    random_batch(in, tg, 64, 21);
    std::vector<uint64_t> states;
    std::vector<float> losses;
    for (DType moments : {DType::f32, DType::bf16, DType::u8}) {
        SCOPED_TRACE(std::string(dtype_name(moments)));
        EngineOptions eo;
        eo.B = 2, eo.T = 16, eo.with_eval = false, eo.optimizer = test::optimizer_for(moments);
        Engine e(cfg, backend, eo);
        e.init_params(6);
        StepResult r;
        for (int s = 0; s < 8; ++s) r = e.train_step(in.data(), tg.data(), OptimHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1});
        losses.push_back(r.loss);
        const auto planned = e.planned_peak_live(), measured = e.ledger().live_peak();
        EXPECT_EQ(planned.total(), measured.total());
        states.push_back(planned.v[size_t(Category::optimizer_states)]);
        const size_t P = e.step().layout().total;
        size_t blocks = 0;
        for (const auto & p : e.step().moment_pieces()) blocks += moments8_blocks(p.n);
        EXPECT_EQ(states.back(), moments == DType::u8 ? 2 * P + 8 * blocks : 2 * P * dtype_size(moments));
        const TrainState before = e.export_state();
        size_t nonzero = 0;
        for (float x : before.v) nonzero += x != 0;
        EXPECT_GT(nonzero, P / 2);
        if (moments == DType::bf16) {
            for (size_t i = 0; i < P; ++i) ASSERT_EQ(before.m[i], bf16_to_f32(f32_to_bf16(before.m[i]))) << i;
        }
        e.import_state(before);
        const TrainState after = e.export_state();
        EXPECT_EQ(after.m, before.m);
        EXPECT_EQ(after.v, before.v);
    }
    EXPECT_EQ(states[1] * 2, states[0]);
    EXPECT_LE(double(states[2]), 0.27 * double(states[0]));
    EXPECT_NEAR(losses[1], losses[0], 0.02 * losses[0]);
    EXPECT_NEAR(losses[2], losses[0], 0.05 * losses[0]);
}

TEST(Engine, ClippingScalesTheGradientsByClipOverNorm) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(61, 32, 1, 2);
    EngineOptions eo;
    eo.B = 2;
    eo.T = 8;
    eo.with_eval = false;
    std::vector<int32_t> in(16), tg(16);
    random_batch(in, tg, 61, 3);
    // A large eps makes the first AdamW step depend on the gradient's scale (with a tiny eps it
    // is nearly lr * sign(g) whatever the scale).
    const OptimHyper base{1e-2f, 0.9f, 0.95f, 1e-2f, 0.1f, 1};

    // No clipping, and a clip above the norm: bitwise the same step.
    std::vector<float> unclipped;
    float norm = 0;
    for (float clip : {0.0f, 1e6f}) {
        Engine e(cfg, backend, eo);
        e.init_params(8);
        OptimHyper h = base;
        h.clip = clip;
        norm = e.train_step(in.data(), tg.data(), h).grad_norm;
        if (clip == 0) unclipped.assign(e.params(), e.params() + e.step().layout().total);
        else EXPECT_EQ(0, std::memcmp(unclipped.data(), e.params(), unclipped.size() * 4));
    }
    // A clip below the norm: the first AdamW step on gradients scaled by clip / norm.
    Engine e(cfg, backend, eo);
    e.init_params(8);
    const size_t P = e.step().layout().total;
    const std::vector<float> p0(e.params(), e.params() + P);
    OptimHyper h = base;
    h.clip = 0.25f * norm;
    const StepResult r = e.train_step(in.data(), tg.data(), h);
    EXPECT_EQ(r.grad_norm, norm);   // the logged norm is the one before clipping
    const float scale = h.clip / norm;
    std::vector<float> expect(P);
    for (const auto & info : e.step().layout().params) {
        const float wd = info.decay() ? h.weight_decay : 0.0f;
        for (size_t i = info.offset; i < info.offset + info.numel; ++i) {
            const double g = double(e.grads()[i]) * scale;
            const double m = (1 - h.beta1) * g / (1 - h.beta1), v = (1 - h.beta2) * g * g / (1 - h.beta2);
            expect[i] = float(double(p0[i]) * (1 - double(h.lr) * wd) - h.lr * m / (std::sqrt(v) + h.eps));
        }
    }
    // Compare the updates, not the parameters (which the update barely moves).
    std::vector<float> got_delta(P), expect_delta(P), unclipped_delta(P);
    for (size_t i = 0; i < P; ++i) {
        got_delta[i] = e.params()[i] - p0[i];
        expect_delta[i] = expect[i] - p0[i];
        unclipped_delta[i] = unclipped[i] - p0[i];
    }
    EXPECT_LT(relative_error(got_delta.data(), expect_delta.data(), P), 1e-3);
    EXPECT_GT(relative_error(got_delta.data(), unclipped_delta.data(), P), 0.05);   // clipping changed the step
}

TEST(Engine, LeakCheckComparesLiveBytesOpByOp) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2;
    eo.T = 8;
    eo.recompute = parse_recompute("full", 2);
    Engine e(small_config(61, 32, 2, 2), backend, eo);
    e.init_params(1);
    std::vector<int32_t> in(16), tg(16);
    Timeline a, b;
    for (Timeline * t : {&a, &b}) {
        random_batch(in, tg, 61, 1);
        e.set_timeline(t);
        e.train_step(in.data(), tg.data(), OptimHyper{});
        e.eval_loss(in.data(), tg.data());   // an evaluation in between must leave nothing behind
    }
    e.set_timeline(nullptr);
    EXPECT_EQ(compare_live_bytes(a, b), "");
    // A buffer that stayed alive shows up, named by op and category.
    b.events[5].live[Category::activations] += 64;
    const std::string diff = compare_live_bytes(a, b);
    EXPECT_NE(diff.find("activations"), std::string::npos) << diff;
    EXPECT_NE(diff.find("op 5"), std::string::npos) << diff;
    EXPECT_NE(diff.find("+64"), std::string::npos) << diff;
    b.events.pop_back();
    EXPECT_NE(compare_live_bytes(a, b), "");
}
