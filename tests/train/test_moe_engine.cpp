// A mixture of experts in the engine: every routing buffer declared with its size before the
// step, so planned == measured per category under each recomputation policy, bf16, micro-batch
// accumulation and checking mode; recomputation and checking mode bitwise equal to keeping
// everything; the routing statistics count every routed row; the load-balancing loss joins
// the reported loss.
#include <gtest/gtest.h>

#include <cstring>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;

namespace {

struct MoeCase {
    const char * preset;
    const char * recompute;
    DType compute = DType::f32;
    int accum = 1;
    bool checking = false;
};

ModelConfig nano(const char * preset) {
    ModelConfig c = model_preset(preset);
    c.vocab_size = 71;
    return c;
}

struct MoeRun {
    std::vector<float> params;
    float loss = 0, eval = 0;
    StepResult last;
};

MoeRun train(const ModelConfig & cfg, const MoeCase & mc, Engine ** keep = nullptr) {
    static CpuBackend backend;
    EngineOptions eo;
    eo.B = 2;
    eo.T = 24;
    eo.compute = mc.compute;
    eo.grad_accum = mc.accum;
    eo.checking = mc.checking;
    eo.recompute = parse_recompute(mc.recompute, cfg.n_layer);
    auto * e = new Engine(cfg, backend, eo);
    e->init_params(11);
    std::vector<int32_t> in(size_t(48 * mc.accum)), tg(in.size());
    MoeRun r;
    for (int s = 0; s < 3; ++s) {
        memfit::test::random_batch(in, tg, cfg.vocab_size, uint64_t(s));
        r.last = e->train_step(in.data(), tg.data(), OptimHyper{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
        r.loss = r.last.loss;
    }
    r.eval = e->eval_loss(in.data(), tg.data());
    r.params.assign(e->params(), e->params() + e->step().layout().total);
    if (keep) *keep = e;
    else delete e;
    return r;
}

}  // namespace

class MoePlannedEqualsMeasured : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoePlannedEqualsMeasured, PerCategoryByteForByte) {
    const MoeCase mc = GetParam();
    Engine * e = nullptr;
    train(nano(mc.preset), mc, &e);
    const std::unique_ptr<Engine> owned(e);
    const CategoryBytes plan_live = e->planned_peak_live(), plan_rsv = e->planned_reserved();
    for (size_t c = 0; c < kCategoryCount; ++c) {
        SCOPED_TRACE(std::string(kCategoryNames[c]));
        EXPECT_EQ(plan_live.v[c], e->ledger().live_peak().v[c]);
        EXPECT_EQ(plan_rsv.v[c], e->ledger().reserved_peak().v[c]);
    }
    EXPECT_GT(plan_live[Category::activations], 0u);
}

INSTANTIATE_TEST_SUITE_P(Configs, MoePlannedEqualsMeasured,
                         ::testing::Values(MoeCase{"mixtral-nano", "none"}, MoeCase{"mixtral-nano", "full"},
                                           MoeCase{"mixtral-nano", "selective", DType::bf16},
                                           MoeCase{"qwen3-moe-nano", "every:2"},
                                           MoeCase{"qwen3-moe-nano", "none", DType::f32, 2},
                                           MoeCase{"qwen3-moe-nano", "full", DType::bf16}),
                         [](const ::testing::TestParamInfo<MoeCase> & i) {
                             std::string s = std::string(i.param.preset) + "_" + i.param.recompute + "_" +
                                             (i.param.compute == DType::bf16 ? "bf16" : "fp32") + "_accum" +
                                             std::to_string(i.param.accum) + (i.param.checking ? "_checking" : "");
                             for (char & c : s)
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             return s;
                         });

// The same kernels on the same inputs: recomputed (the route kept, the experts' matmuls again)
// and checking mode's per-buffer allocations give the bits of the run that keeps everything.
TEST(MoeEngine, RecomputationAndCheckingModeAreBitwiseEqual) {
    for (const char * preset : {"mixtral-nano", "qwen3-moe-nano"}) {
        const ModelConfig cfg = nano(preset);
        const MoeRun base = train(cfg, {preset, "none"});
        for (const MoeCase & mc : {MoeCase{preset, "full"}, MoeCase{preset, "selective"}, MoeCase{preset, "every:2"},
                                   MoeCase{preset, "none", DType::f32, 1, true}}) {
            SCOPED_TRACE(std::string(preset) + " " + mc.recompute + (mc.checking ? " checking" : ""));
            const MoeRun r = train(cfg, mc);
            EXPECT_EQ(r.loss, base.loss);
            EXPECT_EQ(r.eval, base.eval);
            EXPECT_EQ(0, std::memcmp(r.params.data(), base.params.data(), base.params.size() * 4));
        }
    }
}

// Each step's statistics: every token's k rows routed (per sparse layer), a load-balancing loss
// of at least k (its minimum, reached by perfectly even routing, is k), and the loss reported
// with it: removing the coefficient lowers the loss by exactly coefficient x aux.
TEST(MoeEngine, RoutingStatisticsAndTheAuxLoss) {
    ModelConfig cfg = nano("mixtral-nano");
    const MoeRun r = train(cfg, {"mixtral-nano", "none"});
    const StepResult & s = r.last;
    ASSERT_EQ(s.expert_tokens.size(), size_t(cfg.moe_layers() * cfg.moe.experts));
    for (int l = 0; l < cfg.moe_layers(); ++l) {
        const float sum = std::accumulate(s.expert_tokens.begin() + l * cfg.moe.experts,
                                          s.expert_tokens.begin() + (l + 1) * cfg.moe.experts, 0.0f);
        EXPECT_EQ(sum, 48.0f * float(cfg.moe.top_k)) << "layer " << l;
    }
    EXPECT_GE(s.aux_loss, float(cfg.moe.top_k) - 1e-4f);
    EXPECT_LT(s.aux_loss, float(cfg.moe.top_k * cfg.moe.experts));
    EXPECT_GT(s.z_loss, 0.0f);
    cfg.moe.aux_coef = 0;
    const MoeRun off = train(cfg, {"mixtral-nano", "none"});
    EXPECT_EQ(off.last.aux_loss > 0, true);
    EXPECT_NE(0, std::memcmp(off.params.data(), r.params.data(), r.params.size() * 4));   // the gradient had it
}

// LoRA on the experts and attention of a frozen mixture of experts: planned == measured, and
// recomputation (the experts' adapters again over the kept route) bitwise equal to keeping all.
TEST(MoeEngine, LoraPlannedEqualsMeasuredAndRecomputesBitwise) {
    CpuBackend backend;
    const ModelConfig cfg = nano("qwen3-moe-nano");
    LoraOptions lora;
    lora.rank = 4;
    lora.alpha = 8;
    lora.targets = parse_lora_targets(cfg, "all");
    std::vector<std::vector<float>> adapters;
    for (const char * policy : {"none", "full", "selective", "every:2"}) {
        SCOPED_TRACE(policy);
        EngineOptions eo;
        eo.B = 2;
        eo.T = 24;
        eo.lora = lora;
        eo.recompute = parse_recompute(policy, cfg.n_layer);
        Engine e(cfg, backend, eo);
        e.init_params(3);
        std::vector<int32_t> in(48), tg(48);
        for (int s = 0; s < 3; ++s) {
            memfit::test::random_batch(in, tg, cfg.vocab_size, uint64_t(s));
            e.train_step(in.data(), tg.data(), OptimHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1});
        }
        for (size_t c = 0; c < kCategoryCount; ++c)
            EXPECT_EQ(e.planned_peak_live().v[c], e.ledger().live_peak().v[c]) << kCategoryNames[c];
        adapters.emplace_back(e.params(), e.params() + e.step().layout().total);
        EXPECT_EQ(0, std::memcmp(adapters.back().data(), adapters.front().data(), adapters.front().size() * 4));
    }
}

