// DoRA (--lora-variant dora, model/lora.h): the loss, gradients and two AdamW steps of a tiny Qwen2
// with DoRA on every projection against a float64 PyTorch reference of PEFT's formula
// (tests/data/make_dora_fixture.py); the magnitudes start at the base's row norms, so the first
// forward is the base model's; the magnitudes' gradients against finite differences (the norm is
// detached, so theirs are the true gradients) on both families; the plan equals the measured
// bytes and recomputation changes nothing; what DoRA does not combine with is refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "app/verify.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/lora.h"
#include "plan/fit.h"
#include "run/compat.h"
#include "train/engine.h"
#include "test_util.h"
#include "lora_steps.h"

using namespace memfit;
using memfit::test::random_batch;

namespace {

ModelConfig tiny(bool llama, int V = 37, int C = 32, int L = 2) { return test::small_family(llama, V, C, L, 4, 64); }

LoraOptions dora(const ModelConfig & cfg, const std::string & targets = "all") {
    LoraOptions l = test::lora_options(cfg, 4, BaseWeights::compute, targets);
    l.dora = true;
    return l;
}

EngineOptions opts(int B, int T, const LoraOptions & lora, DType dt = DType::f32, const RecomputePlan & rc = {}) {
    return test::lora_engine_options(B, T, lora, dt, rc);
}

}  // namespace

// The fixture's logits, loss, gradients of A, B and m, and two AdamW steps, within 1e-4 (measured:
// 1.1e-6). Read as plain LoRA (use_dora false in its metadata) the same fixture fails, 0.74.
TEST(Dora, Qwen2FixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/qwen2_dora_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    const std::string m = "base_model.model.model.layers.1.self_attn.k_proj.lora_magnitude_vector";
    EXPECT_TRUE(r.json["errors"].contains("grad." + m)) << r.json.dump(2);
    EXPECT_TRUE(r.json["errors"].contains("step2." + m)) << r.json.dump(2);
    EXPECT_GE(r.json["errors"].size(), 2u + 3u * 3u * 14u);   // logits, losses; grad, step1, step2 of 42 tensors
}

// PEFT's layout and start: a magnitude [out] per site after its A and B, equal to the base's row
// norms (GPT-2: its Conv1D columns), so the model starts as the base; set_base re-derives them.
TEST(Dora, MagnitudesStartAtTheBaseRowNorms) {
    CpuBackend backend;
    for (bool llama : {true, false}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = tiny(llama);
        const LoraOptions l = dora(cfg);
        const ParamLayout al = make_lora_layout(cfg, l);
        ASSERT_EQ(al.params.size(), 3 * lora_sites(cfg, l).size());
        const ParamInfo & m0 = al.params[2];
        EXPECT_EQ(m0.name, llama ? "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"
                                 : "base_model.model.transformer.h.0.attn.c_attn.lora_magnitude_vector");
        EXPECT_EQ(m0.shape, (std::vector<int64_t>{llama ? 32 : 96}));
        EXPECT_EQ(lora_param_count(cfg, l), lora_param_count(cfg, test::lora_options(cfg, 4)) +
                                                size_t(cfg.n_layer) * size_t(cfg.qkv_dim() + 2 * cfg.n_embd + cfg.fc_dim()));

        Engine base(cfg, backend, opts(2, 8, LoraOptions{}));
        base.init_params(5);
        Engine e(cfg, backend, opts(2, 8, l));
        e.init_params(5);
        std::vector<int32_t> in(16), tg(16);
        random_batch(in, tg, cfg.vocab_size, 1);
        const auto a = base.logits(in.data(), 2), b = e.logits(in.data(), 2);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::fabs(a[i]))) << i;

        // Another base: the magnitudes follow it (the first site's: q | c_attn rows).
        std::vector<float> w(base.params(), base.params() + cfg.num_params());
        for (float & x : w) x *= 1.5f;
        e.set_base(w.data());
        const ParamLayout full = make_param_layout(cfg);
        const ParamInfo & wq = full.find(llama ? "model.layers.0.self_attn.q_proj.weight" : "h.0.attn.c_attn.weight");
        for (int64_t o = 0; o < m0.shape[0]; o += 7) {
            double sq = 0;
            for (int64_t i = 0; i < cfg.n_embd; ++i) {
                const float x = llama ? w[wq.offset + size_t(o * cfg.n_embd + i)] : w[wq.offset + size_t(i * m0.shape[0] + o)];
                sq += double(x) * double(x);
            }
            EXPECT_NEAR(e.params()[m0.offset + size_t(o)], std::sqrt(sq), 1e-6 * std::sqrt(sq)) << o;
        }
    }
}

