// Mixtures of experts (model/config.h's MoeConfig): the float64 reference fixtures of Mixtral,
// Qwen3-MoE (with a dense layer between sparse ones) and OLMoE replayed by `memfit verify`
// (logits, the loss with its load-balancing term, every gradient, the router's included, two
// AdamW steps); the configs as transformers writes them, read and written back; the presets at
// their published sizes; export then reload giving the same logits.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/verify.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "model/moe_config.h"
#include "model/param_layout.h"
#include "train/engine.h"
#include "grad_check.h"
#include "lora_steps.h"
#include "test_util.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

void expect_fixture(const char * file, std::initializer_list<const char *> names) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/" + file);
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    for (const char * n : names) EXPECT_TRUE(r.json["errors"].contains(n)) << n << "\n" << r.json.dump(2);
}

}  // namespace

TEST(Moe, MixtralFixtureWithin1e4) {
    expect_fixture("mixtral_tiny.safetensors", {"grad.model.layers.0.block_sparse_moe.gate.weight",
                                                "grad.model.layers.1.block_sparse_moe.experts.3.w2.weight",
                                                "step2.model.layers.1.block_sparse_moe.experts.0.w3.weight"});
}

TEST(Moe, Qwen3MoeFixtureWithADenseLayerWithin1e4) {
    expect_fixture("qwen3_moe_tiny.safetensors", {"grad.model.layers.2.mlp.gate.weight",
                                                  "grad.model.layers.1.mlp.gate_proj.weight",
                                                  "step2.model.layers.0.mlp.experts.5.down_proj.weight",
                                                  "grad.model.layers.0.self_attn.q_norm.weight"});
}

// Qwen2-MoE: Qwen2's q/k/v biases, and a shared expert over every token gated by sigmoid(x . g).
TEST(Moe, Qwen2MoeFixtureWithASharedExpertWithin1e4) {
    expect_fixture("qwen2_moe_tiny.safetensors", {"grad.model.layers.0.mlp.shared_expert_gate.weight",
                                                  "grad.model.layers.2.mlp.shared_expert.up_proj.weight",
                                                  "step2.model.layers.0.mlp.shared_expert.down_proj.weight",
                                                  "grad.model.layers.0.self_attn.v_proj.bias"});
}

TEST(Moe, OlmoeFixtureWithin1e4) {
    expect_fixture("olmoe_tiny.safetensors", {"grad.model.layers.0.mlp.gate.weight",
                                              "step1.model.layers.1.self_attn.k_norm.weight"});
}

// The fixture's routing gradient is what fails without the load-balancing loss: read with
// output_router_logits false, the loss and the router's gradient move off the reference.
TEST(Moe, TheAuxLossIsPartOfTheReference) {
    const std::string path = std::string(MEMFIT_TEST_DATA) + "/mixtral_tiny.safetensors";
    SafetensorsFile f = SafetensorsFile::open(path);
    nlohmann::json cj = nlohmann::json::parse(f.metadata().at("config"));
    EXPECT_TRUE(cj["output_router_logits"].get<bool>());
    cj["output_router_logits"] = false;
    const ModelConfig off = parse_hf_config(cj, "off");
    EXPECT_EQ(off.moe.aux_coef, 0.0f);
    EXPECT_FLOAT_EQ(off.moe.aux_coef_off, 0.02f);   // kept, and written back
    EXPECT_FLOAT_EQ(hf_config_json(off)["router_aux_loss_coef"].get<float>(), 0.02f);
    EXPECT_FALSE(hf_config_json(off)["output_router_logits"].get<bool>());
}