// The router losses' gradients against central differences of the loss train_step reports (its
// cross-entropy + aux_coef x the load-balancing loss + z_coef x the z-loss), on the routers'
// largest-gradient weights, with an lr-0 step reading the loss: the z-loss has no reference
// fixture, the load-balancing term's is in the fixtures too.
TEST(MoeEngine, RouterLossGradientsMatchFiniteDifferences) {
    CpuBackend backend;
    ModelConfig cfg = nano("mixtral-nano");
    cfg.moe.aux_coef = 0.5f;   // large, so that both terms move the router's gradient visibly
    cfg.moe.z_coef = 0.2f;
    EngineOptions eo;
    eo.B = 4;
    eo.T = 16;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(5);
    const ParamLayout & layout = e.step().layout();
    for (int l = 0; l < cfg.n_layer; ++l) {   // a decisive router: no token moves experts under a small step
        const ParamInfo & p = layout.find(fmt::format("model.layers.{}.block_sparse_moe.gate.weight", l));
        for (size_t i = p.offset; i < p.offset + p.numel; ++i) e.params()[i] *= 50.0f;
    }
    e.params_changed();
    std::vector<int32_t> in(64), tg(64);
    memfit::test::random_batch(in, tg, cfg.vocab_size, 2);
    const OptimHyper still{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1};
    auto loss = [&] { return double(e.train_step(in.data(), tg.data(), still).loss); };
    loss();
    const std::vector<float> g(e.grads(), e.grads() + layout.total);
    for (int l = 0; l < cfg.n_layer; ++l) {
        const ParamInfo & p = layout.find(fmt::format("model.layers.{}.block_sparse_moe.gate.weight", l));
        size_t best = p.offset;
        for (size_t i = p.offset; i < p.offset + p.numel; ++i)
            if (std::fabs(g[i]) > std::fabs(g[best])) best = i;
        const float x0 = e.params()[best], h = 1e-3f;
        e.params()[best] = x0 + h;
        e.params_changed();
        const double up = loss();
        e.params()[best] = x0 - h;
        e.params_changed();
        const double down = loss();
        e.params()[best] = x0;
        e.params_changed();
        EXPECT_NEAR((up - down) / (2.0 * h), g[best], 0.02 * std::fabs(g[best]) + 2e-4) << p.name;
        EXPECT_GT(std::fabs(g[best]), 1e-3) << p.name;
    }
}
