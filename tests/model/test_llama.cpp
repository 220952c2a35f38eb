// The LLaMA family: presets (published parameter counts), Hugging Face config.json, the
// parameter layout, the whole model's gradients against finite differences (grouped-query
// attention, tied and untied heads, naive and flash attention), the float64 PyTorch fixture,
// planned == measured bytes, and recomputation bitwise equal to keeping everything.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/param_layout.h"
#include "model/recompute.h"
#include "train/engine.h"
#include "app/verify.h"
#include "grad_check.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::random_batch;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny_llama(int V = 61, int C = 32, int L = 2, int NH = 4, int KVH = 2, int ffn = 48, bool tied = false) {
    ModelConfig c;
    c.name = "tiny-llama";
    c.family = "llama";
    c.vocab_size = V;
    c.n_embd = C;
    c.n_layer = L;
    c.n_head = NH;
    c.n_kv_head = KVH;
    c.ffn = ffn;
    c.max_seq = 64;
    c.tied_head = tied;
    c.validate();
    return c;
}

EngineOptions opts(int B, int T, bool flash, const RecomputePlan & rc = {}, DType dt = DType::f32) {
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.flash_attention = flash;
    eo.recompute = rc;
    eo.compute = dt;
    return eo;
}

}  // namespace

TEST(Llama, PresetsHaveThePublishedParameterCounts) {
    // Hugging Face's counts for meta-llama/Llama-2-{7,13,70}b-hf and Meta-Llama-3-{8,70}B.
    EXPECT_EQ(model_preset("llama2-7b").num_params(), 6738415616);
    EXPECT_EQ(model_preset("llama2-13b").num_params(), 13015864320);
    EXPECT_EQ(model_preset("llama2-70b").num_params(), 68976648192);
    EXPECT_EQ(model_preset("llama3-8b").num_params(), 8030261248);
    EXPECT_EQ(model_preset("llama3-70b").num_params(), 70553706496);
    const ModelConfig c = model_preset("llama2-70b");
    EXPECT_EQ(c.kv_heads(), 8);
    EXPECT_EQ(c.qkv_dim(), (64 + 16) * 128);
    EXPECT_EQ(model_preset("llama3-8b").rope_theta, 500000.0f);
    // meta-llama/Llama-3.1-8B, Llama-3.2-1B and -3B (tied) as Hugging Face counts them.
    EXPECT_EQ(model_preset("llama3.1-8b").num_params(), 8030261248);
    EXPECT_EQ(model_preset("llama3.2-1b").num_params(), 1235814400);
    EXPECT_EQ(model_preset("llama3.2-3b").num_params(), 3212749824);
    for (const char * p : {"llama3.1-8b", "llama3.2-1b", "llama3.2-3b"}) {
        const ModelConfig r = model_preset(p);
        EXPECT_EQ(r.rope_scaling.scaling, RopeScaling::llama3) << p;
        EXPECT_EQ(r.rope().original_context, 8192) << p;
        EXPECT_EQ(r.rope().theta, 500000.0f) << p;
        EXPECT_EQ(r.max_seq, 131072) << p;
        EXPECT_NO_THROW(r.validate()) << p;
    }
    EXPECT_EQ(model_preset("llama3.1-8b").rope_scaling.factor, 8.0f);
    EXPECT_EQ(model_preset("llama3.2-1b").rope_scaling.factor, 32.0f);
    EXPECT_EQ(model_preset("llama3.2-1b").head_dim(), 64);
    EXPECT_TRUE(model_preset("llama3.2-3b").tied_head);
    for (const char * small : {"llama-nano", "llama-micro", "llama-mini"}) {
        ModelConfig s = model_preset(small);
        s.vocab_size = 256;
        EXPECT_NO_THROW(s.validate()) << small;
        EXPECT_EQ(int64_t(make_param_layout(s).total), s.num_params()) << small;
    }
}