TEST(Moe, ConfigsReadAndWrittenBack) {
    const nlohmann::json q = {{"model_type", "qwen3_moe"}, {"vocab_size", 100}, {"hidden_size", 64},
                              {"intermediate_size", 96}, {"moe_intermediate_size", 32}, {"num_hidden_layers", 4},
                              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                              {"num_experts", 6}, {"num_experts_per_tok", 3}, {"norm_topk_prob", true},
                              {"decoder_sparse_step", 2}, {"mlp_only_layers", {3}}, {"output_router_logits", true},
                              {"router_aux_loss_coef", 0.01}};
    const ModelConfig c = parse_hf_config(q, "q");
    EXPECT_EQ(c.moe.experts, 6);
    EXPECT_EQ(c.moe.top_k, 3);
    EXPECT_EQ(c.moe.ffn, 32);
    EXPECT_EQ(c.ffn, 96);
    EXPECT_TRUE(c.moe.norm_topk);
    // Sparse: (l + 1) % 2 == 0 and not in mlp_only_layers: layer 1 only.
    EXPECT_FALSE(c.moe_layer(0));
    EXPECT_TRUE(c.moe_layer(1));
    EXPECT_FALSE(c.moe_layer(2));
    EXPECT_FALSE(c.moe_layer(3));
    EXPECT_EQ(c.moe_layers(), 1);
    const ParamLayout l = make_param_layout(c);
    EXPECT_EQ(l.find("model.layers.1.mlp.experts.5.down_proj.weight").shape, (std::vector<int64_t>{64, 32}));
    EXPECT_EQ(l.find("model.layers.3.mlp.up_proj.weight").shape, (std::vector<int64_t>{96, 64}));
    EXPECT_EQ(int64_t(l.total), c.num_params());
    const ModelConfig back = parse_hf_config(hf_config_json(c), "back");
    EXPECT_EQ(back.moe.experts, 6);
    EXPECT_EQ(back.moe.dense_layers, std::vector<int>{3});
    EXPECT_EQ(back.moe.sparse_step, 2);
    EXPECT_FLOAT_EQ(back.moe.aux_coef, 0.01f);
    EXPECT_EQ(make_param_layout(back).total, l.total);
    // transformers 5's spelling of the experts' count.
    nlohmann::json v5 = q;
    v5.erase("num_experts");
    v5["num_local_experts"] = 6;
    EXPECT_EQ(parse_hf_config(v5, "v5").moe.experts, 6);
    // Mixtral: intermediate_size is the experts'; always renormalised; its own names.
    const nlohmann::json m = {{"model_type", "mixtral"}, {"vocab_size", 100}, {"hidden_size", 64},
                              {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
    const ModelConfig mx = parse_hf_config(m, "m");
    EXPECT_EQ(mx.moe.ffn, 48);
    EXPECT_TRUE(mx.moe.norm_topk);
    EXPECT_EQ(mx.moe.aux_coef, 0.0f);   // output_router_logits defaults to false
    EXPECT_TRUE(make_param_layout(mx).try_find("model.layers.1.block_sparse_moe.experts.3.w3.weight"));
    EXPECT_EQ(hf_config_json(mx)["architectures"][0], "MixtralForCausalLM");
}

TEST(Moe, BadConfigsAreRefusedInOneLine) {
    const nlohmann::json base = {{"model_type", "mixtral"}, {"vocab_size", 100}, {"hidden_size", 64},
                                 {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                 {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
    for (const auto & [key, value, says] :
         std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
             {"num_experts_per_tok", 5, "from 1 to the 4 experts"},
             {"num_local_experts", 0, "experts"},
             {"router_jitter_noise", 0.1, "router_jitter_noise"},
             {"output_router_logits", "yes", "true or false"},
             {"router_aux_loss_coef", -1, "must not be negative"}}) {
        nlohmann::json j = base;
        j[key] = value;
        try {
            parse_hf_config(j, "bad");
            ADD_FAILURE() << key << " accepted";
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
    }
    nlohmann::json q = {{"model_type", "qwen3_moe"}, {"vocab_size", 100}, {"hidden_size", 64},
                        {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                        {"mlp_only_layers", {7}}};
    EXPECT_THROW(parse_hf_config(q, "q"), ConfigError);
    q["mlp_only_layers"] = nlohmann::json::array();
    q["shared_expert_intermediate_size"] = 128;   // qwen2_moe's, not qwen3_moe's
    EXPECT_THROW(parse_hf_config(q, "q"), ConfigError);
    q["model_type"] = "qwen2_moe";
    const ModelConfig q2 = parse_hf_config(q, "q2");
    EXPECT_EQ(q2.moe.shared_ffn, 128);
    EXPECT_EQ(parse_hf_config(hf_config_json(q2), "back").moe.shared_ffn, 128);
    EXPECT_TRUE(q2.qkv_bias);
}

// The presets at their published sizes: Mixtral 8x7B 46.7B (12.9B active), Qwen3-30B-A3B 30.5B
// (3.3B active), Qwen3-235B-A22B 235B (22.2B active), OLMoE-1B-7B 6.9B (1.3B active),
// Qwen1.5-MoE-A2.7B 14.3B (2.7B active; its shared expert counted in both).
TEST(Moe, PresetsAtTheirPublishedSizes) {
    const struct {
        const char * name;
        double total, active;
    } want[] = {{"mixtral-8x7b", 46.70e9, 12.88e9}, {"qwen3-30b-a3b", 30.53e9, 3.35e9},
                {"qwen3-235b-a22b", 235.09e9, 22.19e9}, {"olmoe-1b-7b", 6.92e9, 1.28e9},
                {"qwen1.5-moe-a2.7b", 14.32e9, 2.69e9}};
    for (const auto & w : want) {
        const ModelConfig c = model_preset(w.name);
        EXPECT_NEAR(double(c.num_params()), w.total, 0.01e9) << w.name;
        EXPECT_NEAR(double(c.active_params()), w.active, 0.01e9) << w.name;
        EXPECT_LT(train_flops_per_token(c, 4096), 6.5 * w.active + 12.0 * c.n_layer * c.attn_dim() * 4096) << w.name;
    }
}

// A trained mixture of experts exported as the Hub stores it, then loaded back: the same logits.
TEST(Moe, ExportThenReloadGivesTheSameLogits) {
    for (const char * preset : {"mixtral-nano", "qwen3-moe-nano"}) {
        ModelConfig cfg = model_preset(preset);
        cfg.vocab_size = 61;
        CpuBackend backend;
        EngineOptions eo;
        eo.B = 2;
        eo.T = 16;
        eo.with_eval = false;
        std::vector<int32_t> in(32), tg(32);
        memfit::test::random_batch(in, tg, cfg.vocab_size, 3);
        std::vector<float> before, after;
        std::vector<float> params;
        {
            Engine e(cfg, backend, eo);
            e.init_params(7);
            for (int s = 0; s < 3; ++s) e.train_step(in.data(), tg.data(), OptimHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
            before = e.logits(in.data(), 2);
            params.assign(e.params(), e.params() + e.step().layout().total);
        }
        const fs::path dir = fs::temp_directory_path() / ("memfit_moe_test." + std::to_string(getpid())) / preset;
        fs::remove_all(dir);
        fs::create_directories(dir);
        export_hf(dir.string(), cfg, make_param_layout(cfg), params.data());
        const ModelConfig back = resolve_model(dir.string());
        EXPECT_EQ(back.moe.experts, cfg.moe.experts) << preset;
        std::vector<float> loaded(make_param_layout(back).total);
        load_hf_weights(dir.string(), back, make_param_layout(back), loaded.data());
        Engine e(back, backend, eo);
        e.set_params(loaded.data());
        after = e.logits(in.data(), 2);
        EXPECT_EQ(after, before) << preset;
        fs::remove_all(dir);
    }
}

namespace {

ModelConfig lora_moe(const char * preset) {
    ModelConfig c = model_preset(preset);
    c.vocab_size = 37;
    c.moe.experts = 4;   // each expert gets tokens from a small batch
    c.moe.aux_coef = 0;   // the finite differences below are of the cross-entropy alone
    return c;
}

}  // namespace

// LoRA on a mixture of experts (PEFT's names: each expert's own w1/w3/w2 or gate/up/down_proj,
// one adapter per expert, stacked for the grouped matmuls): merged weights compute what the
// adapters do, and every adapter's largest gradient matches central differences.
TEST(MoeLora, ExpertAdaptersHavePeftNames) {
    const ModelConfig mx = lora_moe("mixtral-nano");
    const LoraOptions l = test::lora_options(mx, 4, BaseWeights::compute, "q_proj,w1,w2,w3");
    const ParamLayout al = make_lora_layout(mx, l);
    EXPECT_TRUE(al.try_find("base_model.model.model.layers.1.block_sparse_moe.experts.3.w3.lora_A.weight"));
    EXPECT_EQ(al.find("base_model.model.model.layers.0.block_sparse_moe.experts.2.w2.lora_B.weight").shape,
              (std::vector<int64_t>{64, 4}));
    EXPECT_EQ(peft_target_modules(mx, l), (std::vector<std::string>{"q_proj", "w1", "w3", "w2"}));
    const ModelConfig q = lora_moe("qwen3-moe-nano");
    const ParamLayout ql = make_lora_layout(q, test::lora_options(q, 4, BaseWeights::compute, "all"));
    EXPECT_TRUE(ql.try_find("base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_B.weight"));
    EXPECT_FALSE(ql.try_find("base_model.model.model.layers.1.mlp.gate.lora_A.weight"));   // the router stays frozen
}

TEST(MoeLora, MergedWeightsComputeWhatTheAdaptersDo) {
    CpuBackend backend;
    for (const char * preset : {"mixtral-nano", "qwen3-moe-nano"}) {
        SCOPED_TRACE(preset);
        const ModelConfig cfg = lora_moe(preset);
        Engine lora(cfg, backend, test::lora_engine_options(2, 8, test::lora_options(cfg, 4)));
        lora.init_params(4);
        std::mt19937 rng(3);
        const auto r = test::randn(lora.step().layout().total, rng, 0.2f);
        std::copy(r.begin(), r.end(), lora.params());
        lora.params_changed();
        Engine full(cfg, backend, test::lora_engine_options(2, 8, LoraOptions{}));
        const std::vector<float> merged = lora.merged_weights();
        std::copy(merged.begin(), merged.end(), full.params());
        full.params_changed();
        std::vector<int32_t> in(16), tg(16);
        test::random_batch(in, tg, cfg.vocab_size, 8);
        const auto a = full.logits(in.data(), 2), b = lora.logits(in.data(), 2);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-5f * (1 + std::fabs(a[i]))) << i;
    }
}

// QLoRA: every expert's gate|up and down packed (nf4 with double quantization, int8), read by
// the grouped matmul expert by expert: the logits of the dense model with the dequantized weights.
TEST(MoeLora, QuantizedExpertsComputeWithTheDequantizedWeights) {
    CpuBackend backend;
    for (BaseWeights bw : {BaseWeights::nf4, BaseWeights::int8}) {
        SCOPED_TRACE(base_weights_name(bw));
        const ModelConfig cfg = lora_moe("qwen3-moe-nano");
        const QuantLayout ql = make_quant_layout(cfg, quant_format(bw, true));
        size_t experts = 0;
        for (const QuantEntry & e : ql.entries) experts += e.expert >= 0;
        EXPECT_EQ(experts, size_t(2 * cfg.moe.experts * cfg.moe_layers()));
        Engine q(cfg, backend, test::lora_engine_options(2, 8, test::lora_options(cfg, 4, bw)));
        q.init_params(9);
        const std::vector<float> w = q.base_weights();
        Engine full(cfg, backend, test::lora_engine_options(2, 8, LoraOptions{}));
        full.init_params(9);
        double err = 0;
        for (size_t i = 0; i < w.size(); ++i) err += std::fabs(w[i] - full.params()[i]);
        EXPECT_GT(err, 0.0);   // quantized
        std::copy(w.begin(), w.end(), full.params());
        full.params_changed();
        std::vector<int32_t> in(16), tg(16);
        test::random_batch(in, tg, cfg.vocab_size, 2);
        const auto a = full.logits(in.data(), 2), b = q.logits(in.data(), 2);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(a[i]))) << i;
    }
}

TEST(MoeLora, AdapterGradientsMatchFiniteDifferences) {
    CpuBackend backend;
    for (const auto & [preset, bw] : {std::pair{"mixtral-nano", BaseWeights::compute},
                                      std::pair{"qwen3-moe-nano", BaseWeights::compute},
                                      std::pair{"qwen3-moe-nano", BaseWeights::nf4}}) {
        SCOPED_TRACE(std::string(preset) + " " + base_weights_name(bw));
        const ModelConfig cfg = lora_moe(preset);
        // Enough tokens that every expert gets some (else its adapters' gradients are zero).
        // The experts' adapters (the attention's are LoRA's own tests'; here a difference step on
        // them moves the next layer's routing more than the experts' do).
        Engine e(cfg, backend, test::lora_engine_options(4, 16, test::lora_options(cfg, 3, bw, "gate,up,down")));
        e.init_params(1);
        // A decisive router (GPT-2's initial 0.02 leaves the experts' logits nearly tied, and a
        // difference step would then move tokens between experts: a jump, not a slope).
        std::vector<float> base(size_t(cfg.num_params()));
        {
            Engine dense(cfg, backend, test::lora_engine_options(4, 16, LoraOptions{}));
            dense.init_params(1);
            std::copy(dense.params(), dense.params() + base.size(), base.begin());
        }
        const ParamLayout full = make_param_layout(cfg);
        for (int l = 0; l < cfg.n_layer; ++l)
            if (cfg.moe_layer(l))
                for (const ParamInfo * p = &full.find(router_param(cfg, fmt::format("model.layers.{}.", l))),
                                     * end = p + 1; p != end; ++p)
                    for (size_t i = p->offset; i < p->offset + p->numel; ++i) base[i] *= 100.0f;
        e.set_base(base.data());
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0.0f, 0.3f);   // B nonzero, so that A has gradients too
        for (size_t i = 0; i < e.step().layout().total; ++i) e.params()[i] = nd(rng);
        e.params_changed();
        std::vector<int32_t> in(64), tg(64);
        test::random_batch(in, tg, cfg.vocab_size, 3);
        test::expect_largest_grads_match_fd(e, in, tg, 2e-3f);
    }
}

// Expert parallelism's capacity layout on the CPU (backend/moe.h): with the "probs" policy an
// expert over the capacity keeps its most probable choices, with "position" its first in token
// order; either way the route stays a route (slot the inverse of order, spans unchanged) and the
// dropped count is what exceeds the capacity.
TEST(MoeCapacity, DropPoliciesKeepTheMostProbableOrTheFirst) {
    CpuBackend be;
    const int64_t N = 40, E = 4, k = 2, cap = 6;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    std::vector<float> logits(size_t(N * E));
    for (auto & v : logits) v = nd(rng);
    for (const bool probs : {true, false}) {
        SCOPED_TRACE(probs ? "probs" : "position");
        MoeDesc d;
        d.experts = int(E), d.top_k = int(k), d.capacity = cap, d.drop_probs = probs;
        std::vector<int32_t> route(static_cast<size_t>(moe_route_elems(N, d))), counts(static_cast<size_t>(E));
        std::vector<float> wts(static_cast<size_t>(N * k)), stats(static_cast<size_t>(moe_stats_width(d)));
        auto t = [](auto & v, DType dt) {
            Tensor x(-1, dt, {int64_t(v.size())});
            x.data = v.data();
            return x;
        };
        Tensor lg(-1, DType::f32, {N, E});
        lg.data = logits.data();
        be.moe_route(t(route, DType::i32), t(wts, DType::f32), t(stats, DType::f32), lg, d);
        const std::vector<int32_t> before = route;
        be.moe_counts(t(counts, DType::i32), t(stats, DType::f32), t(route, DType::i32), t(wts, DType::f32), d);
        const MoeRoute rt(route.data(), N, d);
        double over = 0;
        for (int64_t e = 0; e < E; ++e) {
            const int64_t n = rt.offsets[e + 1] - rt.offsets[e];
            EXPECT_EQ(counts[size_t(e)], std::min(n, cap));
            over += double(std::max<int64_t>(0, n - cap));
            float kept_min = 1e9f, dropped_max = -1e9f;
            int32_t kept_last = -1, dropped_first = int32_t(N * k);
            for (int64_t s = rt.offsets[e]; s < rt.offsets[e + 1]; ++s) {
                const int32_t c = rt.order[s];
                EXPECT_EQ(rt.slot[c], s);
                EXPECT_EQ(rt.expert[c], e);
                const float w = wts[size_t(c)];
                if (s - rt.offsets[e] < cap) kept_min = std::min(kept_min, w), kept_last = std::max(kept_last, c);
                else dropped_max = std::max(dropped_max, w), dropped_first = std::min(dropped_first, c);
            }
            if (n <= cap) continue;
            if (probs) {
                EXPECT_GE(kept_min, dropped_max) << "expert " << e;
            } else {
                EXPECT_LT(kept_last, dropped_first) << "expert " << e;
            }
        }
        EXPECT_GT(over, 0) << "a capacity of 6 of 20 rows an expert drops some";
        EXPECT_EQ(stats[size_t(2 * E + 1)], float(over));
        if (!probs) {
            EXPECT_EQ(route, before) << "position: the route as moe_route wrote it";
        }
    }
}