// The norm is detached, so the magnitudes' gradients are the loss's true ones: each magnitude
// vector's largest against central differences, with A and B random (the norms away from m).
TEST(Dora, MagnitudeGradientsMatchFiniteDifferences) {
    CpuBackend backend;
    const int B = 2, T = 9;
    for (bool llama : {true, false}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = tiny(llama, 37, 16, 2);
        Engine e(cfg, backend, opts(B, T, dora(cfg)));
        e.init_params(3);
        const ParamLayout & layout = e.step().layout();
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0.0f, 0.3f);
        // A and B random; the magnitudes 4x the base's row norms, so that the outputs (and the
        // gradients) are not small.
        for (const auto & p : layout.params)
            for (size_t i = 0; i < p.numel; ++i) {
                float & x = e.params()[p.offset + i];
                x = p.name.ends_with("lora_magnitude_vector") ? 4.0f * x : nd(rng);
            }
        e.params_changed();
        std::vector<int32_t> in(size_t(B * T)), tg(in.size());
        random_batch(in, tg, cfg.vocab_size, 3);
        e.train_step(in.data(), tg.data(), OptimHyper{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1});   // lr 0: gradients
        const std::vector<float> g(e.grads(), e.grads() + layout.total);
        int checked = 0;
        for (const auto & p : layout.params) {
            if (!p.name.ends_with("lora_magnitude_vector")) continue;
            size_t best = p.offset;
            for (size_t i = p.offset; i < p.offset + p.numel; ++i)
                if (std::fabs(g[i]) > std::fabs(g[best])) best = i;
            const float x0 = e.params()[best], h = 5e-2f * std::fabs(x0);
            auto loss_at = [&](float x) {
                e.params()[best] = x;
                e.params_changed();
                return e.eval_loss(in.data(), tg.data());
            };
            const double fd = (loss_at(x0 + h) - loss_at(x0 - h)) / (2.0 * double(h));
            loss_at(x0);
            EXPECT_NEAR(fd, g[best], 0.02 * std::fabs(g[best]) + 2e-5) << p.name;
            EXPECT_GT(std::fabs(g[best]), 3e-4) << p.name;   // 15x the tolerance's floor
            ++checked;
        }
        EXPECT_EQ(checked, int(lora_sites(cfg, dora(cfg)).size()));
    }
}

// The step's bytes per category are the plan's, and recomputation (whose forward reuses the
// norms) changes no adapter bit.
TEST(Dora, PlannedEqualsMeasuredAndRecomputationIsBitwiseEqual) {
    CpuBackend backend;
    const ModelConfig cfg = tiny(true, 61, 64, 3);
    std::vector<float> reference;
    for (const char * rc : {"none", "selective", "full", "every:2"})
        for (DType dt : {DType::f32, DType::bf16}) {
            SCOPED_TRACE(std::string(rc) + " " + std::string(dtype_name(dt)));
            Engine e(cfg, backend, opts(2, 16, dora(cfg, "q,v,o,gate,up,down"), dt, parse_recompute(rc, cfg.n_layer)));
            e.init_params(1);
            const std::vector<float> after = test::two_steps_as_planned(e, cfg.vocab_size, 2, 16);
            if (dt != DType::f32) continue;
            if (reference.empty()) reference = after;
            else EXPECT_EQ(after, reference) << "recomputation changed the adapters";
        }
}