TEST(Llama, HuggingFaceConfigJson) {
    const fs::path dir = fs::temp_directory_path() / ("memfit_llama_cfg." + std::to_string(::getpid()));
    fs::create_directories(dir);
    nlohmann::json j = {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 4096},
                        {"intermediate_size", 14336}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                        {"num_key_value_heads", 8}, {"max_position_embeddings", 8192}, {"rms_norm_eps", 1e-5},
                        {"rope_theta", 500000.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
                        {"rope_scaling", nullptr}};
    std::ofstream(dir / "config.json") << j.dump();
    const ModelConfig c = resolve_model(dir.string());
    EXPECT_TRUE(c.llama());
    EXPECT_EQ(c.kv_heads(), 8);
    EXPECT_EQ(c.ffn_dim(), 14336);
    EXPECT_EQ(c.max_seq, 8192);
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_FALSE(c.tied_head);
    // It writes back what it read.
    const ModelConfig again = parse_hf_config(hf_config_json(c), "again");
    EXPECT_EQ(again.num_params(), c.num_params());
    EXPECT_EQ(again.rope_theta, c.rope_theta);
    EXPECT_EQ(again.n_kv_head, c.n_kv_head);

    auto refused = [&](const char * key, const nlohmann::json & value, const std::string & words) {
        nlohmann::json bad = j;
        bad[key] = value;
        try {
            parse_hf_config(bad, "cfg");
            ADD_FAILURE() << key << " accepted";
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    };
    refused("rope_scaling", {{"type", "llama3"}, {"factor", 8.0}}, "needs 'low_freq_factor'");
    refused("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}, "rope_scaling rope_type = \"dynamic\" is not supported");
    refused("rope_scaling", {{"rope_type", "ntk"}, {"factor", 4.0}}, "supported: llama3, linear, longrope, yarn");
    refused("rope_scaling", {{"rope_type", "yarn"}, {"factor", -4.0}}, "factor = -4.0 must be a positive number");
    refused("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "no"}}, "truncate = \"no\" must be true");
    refused("rope_scaling", {{"rope_type", "linear"}, {"factor", 0.5}}, "factor = 0.5, must be at least 1");
    refused("rope_scaling", {{"rope_type", "linear"}, {"factor", "2"}}, "factor = \"2\" is not a number");
    refused("rope_scaling", "llama3", "must be an object");
    refused("rope_scaling",
            {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0},
             {"original_max_position_embeddings", 8192}},
            "need 0 < low < high");
    refused("rope_scaling",
            {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
             {"original_max_position_embeddings", 81.5}},
            "must be a positive integer");
    {   // Llama 3.1's rope_scaling and linear scaling are read, and written back as read.
        nlohmann::json l31 = j;
        l31["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
        const ModelConfig r = parse_hf_config(l31, "cfg");
        EXPECT_EQ(r.rope_scaling.scaling, RopeScaling::llama3);
        EXPECT_EQ(r.rope_scaling.factor, 8.0f);
        EXPECT_EQ(r.rope_scaling.high_freq_factor, 4.0f);
        EXPECT_EQ(r.rope_scaling.original_context, 8192);
        EXPECT_EQ(hf_config_json(r)["rope_scaling"], l31["rope_scaling"]);
        const ModelConfig back = parse_hf_config(hf_config_json(r), "again");
        EXPECT_EQ(back.rope().inv_freq(40, 128), r.rope().inv_freq(40, 128));
        nlohmann::json lin = j;
        lin["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};   // the older key
        const ModelConfig rl = parse_hf_config(lin, "cfg");
        EXPECT_EQ(rl.rope_scaling.scaling, RopeScaling::linear);
        EXPECT_EQ(hf_config_json(rl)["rope_scaling"]["rope_type"], "linear");
        lin["rope_scaling"] = {{"rope_type", "default"}};
        EXPECT_EQ(parse_hf_config(lin, "cfg").rope_scaling.scaling, RopeScaling::none);
    }
    refused("hidden_act", "gelu", "hidden_act");
    refused("num_key_value_heads", 5, "not a multiple of num_key_value_heads = 5");
    refused("attention_bias", true, "no biases");
    refused("head_dim", 63, "head_dim = 63 must be even");
    {   // An explicit head dimension (q_proj [NH * head_dim, hidden]) is kept and written back.
        nlohmann::json explicit_hd = j;
        explicit_hd["head_dim"] = 64;
        const ModelConfig e = parse_hf_config(explicit_hd, "cfg");
        EXPECT_EQ(e.head_dim(), 64);
        EXPECT_EQ(e.attn_dim(), 64 * e.n_head);
        EXPECT_EQ(make_param_layout(e).find("model.layers.0.self_attn.o_proj.weight").shape[1], 64 * e.n_head);
        EXPECT_EQ(parse_hf_config(hf_config_json(e), "again").num_params(), e.num_params());
    }
    refused("model_type", "gemma2", "model_type 'gemma2' is not supported");
    // Found by the fuzzer: a float where an integer belongs must not be converted (UB).
    refused("vocab_size", 3.2e52, "vocab_size = 3.2e+52 is not an integer in range");
    refused("hidden_size", 64.5, "hidden_size = 64.5 is not an integer in range");
    refused("rope_theta", 1e300, "rope_theta = 1e+300 is not a number in range");
    nlohmann::json missing = j;
    missing.erase("hidden_size");
    EXPECT_THROW(parse_hf_config(missing, "cfg"), ConfigError);
    fs::remove_all(dir);
}

TEST(Llama, ParamLayoutHasHuggingFaceNamesAndFusedNeighbours) {
    const ModelConfig c = tiny_llama();
    const ParamLayout l = make_param_layout(c);
    EXPECT_EQ(int64_t(l.total), c.num_params());
    EXPECT_EQ(l.params.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(l.params.back().name, "lm_head.weight");
    EXPECT_EQ(l.find("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{16, 32}));  // [out, in]
    EXPECT_EQ(l.find("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{32, 48}));
    // q, k, v and gate, up are adjacent: one fused matmul each.
    const auto & q = l.find("model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(l.find("model.layers.0.self_attn.k_proj.weight").offset, q.offset + q.numel);
    const auto & gate = l.find("model.layers.0.mlp.gate_proj.weight");
    EXPECT_EQ(l.find("model.layers.0.mlp.up_proj.weight").offset, gate.offset + gate.numel);
    EXPECT_FALSE(l.find("model.norm.weight").decay());
    // Tied: no lm_head.
    EXPECT_EQ(make_param_layout(tiny_llama(61, 32, 2, 4, 2, 48, true)).try_find("lm_head.weight"), nullptr);
}

// Rope::inv_freq against the llama3 rule restated: theta 500000, hd 128, factor 8, low 1, high
// 4, original context 8192 (Llama 3.1 8B): wavelengths under 2048 keep their frequency, over
// 8192 divide it by 8, between blend linearly in 8192 / wavelength.
TEST(Llama, RopeScalingFrequencies) {
    Rope r = model_preset("llama3.1-8b").rope();
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < 64; ++i) {
        const double f = std::pow(500000.0, -2.0 * i / 128), w = 2 * M_PI / f;
        const double got = r.inv_freq(i, 128);
        if (w < 2048) {
            EXPECT_EQ(got, f) << i;
            ++kept;
        } else if (w > 8192) {
            EXPECT_DOUBLE_EQ(got, f / 8) << i;
            ++divided;
        } else {
            const double s = (8192 / w - 1) / 3;
            EXPECT_DOUBLE_EQ(got, (1 - s) * f / 8 + s * f) << i;
            EXPECT_LT(got, f);
            EXPECT_GT(got, f / 8);
            ++blended;
        }
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(blended, 0);
    r.scaling = RopeScaling::linear;
    r.factor = 4;
    EXPECT_DOUBLE_EQ(r.inv_freq(3, 64), std::pow(500000.0, -6.0 / 64) / 4);
    EXPECT_EQ(Rope(10000.0f).inv_freq(3, 64), std::pow(10000.0, -6.0 / 64));
}

// A tiny LLaMA with Llama 3.1's rope_scaling (tests/data/make_llama31_tiny.py: float64 PyTorch):
// logits, losses, gradients and two AdamW steps within 1e-4. Read as plain RoPE (its rope_scaling
// removed from the metadata) it fails, max error 0.47: the frequencies are what it checks.
TEST(Llama, RopeScalingFixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/llama31_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_GE(r.json["errors"].size(), 60u);
}

// Qwen2 (tests/data/make_llama_family_fixtures.py: float64 PyTorch): LLaMA blocks with biases on
// q, k and v, a tied head and rope_theta 1e6; the bias gradients and updates are checked too.
TEST(Llama, Qwen2FixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/qwen2_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_TRUE(r.json["errors"].contains("grad.model.layers.1.self_attn.k_proj.bias")) << r.json.dump(2);
}

// Mistral with sliding_window 7 below T = 24 (same generator): each query attends to its last 7
// keys; read without the window it fails (max error 0.70).
TEST(Llama, MistralSlidingWindowFixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/mistral_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
}

// Phi-3 (same generator, phi3_tiny.safetensors): LLaMA blocks whose checkpoint fuses q|k|v into
// qkv_proj and gate|up into gate_up_proj, with a sliding window of 9 below T = 24; verify reads
// and compares the fused tensors.
TEST(Llama, Phi3FusedFixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/phi3_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_TRUE(r.json["errors"].contains("grad.model.layers.1.self_attn.qkv_proj.weight")) << r.json.dump(2);
    EXPECT_TRUE(r.json["errors"].contains("step2.model.layers.0.mlp.gate_up_proj.weight")) << r.json.dump(2);
}

// phi3 configs: Phi3Config's defaults, its sliding_window (absent or null: none), the presets at
// the published counts (Phi-3-mini 3,821,079,552, keras-hub's figure; Phi-4 14.66B), written back
// as Phi3ForCausalLM; a longrope list of the wrong length refused in one line.
TEST(Llama, Phi3ConfigsAndPresets) {
    const ModelConfig mini = model_preset("phi-3-mini");
    EXPECT_EQ(mini.num_params(), 3821079552);
    EXPECT_EQ(mini.sliding_window, 2047);
    EXPECT_EQ(mini.model_type, "phi3");
    EXPECT_EQ(model_preset("phi-4").num_params(), 14659507200);
    EXPECT_EQ(model_preset("phi-4").sliding_window, 0);
    nlohmann::json j = {{"model_type", "phi3"}, {"hidden_size", 64}, {"intermediate_size", 128},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
    const ModelConfig c = parse_hf_config(j, "phi3");
    EXPECT_EQ(c.vocab_size, 32064);   // Phi3Config's defaults
    EXPECT_EQ(c.max_seq, 4096);
    EXPECT_FLOAT_EQ(c.ln_eps, 1e-5f);
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(c.kv_heads(), 4);
    j["sliding_window"] = 2047;
    const ModelConfig w = parse_hf_config(j, "phi3");
    EXPECT_EQ(w.sliding_window, 2047);
    const nlohmann::json back = hf_config_json(w);
    EXPECT_EQ(back["architectures"][0], "Phi3ForCausalLM");
    EXPECT_EQ(back["model_type"], "phi3");
    EXPECT_EQ(back["sliding_window"], 2047);
    EXPECT_EQ(parse_hf_config(back, "again").sliding_window, 2047);
    EXPECT_TRUE(hf_config_json(c)["sliding_window"].is_null());
    for (const auto & [key, value, words] :
         {std::tuple<std::string, nlohmann::json, std::string>{"partial_rotary_factor", 1.5, "partial_rotary_factor"},
          {"partial_rotary_factor", 0.01, "rotary dimensions"},
          {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0}}}, "long_factor"},
          {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {2.0}}}, "need 8 each"},
          {"rope_scaling", {{"type", "longrope"}, {"short_factor", {-1.0}}, {"long_factor", {2.0}}}, "positive"}}) {
        nlohmann::json bad = j;
        bad[key] = value;
        try {
            parse_hf_config(bad, "phi.json").validate();
            ADD_FAILURE() << key << " " << value.dump() << " accepted";
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    }
    // LoRA names PEFT's modules: q, k, v select the fused qkv_proj, gate and up gate_up_proj.
    EXPECT_EQ(parse_lora_targets(c, "q,v"), (std::vector<std::string>{"qkv"}));
    EXPECT_EQ(parse_lora_targets(c, "all"), (std::vector<std::string>{"qkv", "o", "gate_up", "down"}));
    EXPECT_EQ(parse_lora_targets(c, "gate_up_proj,o_proj"), (std::vector<std::string>{"o", "gate_up"}));
    LoraOptions lo = test::lora_options(c, 4, BaseWeights::compute, "all");
    EXPECT_EQ(peft_target_modules(c, lo), (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
    EXPECT_THROW(parse_lora_targets(c, "c_attn"), ConfigError);
}

// Phi-4-mini's form (same generator, phi3_longrope_tiny.safetensors): 12 of each head's 16
// dimensions turn, LongRoPE's long factors (T = 24 past the original 16) with cos and sin scaled
// by sqrt(1 + ln 4 / ln 16); the config read, validated and written back in Phi3Config's form.
TEST(Llama, Phi3PartialRotaryLongRopeFixtureWithin1e4) {
    const std::string path = std::string(MEMFIT_TEST_DATA) + "/phi3_longrope_tiny.safetensors";
    const VerifyReport r = verify_fixture(path);
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    const nlohmann::json j = {{"model_type", "phi3"}, {"hidden_size", 64}, {"intermediate_size", 128},
                              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"max_position_embeddings", 64}, {"original_max_position_embeddings", 16},
                              {"partial_rotary_factor", 0.75},
                              {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1, 1.1, 1.3, 1.6, 2, 2.5}},
                                                {"long_factor", {1, 1.5, 2.5, 4, 6, 9}}}}};
    const ModelConfig c = parse_hf_config(j, "phi4mini");
    EXPECT_NO_THROW(c.validate());
    const Rope rope = c.rope();
    EXPECT_EQ(rope.rotary_dims(16), 12);
    EXPECT_NEAR(rope.magnitude(), std::sqrt(1.5), 1e-6);
    // Short factors up to the original context, long ones past it; frequencies over 12 dimensions.
    EXPECT_NEAR(rope.for_sequence(16).inv_freq(5, 16), std::pow(10000.0, -10.0 / 12) / 2.5, 1e-12);
    EXPECT_NEAR(rope.for_sequence(17).inv_freq(5, 16), std::pow(10000.0, -10.0 / 12) / 9.0, 1e-12);
    const nlohmann::json back = hf_config_json(c);
    EXPECT_EQ(back["rope_scaling"].size(), 3u);   // Phi3Config's type, short_factor, long_factor
    EXPECT_EQ(back["original_max_position_embeddings"], 16);
    EXPECT_EQ(back["partial_rotary_factor"], 0.75);
    const ModelConfig again = parse_hf_config(back, "again");
    EXPECT_EQ(again.rope().long_factor, rope.long_factor);
    EXPECT_EQ(again.rope().rotary_dims(16), 12);
    EXPECT_FLOAT_EQ(again.rope().magnitude(), rope.magnitude());
}

// Qwen2.5 presets at the Hub's counts (Qwen/Qwen2.5-0.5B, -1.5B, -7B); qwen2 and mistral configs
// are LLaMA blocks read with their own defaults and written back under their own classes.
TEST(Llama, Qwen2AndMistralConfigs) {
    EXPECT_EQ(model_preset("qwen2.5-0.5b").num_params(), 494032768);
    EXPECT_EQ(model_preset("qwen2.5-1.5b").num_params(), 1543714304);
    EXPECT_EQ(model_preset("qwen2.5-7b").num_params(), 7615616512);
    const ModelConfig q = model_preset("qwen2.5-0.5b");
    EXPECT_TRUE(q.llama());
    EXPECT_TRUE(q.qkv_bias);
    EXPECT_EQ(q.model_type, "qwen2");
    EXPECT_EQ(make_param_layout(q).find("model.layers.3.self_attn.k_proj.bias").numel, 128u);
    EXPECT_EQ(int64_t(make_param_layout(q).total), q.num_params());

    const nlohmann::json qj = {{"model_type", "qwen2"}, {"hidden_size", 64}, {"intermediate_size", 160},
                               {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                               {"tie_word_embeddings", true}, {"use_sliding_window", false}};
    const ModelConfig qc = parse_hf_config(qj, "qwen");
    EXPECT_EQ(qc.vocab_size, 151936);   // Qwen2Config's defaults
    EXPECT_EQ(qc.max_seq, 32768);
    EXPECT_TRUE(qc.qkv_bias);
    const nlohmann::json back = hf_config_json(qc);
    EXPECT_EQ(back["architectures"][0], "Qwen2ForCausalLM");
    EXPECT_EQ(back["model_type"], "qwen2");
    EXPECT_FALSE(back.contains("attention_bias"));
    EXPECT_EQ(parse_hf_config(back, "again").num_params(), qc.num_params());
    nlohmann::json window = qj;
    window["use_sliding_window"] = true;
    EXPECT_THROW(parse_hf_config(window, "qwen"), ConfigError);
    try {
        tp_local_config(qc, 2);
        ADD_FAILURE() << "tp accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("q, k and v biases"), std::string::npos) << e.what();
    }

    nlohmann::json mj = {{"model_type", "mistral"}, {"hidden_size", 64}, {"intermediate_size", 176},
                         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
    const ModelConfig m = parse_hf_config(mj, "mistral");
    EXPECT_EQ(m.sliding_window, 4096);   // MistralConfig's default
    EXPECT_FALSE(m.qkv_bias);
    EXPECT_EQ(hf_config_json(m)["architectures"][0], "MistralForCausalLM");
    EXPECT_EQ(hf_config_json(m)["sliding_window"], 4096);
    EXPECT_EQ(parse_hf_config(hf_config_json(m), "again").sliding_window, 4096);
    mj["sliding_window"] = nullptr;   // Mistral 7B v0.2 and later
    EXPECT_EQ(parse_hf_config(mj, "mistral").sliding_window, 0);
    EXPECT_TRUE(hf_config_json(parse_hf_config(mj, "mistral"))["sliding_window"].is_null());
    mj["sliding_window"] = -4;
    EXPECT_THROW(parse_hf_config(mj, "mistral"), ConfigError);
}

// Qwen3 (same generator): each q and k head RMS-normalized (q_norm, k_norm) before RoPE, an
// explicit head_dim 32 != 64 / 4 heads, a tied head; the norms' gradients and updates checked too.
TEST(Llama, Qwen3FixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/qwen3_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_TRUE(r.json["errors"].contains("grad.model.layers.0.self_attn.q_norm.weight")) << r.json.dump(2);
    EXPECT_TRUE(r.json["errors"].contains("step2.model.layers.1.self_attn.k_norm.weight")) << r.json.dump(2);
}

// YaRN (same generator, qwen2_yarn_tiny.safetensors: Qwen2.5's long-context rope_scaling, factor 4
// over 4096 positions): kept, blended and interpolated frequency pairs and the 0.1 ln 4 + 1 scale
// of cos and sin, at T = 24 as at any length. Read as plain RoPE it fails.
TEST(Llama, YarnFixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/qwen2_yarn_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
}

// rope_scaling yarn as transformers reads it: the defaults (beta 32 / 1, factor from the contexts,
// attention_factor 0.1 ln s + 1, or the mscale ratio), the frequencies at the ramp's ends, and
// export writing every field back.
TEST(Llama, YarnConfigsRoundTrip) {
    nlohmann::json j = {{"model_type", "qwen2"}, {"hidden_size", 64}, {"intermediate_size", 128},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"max_position_embeddings", 131072},
                        {"rope_theta", 1000000.0},
                        {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}};
    const ModelConfig c = parse_hf_config(j, "qwen2.5-yarn");
    const Rope & r = c.rope_scaling;
    EXPECT_EQ(r.scaling, RopeScaling::yarn);
    EXPECT_EQ(r.original_context, 32768);
    EXPECT_FLOAT_EQ(r.beta_fast, 32.0f);
    EXPECT_NEAR(r.magnitude(), 0.1 * std::log(4.0) + 1, 1e-6);
    const Rope rope = c.rope();
    const int hd = c.head_dim(), half = hd / 2;   // 16: the highest pair kept, the lowest divided by 4
    EXPECT_DOUBLE_EQ(rope.inv_freq(0, hd), 1.0);
    EXPECT_NEAR(rope.inv_freq(half - 1, hd), std::pow(1e6, -2.0 * (half - 1) / hd) / 4, 1e-15);
    const ModelConfig back = parse_hf_config(hf_config_json(c), "again");
    EXPECT_EQ(back.rope_scaling.scaling, RopeScaling::yarn);
    for (int i = 0; i < half; ++i) EXPECT_DOUBLE_EQ(back.rope().inv_freq(i, hd), rope.inv_freq(i, hd)) << i;
    EXPECT_FLOAT_EQ(back.rope().magnitude(), rope.magnitude());
    // DeepSeek's form: no factor (the contexts' ratio), mscale over mscale_all_dim.
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 4096}, {"mscale", 1.0},
                         {"mscale_all_dim", 0.5}};
    const Rope d = parse_hf_config(j, "deepseek-form").rope_scaling;
    EXPECT_FLOAT_EQ(d.factor, 32.0f);
    EXPECT_NEAR(d.attention_factor, (0.1 * std::log(32.0) + 1) / (0.05 * std::log(32.0) + 1), 1e-6);
}

// OLMo 2 (same generator, olmo2_tiny.safetensors): q and k RMS-normalized over all their heads
// before RoPE, and each block's norms on the attention and MLP outputs before the residual adds;
// both norms' and the q/k norms' gradients and updates checked.
TEST(Llama, Olmo2FixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/olmo2_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    for (const char * name : {"grad.model.layers.0.self_attn.q_norm.weight", "step2.model.layers.1.self_attn.k_norm.weight",
                              "grad.model.layers.1.post_attention_layernorm.weight",
                              "step2.model.layers.0.post_feedforward_layernorm.weight"})
        EXPECT_TRUE(r.json["errors"].contains(name)) << name << "\n" << r.json.dump(2);
    EXPECT_FALSE(r.json["errors"].contains("grad.model.layers.0.input_layernorm.weight")) << r.json.dump(2);
}

// OLMo 2 configs: Olmo2Config's defaults, the norms the model_type implies, the presets at the
// counts of their published shapes (OLMo-2-1124-7B: 7.30B; 13B: 13.7B), written back as
// Olmo2ForCausalLM; grouped KV heads (OLMo-2-32B) refused in one line, and so is --tp.
TEST(Llama, Olmo2ConfigsAndPresets) {
    const ModelConfig seven = model_preset("olmo-2-7b");
    EXPECT_EQ(seven.num_params(), 7298617344);
    EXPECT_TRUE(seven.post_norm && seven.qk_norm && seven.qk_norm_whole);
    EXPECT_FALSE(seven.tied_head);
    EXPECT_EQ(make_param_layout(seven).find("model.layers.31.self_attn.k_norm.weight").numel, 4096u);
    EXPECT_EQ(make_param_layout(seven).try_find("model.layers.0.input_layernorm.weight"), nullptr);
    EXPECT_EQ(int64_t(make_param_layout(seven).total), seven.num_params());
    EXPECT_EQ(model_preset("olmo-2-13b").num_params(), 13716198400);
    EXPECT_EQ(model_preset("olmo-2-1b").num_params(), 1484916736);
    nlohmann::json j = {{"model_type", "olmo2"}, {"hidden_size", 64}, {"intermediate_size", 160},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
    const ModelConfig c = parse_hf_config(j, "olmo2");
    EXPECT_EQ(c.vocab_size, 50304);   // Olmo2Config's defaults
    EXPECT_EQ(c.max_seq, 2048);
    EXPECT_FLOAT_EQ(c.ln_eps, 1e-5f);
    EXPECT_TRUE(c.post_norm && c.qk_norm_whole);
    const nlohmann::json back = hf_config_json(c);
    EXPECT_EQ(back["architectures"][0], "Olmo2ForCausalLM");
    EXPECT_EQ(back["model_type"], "olmo2");
    EXPECT_TRUE(parse_hf_config(back, "again").post_norm);
    j["num_key_value_heads"] = 2;
    try {
        parse_hf_config(j, "olmo2-gqa");
        ADD_FAILURE() << "grouped KV heads accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("olmo2 with 2 KV heads for 4 heads"), std::string::npos) << e.what();
    }
    EXPECT_THROW(tp_local_config(seven, 2), ConfigError);
}

// Gemma 3 (same generator, gemma3_tiny.safetensors): GeGLU, norms before and after attention and
// the MLP with (1 + w) weights, the embedding times sqrt(C), q and k norms per head, scores scaled
// by query_pre_attn_scalar 24 (head_dim 32); layers 0 and 2 slide (window 7 < T = 24, RoPE base
// 1e4) around a global layer 1 (rope_theta 1e6, linear factor 2). Each kind of norm's gradient
// and update is checked, the updates as the checkpoint stores them.
TEST(Llama, Gemma3FixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/gemma3_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    for (const char * name : {"grad.model.layers.1.self_attn.q_norm.weight", "step2.model.layers.1.self_attn.q_norm.weight",
                              "step2.model.layers.0.pre_feedforward_layernorm.weight",
                              "step2.model.layers.2.post_feedforward_layernorm.weight",
                              "step1.model.layers.1.post_attention_layernorm.weight", "step2.model.norm.weight"})
        EXPECT_TRUE(r.json["errors"].contains(name)) << name << "\n" << r.json.dump(2);
}

// Gemma 3 configs: Gemma3TextConfig's defaults, which layers slide (layer_types or the older
// sliding_window_pattern) and their RoPE bases, the presets (gemma-3-1b at the 999,885,952
// parameters of its safetensors; 27B's head_dim 128 and query_pre_attn_scalar 168), written back
// as Gemma3ForCausalLM; an irregular layer_types and Gemma 2's soft-capping refused in one line.
TEST(Llama, Gemma3ConfigsAndPresets) {
    const ModelConfig one = model_preset("gemma-3-1b");
    EXPECT_EQ(one.num_params(), 999885952);
    EXPECT_TRUE(one.sandwich_norm && one.norm_plus_one && one.scale_embed && one.qk_norm && one.tied_head);
    EXPECT_EQ(one.glu, Glu::gelu_tanh);
    EXPECT_EQ(one.head_dim(), 256);
    EXPECT_EQ(one.layer_window(0), 512);
    EXPECT_EQ(one.layer_window(5), 0);
    EXPECT_EQ(one.layer_window(11), 0);
    EXPECT_EQ(one.layer_window(12), 512);
    EXPECT_DOUBLE_EQ(one.layer_rope(0).inv_freq(1, 256), std::pow(1e4, -2.0 / 256));
    EXPECT_DOUBLE_EQ(one.layer_rope(5).inv_freq(1, 256), std::pow(1e6, -2.0 / 256));
    EXPECT_FLOAT_EQ(one.score_scale(), 1.0f);
    EXPECT_FLOAT_EQ(one.embed_scale(), std::sqrt(1152.0f));
    const ModelConfig big = model_preset("gemma-3-27b");
    EXPECT_EQ(big.head_dim(), 128);
    EXPECT_FLOAT_EQ(big.score_scale(), std::sqrt(128.0f / 168.0f));
    EXPECT_DOUBLE_EQ(big.layer_rope(5).inv_freq(0, 128), 1.0 / 8);   // global: linear factor 8
    EXPECT_DOUBLE_EQ(big.layer_rope(4).inv_freq(0, 128), 1.0);       // sliding: plain
    for (const char * name : {"gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"}) {
        const ModelConfig c = model_preset(name);
        EXPECT_EQ(int64_t(make_param_layout(c).total), c.num_params()) << name;
    }
    nlohmann::json j = {{"model_type", "gemma3_text"}, {"hidden_size", 64}, {"intermediate_size", 160},
                        {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
    const ModelConfig d = parse_hf_config(j, "gemma3");
    EXPECT_EQ(d.vocab_size, 262208);   // Gemma3TextConfig's defaults
    EXPECT_EQ(d.head_dim(), 256);
    EXPECT_EQ(d.sliding_window, 4096);
    EXPECT_EQ(d.sliding_pattern, 6);
    EXPECT_FLOAT_EQ(d.attn_scalar, 256.0f);
    EXPECT_FLOAT_EQ(d.rope_local_theta, 10000.0f);
    EXPECT_FLOAT_EQ(d.rope_theta, 1e6f);
    EXPECT_TRUE(d.tied_head);
    j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"};
    j["query_pre_attn_scalar"] = 24;
    const ModelConfig c = parse_hf_config(j, "gemma3");
    EXPECT_EQ(c.sliding_pattern, 3);
    const nlohmann::json back = hf_config_json(c);
    EXPECT_EQ(back["architectures"][0], "Gemma3ForCausalLM");
    EXPECT_EQ(back["layer_types"], j["layer_types"]);
    EXPECT_EQ(back["hidden_activation"], "gelu_pytorch_tanh");
    EXPECT_FALSE(back.contains("hidden_act"));
    const ModelConfig again = parse_hf_config(back, "again");
    EXPECT_EQ(again.sliding_pattern, 3);
    EXPECT_FLOAT_EQ(again.attn_scalar, 24.0f);
    EXPECT_EQ(again.num_params(), c.num_params());
    auto refused = [&](nlohmann::json bad, const char * why) {
        try {
            parse_hf_config(bad, "bad");
            ADD_FAILURE() << "accepted: " << why;
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
        }
    };
    nlohmann::json irregular = j;
    irregular["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "sliding_attention"};
    refused(irregular, "layer 2 breaks the pattern");
    nlohmann::json capped = j;
    capped["final_logit_softcapping"] = 30.0;
    refused(capped, "soft-capping is Gemma 2's");
    nlohmann::json erf = j;
    erf["hidden_activation"] = "gelu";
    refused(erf, "Gemma 3's gate is gelu_pytorch_tanh");
    nlohmann::json zero = j;
    zero["query_pre_attn_scalar"] = 0;
    refused(zero, "query_pre_attn_scalar = 0 is not supported");
}

// GPT-NeoX (tests/data/make_neox_fixtures.py): LayerNorms with biases, biases on every projection,
// q|k|v interleaved head by head in query_key_value, a quarter of each head rotated, an ungated
// exact-GELU MLP, attention and the MLP side by side (gpt_neox_tiny, Pythia's form) or one after
// the other with half the head rotated at base 500 (gpt_neox_sequential_tiny), an untied embed_out.
TEST(Llama, GptNeoxFixturesWithin1e4) {
    for (const char * fixture : {"gpt_neox_tiny", "gpt_neox_sequential_tiny"}) {
        SCOPED_TRACE(fixture);
        const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/" + fixture + ".safetensors");
        EXPECT_TRUE(r.ok) << r.json.dump(2);
        EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
        for (const char * name : {"grad.gpt_neox.layers.1.attention.query_key_value.weight",
                                  "step2.gpt_neox.layers.0.attention.query_key_value.bias",
                                  "grad.gpt_neox.layers.0.post_attention_layernorm.bias", "step2.embed_out.weight",
                                  "grad.gpt_neox.final_layer_norm.bias", "step1.gpt_neox.layers.1.mlp.dense_4h_to_h.bias"})
            EXPECT_TRUE(r.json["errors"].contains(name)) << name << "\n" << r.json.dump(2);
    }
}

// GPT-NeoX configs: GPTNeoXConfig's defaults (rotary_pct 0.25, parallel residuals, exact GELU),
// the Pythia presets at the paper's totals (1B: 1,011,781,632; 6.9B: 6,857,302,016), written back
// as GPTNeoXForCausalLM; no attention biases and LoRA refused in one line.
TEST(Llama, GptNeoxConfigsAndPresets) {
    EXPECT_EQ(model_preset("pythia-1b").num_params(), 1011781632);
    EXPECT_EQ(model_preset("pythia-6.9b").num_params(), 6857302016);
    for (const char * name : {"pythia-1b", "pythia-6.9b"}) {
        const ModelConfig c = model_preset(name);
        EXPECT_EQ(int64_t(make_param_layout(c).total), c.num_params()) << name;
        EXPECT_EQ(c.rope_scaling.rotary_dims(c.head_dim()), c.head_dim() / 4) << name;
    }
    nlohmann::json j = {{"model_type", "gpt_neox"}, {"vocab_size", 97}, {"hidden_size", 64}, {"intermediate_size", 256},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
    const ModelConfig c = parse_hf_config(j, "neox");
    EXPECT_TRUE(c.layer_norm && c.proj_bias && c.plain_mlp && c.parallel_residual && c.qkv_bias);
    EXPECT_FALSE(c.tied_head);
    EXPECT_EQ(c.gelu, Gelu::erf);
    EXPECT_EQ(c.fc_dim(), 256);
    EXPECT_EQ(c.rope_scaling.rotary_dims(16), 4);
    EXPECT_FLOAT_EQ(c.ln_eps, 1e-5f);
    const nlohmann::json back = hf_config_json(c);
    EXPECT_EQ(back["architectures"][0], "GPTNeoXForCausalLM");
    EXPECT_EQ(back["rotary_pct"], 0.25);
    EXPECT_EQ(back["use_parallel_residual"], true);
    const ModelConfig again = parse_hf_config(back, "again");
    EXPECT_EQ(again.num_params(), c.num_params());
    EXPECT_EQ(again.rope_scaling.rotary_dims(16), 4);
    j["attention_bias"] = false;
    EXPECT_THROW(parse_hf_config(j, "unbiased"), ConfigError);
}

// Qwen3 and Mistral 7B presets, counted from their config.json shapes; the model cards' rounded
// totals (non-embedding): Qwen3 0.6B (0.44B), 1.7B (1.4B), 4.0B (3.6B), 8.2B (6.95B); Mistral
// 7B v0.1 7,241,732,096. A qwen3 config takes Qwen3Config's head_dim 128 when it has none.
TEST(Llama, Qwen3AndMistral7bConfigs) {
    EXPECT_EQ(model_preset("qwen3-0.6b").num_params(), 596049920);
    EXPECT_EQ(model_preset("qwen3-1.7b").num_params(), 1720574976);
    EXPECT_EQ(model_preset("qwen3-4b").num_params(), 4022468096);
    EXPECT_EQ(model_preset("qwen3-8b").num_params(), 8190735360);
    EXPECT_EQ(model_preset("mistral-7b").num_params(), 7241732096);
    EXPECT_EQ(model_preset("mistral-7b").sliding_window, 4096);
    EXPECT_EQ(model_preset("mistral-7b").model_type, "mistral");
    const ModelConfig q = model_preset("qwen3-0.6b");
    EXPECT_TRUE(q.qk_norm);
    EXPECT_FALSE(q.qkv_bias);
    EXPECT_EQ(q.head_dim(), 128);
    EXPECT_EQ(q.attn_dim(), 2048);   // 16 heads of 128 over 1024 channels
    EXPECT_EQ(make_param_layout(q).find("model.layers.27.self_attn.k_norm.weight").numel, 128u);
    EXPECT_EQ(int64_t(make_param_layout(q).total), q.num_params());

    nlohmann::json qj = {{"model_type", "qwen3"}, {"hidden_size", 64}, {"intermediate_size", 160},
                         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
    const ModelConfig qc = parse_hf_config(qj, "qwen3");
    EXPECT_TRUE(qc.qk_norm);
    EXPECT_EQ(qc.head_dim(), 128);
    EXPECT_EQ(qc.vocab_size, 151936);
    const nlohmann::json back = hf_config_json(qc);
    EXPECT_EQ(back["architectures"][0], "Qwen3ForCausalLM");
    EXPECT_EQ(back["head_dim"], 128);
    EXPECT_EQ(parse_hf_config(back, "again").num_params(), qc.num_params());
    qj["head_dim"] = 16;   // = 64 / 4: implicit
    EXPECT_EQ(parse_hf_config(qj, "qwen3").head_size, 0);
    EXPECT_EQ(parse_hf_config(qj, "qwen3").head_dim(), 16);
    qj["attention_bias"] = true;
    EXPECT_THROW(parse_hf_config(qj, "qwen3"), ConfigError);
    try {
        tp_local_config(qc, 2);
        ADD_FAILURE() << "tp accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("q and k norms"), std::string::npos) << e.what();
    }
}

TEST(Llama, SharedFixtureWithin1e4) {
    const VerifyReport r = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/llama_tiny.safetensors");
    EXPECT_TRUE(r.ok) << r.json.dump(2);
    EXPECT_LE(r.json["max_error"].get<double>(), 1e-4);
    EXPECT_GE(r.json["errors"].size(), 60u);   // logits, 2 losses, 3 x 20 tensors
    const VerifyReport checked = verify_fixture(std::string(MEMFIT_TEST_DATA) + "/llama_tiny.safetensors", 1e-4, true);
    EXPECT_TRUE(checked.ok) << checked.json.dump(2);
}

// Analytic gradients against central differences of the mean loss, at the largest-gradient
// element of every tensor, with weights drawn large enough that every layer matters.
TEST(Llama, GradientsMatchFiniteDifferences) {
    CpuBackend backend;
    const int B = 2, T = 9;
    for (bool tied : {false, true})
        for (bool flash : {false, true}) {
            SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (flash ? " flash" : " naive"));
            const ModelConfig cfg = tiny_llama(37, 16, 2, 4, 2, 24, tied);
            Engine e(cfg, backend, opts(B, T, flash));
            e.init_params(1);   // zeroes the AdamW moments too
            std::mt19937 rng(7);
            std::normal_distribution<float> nd(0.0f, 0.3f);
            const ParamLayout & layout = e.step().layout();
            for (const auto & p : layout.params)
                for (size_t i = 0; i < p.numel; ++i)
                    e.params()[p.offset + i] = p.shape.size() == 1 ? 1.0f + 0.2f * nd(rng) : nd(rng);
            e.params_changed();
            std::vector<int32_t> in(size_t(B * T)), tg(in.size());
            random_batch(in, tg, cfg.vocab_size, 3);
            memfit::test::expect_largest_grads_match_fd(e, in, tg, 1e-2f);
        }
}

TEST(Llama, PlannedEqualsMeasuredForEveryTechnique) {
    CpuBackend backend;
    const ModelConfig cfg = tiny_llama(61, 32, 3, 4, 2, 48);
    struct Case { bool flash; const char * rc; DType dt; int chunk; };
    for (const Case & c : {Case{false, "none", DType::f32, 0}, Case{true, "none", DType::f32, 7},
                           Case{true, "selective", DType::bf16, 0}, Case{false, "full", DType::f32, 0},
                           Case{true, "every:2", DType::f16, 5}}) {
        SCOPED_TRACE(std::string(c.rc) + (c.flash ? " flash " : " naive ") + std::string(dtype_name(c.dt)));
        EngineOptions eo = opts(2, 16, c.flash, parse_recompute(c.rc, cfg.n_layer), c.dt);
        eo.loss_chunk = c.chunk;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(size_t(2 * 16)), tg(in.size());
        for (int s = 0; s < 2; ++s) {
            random_batch(in, tg, cfg.vocab_size, uint64_t(s));
            e.train_step(in.data(), tg.data(), OptimHyper{});
            e.eval_loss(in.data(), tg.data());
        }
        const CategoryBytes plan = e.planned_peak_live(), rsv = e.planned_reserved();
        for (size_t k = 0; k < kCategoryCount; ++k) {
            EXPECT_EQ(plan.v[k], e.ledger().live_peak().v[k]) << kCategoryNames[k];
            EXPECT_EQ(rsv.v[k], e.ledger().reserved_peak().v[k]) << kCategoryNames[k];
        }
    }
}

TEST(Llama, RecomputationIsBitwiseEqualAndCostsWhatTheModelSays) {
    CpuBackend backend;
    const ModelConfig cfg = tiny_llama(61, 32, 4, 4, 2, 48);
    const int B = 2, T = 12;
    for (bool flash : {false, true}) {
        std::vector<float> ref;
        for (const char * pol : {"none", "full", "selective", "every:2", "sqrt"}) {
            SCOPED_TRACE(std::string(pol) + (flash ? " flash" : " naive"));
            const RecomputePlan rc = parse_recompute(pol, cfg.n_layer);
            Engine e(cfg, backend, opts(B, T, flash, rc));
            e.init_params(5);
            std::vector<int32_t> in(size_t(B * T)), tg(in.size());
            for (int s = 0; s < 2; ++s) {
                random_batch(in, tg, cfg.vocab_size, uint64_t(s));
                e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
            }
            const size_t P = e.step().layout().total;
            if (ref.empty()) ref.assign(e.params(), e.params() + P);
            else EXPECT_EQ(0, std::memcmp(ref.data(), e.params(), P * 4));
            if (rc.segment == 0) {
                double want = 0;
                for (int l = 0; l < cfg.n_layer; ++l) want += layer_keep_cost(cfg, B, T, flash, DType::f32, rc.kept(l)).flops;
                EXPECT_DOUBLE_EQ(e.step().program().phase_flops(Phase::recompute), want);
            }
        }
    }
}
