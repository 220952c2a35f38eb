// Cross-layer parameter sharing (ALBERT; --share-layers G): groups of G consecutive blocks read
// one stored block. Checked: the layout stores each group once and the counts follow (stored
// parameters, FLOPs as unshared); a shared block's gradient is the sum of its uses' gradients in
// an unshared twin holding the same weights in every layer of the group, and agrees with finite
// differences; planned == measured per category with the blocks' bytes divided; export writes
// the blocks expanded (a plain model), which loads back unshared and, with sharing, as the same
// shared weights; the config key round-trips; the combinations the engine does not run are
// refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "run/compat.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::random_batch;

ModelConfig shared(int L, int G, bool llama = false) {
    ModelConfig c = test::small_family(llama, 61, 32, L, 4, 48);
    c.share_layers = G;
    c.validate();
    return c;
}

ModelConfig unshared(ModelConfig c) {
    c.share_layers = 1;
    return c;
}

TEST(ShareLayers, LayoutStoresEachGroupOnce) {
    for (const bool llama : {false, true}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig c = shared(5, 2, llama);   // groups {0,1} {2,3} {4}
        EXPECT_EQ(c.stored_layers(), 3);
        EXPECT_EQ(c.stored_block(3), 1);
        EXPECT_EQ(c.stored_block(4), 2);
        const ParamLayout sl = make_param_layout(c), ul = make_param_layout(unshared(c));
        EXPECT_EQ(int64_t(sl.total), c.num_params());
        EXPECT_EQ(c.compute_params(), unshared(c).num_params());
        ModelConfig none = c, one = c;
        none.n_layer = 0, one.n_layer = 1, one.share_layers = 1;
        const int64_t per_block = one.num_params() - none.num_params();
        EXPECT_EQ(c.compute_params() - c.num_params(), 2 * per_block);   // 5 blocks used, 3 stored
        EXPECT_EQ(train_flops_per_token(c, 16), train_flops_per_token(unshared(c), 16));
        for (const ParamInfo & p : sl.params) EXPECT_LT(param_block(p.name), 3) << p.name;
        const std::string name = llama ? "model.layers.3.mlp.up_proj.weight" : "h.3.mlp.c_fc.weight";
        EXPECT_EQ(param_block(name), 3);
        EXPECT_EQ(in_block(name, 12), llama ? "model.layers.12.mlp.up_proj.weight" : "h.12.mlp.c_fc.weight");
        EXPECT_EQ(param_block(llama ? "model.norm.weight" : "wte.weight"), -1);

        // Expanded: every layer's block holds its group's stored one; the rest unchanged.
        std::vector<float> w(sl.total);
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(i);
        const std::vector<float> all = unshared_params(c, w.data());
        ASSERT_EQ(all.size(), ul.total);
        for (const ParamInfo & p : ul.params) {
            const int b = param_block(p.name);
            const ParamInfo & from = sl.find(b < 0 ? p.name : in_block(p.name, b / 2));
            for (size_t i = 0; i < p.numel; ++i) ASSERT_EQ(all[p.offset + i], w[from.offset + i]) << p.name;
        }
    }
}

TEST(ShareLayers, ConfigKeyRoundTripsAndIsChecked) {
    const ModelConfig c = shared(4, 2);
    const nlohmann::json j = hf_config_json(c);
    EXPECT_EQ(j.at(kShareLayersKey), 2);
    EXPECT_EQ(parse_hf_config(j, "shared").share_layers, 2);
    EXPECT_FALSE(hf_config_json(unshared(c)).contains(kShareLayersKey));
    for (const int bad : {0, 5}) {
        nlohmann::json k = j;
        k[kShareLayersKey] = bad;
        EXPECT_THROW(parse_hf_config(k, "bad"), ConfigError) << bad;
    }
}

// Engine on `cfg` with the given parameters; returns the loss and the gradients of one batch.
struct Grads {
    float loss = 0;
    std::vector<float> g;
};