// QDoRA: on an int8, nf4 or sparse24 base, the norms are the dequantized rows' (tile by tile in
// the workspace), so the step is a dense-base DoRA step on the dequantized weights: the same
// magnitudes at the start, logits, and gradients of A, B and m.
TEST(Dora, PackedBaseComputesWithTheDequantizedRows) {
    CpuBackend backend;
    for (bool llama : {true, false})
        for (BaseWeights bw : {BaseWeights::int8, BaseWeights::nf4, BaseWeights::sparse24}) {
            SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + base_weights_name(bw));
            const ModelConfig cfg = tiny(llama);
            LoraOptions l = dora(cfg);
            l.base = bw;
            Engine q(cfg, backend, opts(2, 8, l));
            q.init_params(9);
            Engine d(cfg, backend, opts(2, 8, dora(cfg)));
            d.init_params(9);
            d.set_base(q.base_weights().data());   // the dense engine on the dequantized rows
            const size_t n = q.step().layout().total;
            ASSERT_EQ(n, d.step().layout().total);
            for (size_t i = 0; i < n; ++i) ASSERT_NEAR(q.params()[i], d.params()[i], 1e-6f * (1 + std::fabs(d.params()[i])));
            std::mt19937 rng(4);
            std::normal_distribution<float> nd(0.0f, 0.2f);
            for (const auto & p : q.step().layout().params)   // A and B away from the start; m kept
                if (!p.name.ends_with("lora_magnitude_vector"))
                    for (size_t i = 0; i < p.numel; ++i) q.params()[p.offset + i] = d.params()[p.offset + i] = nd(rng);
            q.params_changed();
            d.params_changed();
            std::vector<int32_t> in(16), tg(16);
            random_batch(in, tg, cfg.vocab_size, 2);
            const auto a = d.logits(in.data(), 2), b = q.logits(in.data(), 2);
            for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(a[i]))) << i;
            const OptimHyper lr0{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1};
            d.train_step(in.data(), tg.data(), lr0);
            q.train_step(in.data(), tg.data(), lr0);
            double diff = 0, ref = 0;
            for (size_t i = 0; i < n; ++i) diff = std::max(diff, double(std::fabs(q.grads()[i] - d.grads()[i])));
            for (size_t i = 0; i < n; ++i) ref = std::max(ref, double(std::fabs(d.grads()[i])));
            EXPECT_GT(ref, 1e-3);
            EXPECT_LT(diff, 1e-4 * ref);
        }
}

// What DoRA does not combine with, in one line each; the variant's name checked.
TEST(Dora, RefusalsAreOneClearLine) {
    const ModelConfig cfg = tiny(true);
    auto why = [&](auto edit) {
        RunConfig r;
        r.lora.rank = 8;
        r.lora.variant = "dora";
        edit(r);
        const auto w = unsupported(r, cfg, nullptr);
        return w ? *w : std::string();
    };
    EXPECT_EQ(why([](RunConfig &) {}), "");
    EXPECT_EQ(why([](RunConfig & r) { r.lora.base_weights = "nf4"; }), "");   // QDoRA
    const ModelConfig odd = test::small_family(false, 37, 36, 2, 4, 64);    // inputs of 36: not 8-element groups
    RunConfig qr;
    qr.lora.rank = 4;
    qr.lora.variant = "dora";
    qr.lora.base_weights = "int8";
    ASSERT_TRUE(unsupported(qr, odd, nullptr));
    EXPECT_NE(unsupported(qr, odd, nullptr)->find("multiples of 8"), std::string::npos);
    EXPECT_NE(why([](RunConfig & r) { r.lora.dropout = 0.1f; }).find("drop --lora-dropout"), std::string::npos);
    EXPECT_NE(why([](RunConfig & r) { r.layout.tp = 2; }).find("--tp 2"), std::string::npos);
    EXPECT_NE(why([](RunConfig & r) { r.lora.targets = "q,lm_head"; }).find("lm_head"), std::string::npos);
    RunConfig r;
    r.lora.variant = "dora";
    EXPECT_THROW(lora_options(r, cfg, DType::f32), ConfigError);   // no rank
    r.lora.rank = 4;
    r.lora.variant = "vera";
    EXPECT_THROW(lora_options(r, cfg, DType::f32), ConfigError);
    r.lora.variant = "dora";
    EXPECT_TRUE(lora_options(r, cfg, DType::f32).dora);
}
