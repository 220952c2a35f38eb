// Presets, Hugging Face config.json, and the parameter layout.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/config.h"
#include "model/param_layout.h"

using namespace memfit;
namespace fs = std::filesystem;

TEST(ModelConfig, Gpt2PresetsHaveThePublishedParameterCounts) {
    // Hugging Face's counts (tied head, position embeddings included).
    EXPECT_EQ(model_preset("gpt2").num_params(), 124439808);
    EXPECT_EQ(model_preset("gpt2-medium").num_params(), 354823168);
    EXPECT_EQ(model_preset("gpt2-large").num_params(), 774030080);
    EXPECT_EQ(model_preset("gpt2-xl").num_params(), 1557611200);
}

TEST(ModelConfig, UnknownPresetListsTheKnownOnes) {
    try {
        model_preset("gpt5");
        FAIL();
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("unknown model 'gpt5'"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("gpt2-medium"), std::string::npos);
    }
}

TEST(ModelConfig, ValidateNamesTheBadField) {
    ModelConfig c = model_preset("gpt2");
    c.n_head = 7;
    EXPECT_THROW(c.validate(), ConfigError);
    try { c.validate(); } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("not divisible by n_head = 7"), std::string::npos);
    }
}

// Sizes whose products would overflow an int (n_head * head_dim, q|k|v) are refused by name
// before any is formed: plan, train and export used to abort or report 16 EiB on them.
TEST(ModelConfig, SizesThatWouldOverflowAreRefused) {
    const nlohmann::json base = {{"model_type", "llama"},       {"vocab_size", 256},        {"hidden_size", 64},
                                 {"intermediate_size", 176},    {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2},    {"max_position_embeddings", 128}};
    EXPECT_EQ(parse_hf_config(base, "ok").attn_dim(), 64);
    nlohmann::json wide = base;
    wide["head_dim"] = 65536 / 4;   // 4 heads x 16384 = 65536: within the bound
    EXPECT_EQ(parse_hf_config(wide, "wide").attn_dim(), 65536);
    struct Case { const char * field; nlohmann::json patch; };
    for (const Case & k : {Case{"head_dim", {{"head_dim", 2000000000}}},
                           Case{"num_attention_heads x head_dim",   // 32 x 65536 = 2^21
                                {{"head_dim", 65536}, {"num_attention_heads", 32}}},
                           Case{"num_attention_heads", {{"num_attention_heads", 2000000000}, {"num_key_value_heads", 2000000000}}}}) {
        nlohmann::json j = base;
        j.update(k.patch);
        try {
            parse_hf_config(j, "big");
            ADD_FAILURE() << k.patch.dump() << " was accepted";
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find(std::string(k.field) + " = "), std::string::npos) << e.what();
        }
    }
}

// The trained context travels in config.json (memfit_trained_context); a config without it (a
// pretrained Hub model) was trained on every position.
TEST(ModelConfig, TrainedContextRoundTrips) {
    ModelConfig c = model_preset("micro");
    c.vocab_size = 256;
    EXPECT_EQ(c.trained_context(), 256);
    EXPECT_FALSE(hf_config_json(c).contains(kTrainedContextKey));
    c.trained_seq = 128;
    const nlohmann::json j = hf_config_json(c);
    EXPECT_EQ(j[kTrainedContextKey], 128);
    const ModelConfig back = parse_hf_config(j, "micro.json");
    EXPECT_EQ(back.trained_seq, 128);
    EXPECT_EQ(back.trained_context(), 128);
    EXPECT_EQ(back.max_seq, 256);
    nlohmann::json bad = j;
    bad[kTrainedContextKey] = -3;
    EXPECT_THROW(parse_hf_config(bad, "bad.json"), ConfigError);
}

TEST(ModelConfig, HuggingFaceConfigJson) {
    const fs::path dir = fs::temp_directory_path() / ("memfit_cfg." + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": 1000, "n_positions": 128,
        "n_embd": 96, "n_layer": 3, "n_head": 4, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"})";
    const ModelConfig c = resolve_model((dir / "config.json").string());
    EXPECT_EQ(c.vocab_size, 1000);
    EXPECT_EQ(c.max_seq, 128);
    EXPECT_EQ(c.n_embd, 96);
    EXPECT_EQ(c.n_layer, 3);
    EXPECT_EQ(c.n_head, 4);
    // A folder holding config.json works too.
    EXPECT_EQ(resolve_model(dir.string() + "/").n_layer, 3);

    std::ofstream(dir / "bad.json") << R"({"model_type": "gpt2", "vocab_size": 1000, "n_embd": 96})";
    EXPECT_THROW(resolve_model((dir / "bad.json").string()), ConfigError);
    std::ofstream(dir / "broken.json") << "{ not json";
    EXPECT_THROW(resolve_model((dir / "broken.json").string()), ConfigError);
    EXPECT_THROW(resolve_model((dir / "missing.json").string()), IoError);
    fs::remove_all(dir);
}

// activation_function: the tanh GELU under its three names, the exact one as "gelu" (written
// back as read), anything else refused naming the supported ones.
TEST(ModelConfig, Gpt2GeluVariants) {
    nlohmann::json j = {{"model_type", "gpt2"}, {"vocab_size", 100}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4}};
    EXPECT_EQ(parse_hf_config(j, "c").gelu, Gelu::tanh);   // GPT-2's default
    for (const char * name : {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}) {
        j["activation_function"] = name;
        EXPECT_EQ(parse_hf_config(j, "c").gelu, Gelu::tanh) << name;
    }
    j["activation_function"] = "gelu";
    const ModelConfig c = parse_hf_config(j, "c");
    EXPECT_EQ(c.gelu, Gelu::erf);
    EXPECT_NE(c.describe().find("exact GELU"), std::string::npos) << c.describe();
    EXPECT_EQ(hf_config_json(c)["activation_function"], "gelu");
    EXPECT_EQ(parse_hf_config(hf_config_json(c), "back").gelu, Gelu::erf);
    EXPECT_EQ(hf_config_json(model_preset("micro"))["activation_function"], "gelu_new");
    for (const nlohmann::json & bad : {nlohmann::json("relu"), nlohmann::json(3)}) {
        j["activation_function"] = bad;
        try {
            parse_hf_config(j, "c.json");
            ADD_FAILURE() << "accepted " << bad.dump();
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find("supported: gelu_new, gelu_pytorch_tanh, gelu_fast, gelu"),
                      std::string::npos) << e.what();
        }
    }
}

TEST(ParamLayout, HuggingFaceNamesOrderAndShapes) {
    ModelConfig c = model_preset("nano");
    c.vocab_size = 256;
    const ParamLayout l = make_param_layout(c);
    EXPECT_EQ(int64_t(l.total), c.num_params());
    EXPECT_EQ(l.params.front().name, "wte.weight");
    EXPECT_EQ(l.params.back().name, "ln_f.bias");
    const ParamInfo & qkv = l.find("h.1.attn.c_attn.weight");
    EXPECT_EQ(qkv.shape, (std::vector<int64_t>{64, 192}));   // Conv1D: [in, out]
    EXPECT_TRUE(qkv.decay());
    EXPECT_FALSE(l.find("h.1.attn.c_attn.bias").decay());
    // Contiguous, in order, no gaps.
    size_t off = 0;
    for (const auto & p : l.params) {
        EXPECT_EQ(p.offset, off) << p.name;
        off += p.numel;
    }
    EXPECT_EQ(off, l.total);
}