// An engine on `backend` holding `params`, for B x T batches.
std::unique_ptr<Engine> engine_with(CpuBackend & backend, const ModelConfig & cfg, const std::vector<float> & params,
                                    int B, int T) {
    EngineOptions eo;
    eo.B = B, eo.T = T;
    auto e = std::make_unique<Engine>(cfg, backend, eo);
    e->init_params(1);
    std::copy(params.begin(), params.end(), e->params());
    e->params_changed();
    return e;
}

Grads gradients(const ModelConfig & cfg, const std::vector<float> & params, const std::vector<int32_t> & in,
                const std::vector<int32_t> & tg, int B, int T) {
    CpuBackend backend;
    const std::unique_ptr<Engine> owned = engine_with(backend, cfg, params, B, T);
    Engine & e = *owned;
    Grads r;
    r.loss = e.train_step(in.data(), tg.data(), OptimHyper{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1}).loss;   // lr 0
    r.g.assign(e.grads(), e.grads() + e.step().layout().total);
    return r;
}

TEST(ShareLayers, GradientIsTheSumOfTheUsesOfAnUnsharedTwin) {
    for (const bool llama : {false, true}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig c = shared(5, 2, llama), u = unshared(c);
        const int B = 2, T = 12;
        std::mt19937 rng(3);
        std::normal_distribution<float> nd(0.0f, 0.3f);
        const ParamLayout sl = make_param_layout(c), ul = make_param_layout(u);
        std::vector<float> w(sl.total);
        for (const ParamInfo & p : sl.params)
            for (size_t i = 0; i < p.numel; ++i) w[p.offset + i] = p.shape.size() == 1 ? 1.0f + 0.2f * nd(rng) : nd(rng);
        std::vector<int32_t> in(size_t(B * T)), tg(in.size());
        random_batch(in, tg, c.vocab_size, 5);
        const Grads s = gradients(c, w, in, tg, B, T), t = gradients(u, unshared_params(c, w.data()), in, tg, B, T);
        EXPECT_NEAR(s.loss, t.loss, 1e-6 * std::fabs(t.loss));
        // Shared block b: the twin's blocks of its group, summed.
        for (const ParamInfo & p : sl.params) {
            const int b = param_block(p.name);
            double worst = 0, scale = 0;
            for (size_t i = 0; i < p.numel; ++i) {
                double want = 0;
                for (int l = 0; l < c.n_layer; ++l)
                    if (b < 0 ? l == 0 : c.stored_block(l) == b)
                        want += t.g[ul.find(b < 0 ? p.name : in_block(p.name, l)).offset + i];
                worst = std::max(worst, std::fabs(double(s.g[p.offset + i]) - want));
                scale = std::max(scale, std::fabs(want));
            }
            EXPECT_GT(scale, 1e-6) << p.name;
            EXPECT_LE(worst, 1e-5 * scale + 1e-8) << p.name;
        }

        // Finite differences on the shared block 0 (layers 0 and 1): its largest gradients.
        CpuBackend backend;
        const std::unique_ptr<Engine> owned = engine_with(backend, c, w, B, T);
        Engine & e = *owned;
        for (const ParamInfo & p : sl.params) {
            if (param_block(p.name) != 0 || p.shape.size() != 2) continue;
            size_t best = p.offset;
            for (size_t i = p.offset; i < p.offset + p.numel; ++i)
                if (std::fabs(s.g[i]) > std::fabs(s.g[best])) best = i;
            const float x0 = e.params()[best], h = 1e-2f;
            auto loss_at = [&](float x) {
                e.params()[best] = x;
                e.params_changed();
                return double(e.eval_loss(in.data(), tg.data()));
            };
            const double fd = (loss_at(x0 + h) - loss_at(x0 - h)) / (2.0 * h);
            loss_at(x0);
            EXPECT_NEAR(fd, s.g[best], 0.02 * std::fabs(s.g[best]) + 2e-4) << p.name;
            EXPECT_GT(std::fabs(s.g[best]), 1e-4) << p.name << ": a gradient this small proves nothing";
        }
    }
}

TEST(ShareLayers, PlannedEqualsMeasuredWithTheBlocksDivided) {
    CpuBackend backend;
    for (const DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(dtype_name(dt));
        uint64_t params[2] = {0, 0};
        for (const int G : {1, 2}) {
            EngineOptions eo;
            eo.B = 2, eo.T = 16, eo.compute = dt;
            eo.recompute = parse_recompute("selective", 4);
            Engine e(shared(4, G), backend, eo);
            e.init_params(1);
            std::vector<int32_t> in(32), tg(32);
            random_batch(in, tg, 61, 1);
            e.train_step(in.data(), tg.data(), OptimHyper{});
            const CategoryBytes plan = e.planned_peak_live();
            for (size_t k = 0; k < kCategoryCount; ++k) EXPECT_EQ(plan.v[k], e.ledger().live_peak().v[k]) << k;
            params[G - 1] = plan[Category::parameters] + plan[Category::gradients] + plan[Category::optimizer_states] +
                            plan[Category::master_weights];
        }
        const ModelConfig c = shared(4, 2);
        EXPECT_EQ(double(params[1]) / double(params[0]), double(c.num_params()) / double(unshared(c).num_params()));
    }
}

TEST(ShareLayers, ExportWritesAPlainModelThatLoadsBack) {
    const ModelConfig c = shared(4, 2);
    const ParamLayout sl = make_param_layout(c);
    std::vector<float> w(sl.total);
    std::mt19937 rng(9);
    for (float & x : w) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    const std::string dir = (std::filesystem::temp_directory_path() / "memfit_share_layers_export").string();
    std::filesystem::remove_all(dir);
    export_hf(dir, c, sl, w.data());
    const ModelConfig back = load_hf_config(dir + "/config.json");
    EXPECT_EQ(back.share_layers, 1);
    EXPECT_EQ(back.n_layer, 4);
    std::vector<float> all(make_param_layout(back).total);
    load_hf_weights(dir, back, make_param_layout(back), all.data());
    EXPECT_EQ(all, unshared_params(c, w.data()));
    // Loaded with sharing again: each group takes its first layer's block, the weights it held.
    std::vector<float> again(sl.total);
    load_hf_weights(dir, c, sl, again.data());
    EXPECT_EQ(again, w);
    std::filesystem::remove_all(dir);
}

TEST(ShareLayers, RefusesWhatTheEngineDoesNotRun) {
    const ModelConfig c = shared(4, 2);
    auto why = [&](auto set) {
        RunConfig r;
        r.micro_batch = 2, r.grad_accum = 1, r.global_batch = 2;
        set(r);
        return unsupported(r, c, nullptr);
    };
    EXPECT_FALSE(why([](RunConfig &) {}));
    EXPECT_FALSE(why([](RunConfig & r) { r.layout.zero = 1; }));
    EXPECT_FALSE(why([](RunConfig & r) { r.layout.zero = 2; }));
    EXPECT_FALSE(why([](RunConfig & r) { r.layout.zero = 3; }));
    EXPECT_FALSE(why([](RunConfig & r) { r.layout.tp = 2, r.layout.sp = true, r.layout.zero = 3; }));
    for (const auto & [what, set] : std::vector<std::pair<std::string, void (*)(RunConfig &)>>{
             {"--pp", [](RunConfig & r) { r.layout.pp = 2; }},
             {"LoRA", [](RunConfig & r) { r.lora.rank = 4; }}}) {
        const auto msg = why(set);
        ASSERT_TRUE(msg) << what;
        EXPECT_NE(msg->find("--share-layers 2 with " + what), std::string::npos) << *msg;
    }
    RunConfig r;
    r.model = "micro";
    r.share_layers = 99;
    EXPECT_THROW(run_model(r), ConfigError);
    r.share_layers = 2;
    EXPECT_EQ(run_model(r).share_layers, 2);
}

}  // namespace
}  // namespace memfit
