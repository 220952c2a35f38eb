// Hugging Face GPT-2 and LLaMA folders: export then load is bitwise, 16-bit weights convert, the
// "transformer." prefix and shards are accepted, and a wrong tensor set or a non-finite value is
// refused by name.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_hf_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
}

ModelConfig llama_config(bool tied) {
    ModelConfig c = memfit::test::small_config(50, 16, 2, 4, 12);
    c.family = "llama";
    c.n_kv_head = 2;
    c.ffn = 24;
    c.tied_head = tied;
    return c;
}

struct Model {
    ModelConfig cfg = memfit::test::small_config(50, 16, 2, 2, 12);
    ParamLayout layout = make_param_layout(cfg);
    std::vector<float> params;
    explicit Model(ModelConfig c = memfit::test::small_config(50, 16, 2, 2, 12))
        : cfg(std::move(c)), layout(make_param_layout(cfg)) {
        for (size_t i = 0; i < layout.total; ++i) params.push_back(float(int(i % 97) - 48) / 64.0f);
    }
};

// Writes the model's tensors as `dtype` under `prefix`, dropping `skip` and adding `extra`.
void write_folder(const fs::path & dir, const Model & m, const std::string & dtype, const std::string & prefix = "",
                  const std::string & skip = "", const std::string & extra = "") {
    std::vector<std::vector<uint16_t>> half;
    std::vector<TensorToWrite> t;
    for (const ParamInfo & p : m.layout.params) {
        if (p.name == skip) continue;
        if (dtype == "F32") {
            t.push_back({prefix + p.name, "F32", p.shape, m.params.data() + p.offset, p.numel * 4});
            continue;
        }
        half.emplace_back();
        for (size_t i = 0; i < p.numel; ++i) {
            const float x = m.params[p.offset + i];
            half.back().push_back(dtype == "BF16" ? f32_to_bf16(x) : f32_to_f16(x));
        }
        t.push_back({prefix + p.name, dtype, p.shape, half.back().data(), p.numel * 2});
    }
    static const float one = 1;
    if (!extra.empty()) t.push_back({extra, "F32", {1}, &one, 4});
    write_safetensors((dir / "model.safetensors").string(), t);
}

}  // namespace

TEST(HfWeights, ExportThenLoadIsBitwise) {
    Model m;
    const fs::path dir = fresh_dir("export");
    export_hf(dir.string(), m.cfg, m.layout, m.params.data());
    const ModelConfig back = resolve_model(dir.string());
    EXPECT_EQ(back.n_layer, m.cfg.n_layer);
    EXPECT_EQ(back.n_embd, m.cfg.n_embd);
    EXPECT_EQ(back.vocab_size, m.cfg.vocab_size);
    EXPECT_EQ(back.max_seq, m.cfg.max_seq);
    ASSERT_TRUE(has_hf_weights(dir.string()));
    std::vector<float> got(m.layout.total, -1.0f);
    load_hf_weights(dir.string(), back, m.layout, got.data());
    EXPECT_EQ(got, m.params);
}

TEST(HfWeights, SixteenBitWeightsConvertAndPrefixIsAccepted) {
    Model m;
    for (const char * dt : {"BF16", "F16"}) {
        const fs::path dir = fresh_dir(std::string("half_") + dt);
        write_folder(dir, m, dt, "transformer.", "", "h.0.attn.masked_bias");
        std::vector<float> got(m.layout.total);
        load_hf_weights(dir.string(), m.cfg, m.layout, got.data());
        for (size_t i = 0; i < got.size(); ++i) {
            const float want = std::string(dt) == "BF16" ? bf16_to_f32(f32_to_bf16(m.params[i]))
                                                         : f16_to_f32(f32_to_f16(m.params[i]));
            ASSERT_EQ(got[i], want) << dt << " element " << i;
        }
    }
}

TEST(HfWeights, ShardedIndex) {
    Model m;
    const fs::path dir = fresh_dir("sharded");
    std::vector<TensorToWrite> a, b;
    nlohmann::json map;
    for (size_t k = 0; k < m.layout.params.size(); ++k) {
        const ParamInfo & p = m.layout.params[k];
        (k % 2 ? a : b).push_back({p.name, "F32", p.shape, m.params.data() + p.offset, p.numel * 4});
        map[p.name] = k % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    write_safetensors((dir / "model-00001-of-00002.safetensors").string(), a);
    write_safetensors((dir / "model-00002-of-00002.safetensors").string(), b);
    std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
    std::vector<float> got(m.layout.total);
    load_hf_weights(dir.string(), m.cfg, m.layout, got.data());
    EXPECT_EQ(got, m.params);
}

TEST(HfWeights, WrongTensorSetsAreRefusedByName) {
    Model m;
    auto expect_error = [&](const fs::path & dir, const std::string & needle) {
        std::vector<float> got(m.layout.total);
        try {
            load_hf_weights(dir.string(), m.cfg, m.layout, got.data());
            ADD_FAILURE() << "expected an error naming " << needle;
        } catch (const Error & e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    const fs::path missing = fresh_dir("missing");
    write_folder(missing, m, "F32", "", "h.1.mlp.c_fc.bias");
    expect_error(missing, "missing tensor 'h.1.mlp.c_fc.bias'");
    const fs::path extra = fresh_dir("extra");
    write_folder(extra, m, "F32", "", "", "h.7.mlp.c_fc.bias");
    expect_error(extra, "unexpected tensor 'h.7.mlp.c_fc.bias'");
    const fs::path shape = fresh_dir("shape");
    Model wide;
    wide.cfg.n_embd = 32;   // the folder is a 16-channel model; loading it as 32 channels must fail
    wide.layout = make_param_layout(wide.cfg);
    write_folder(shape, m, "F32");
    std::vector<float> got(wide.layout.total);
    EXPECT_THROW(load_hf_weights(shape.string(), wide.cfg, wide.layout, got.data()), FormatError);
    expect_error(fresh_dir("empty"), "no model.safetensors");
}

TEST(HfWeights, LlamaFoldersRoundTripAndRefuseWrongTensors) {
    for (bool tied : {false, true}) {
        SCOPED_TRACE(tied ? "tied" : "untied");
        Model m(llama_config(tied));
        const fs::path dir = fresh_dir(tied ? "llama_tied" : "llama");
        export_hf(dir.string(), m.cfg, m.layout, m.params.data());
        const ModelConfig back = resolve_model(dir.string());
        EXPECT_TRUE(back.llama());
        EXPECT_EQ(back.kv_heads(), 2);
        EXPECT_EQ(back.ffn_dim(), 24);
        EXPECT_EQ(back.tied_head, tied);
        std::vector<float> got(m.layout.total, -1.0f);
        load_hf_weights(dir.string(), back, m.layout, got.data());
        EXPECT_EQ(got, m.params);
    }
    Model m(llama_config(false));
    const fs::path dir = fresh_dir("llama_bad");
    std::ofstream(dir / "config.json") << hf_config_json(m.cfg).dump();
    std::vector<float> got(m.layout.total);
    // BF16 weights, and old checkpoints' rotary buffers, are fine.
    write_folder(dir, m, "BF16", "", "", "model.layers.0.self_attn.rotary_emb.inv_freq");
    EXPECT_NO_THROW(load_hf_weights(dir.string(), m.cfg, m.layout, got.data()));
    EXPECT_EQ(got[0], bf16_to_f32(f32_to_bf16(m.params[0])));
    auto refused = [&](const std::string & skip, const std::string & extra, const std::string & words) {
        write_folder(dir, m, "F32", "", skip, extra);
        try {
            load_hf_weights(dir.string(), m.cfg, m.layout, got.data());
            ADD_FAILURE() << "accepted";
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    };
    refused("model.layers.1.self_attn.k_proj.weight", "", "missing tensor 'model.layers.1.self_attn.k_proj.weight'");
    refused("", "model.layers.2.mlp.up_proj.weight", "unexpected tensor 'model.layers.2.mlp.up_proj.weight'");
    // A GPT-2 folder's tensors under a LLaMA config.
    Model g;
    write_folder(dir, g, "F32");
    EXPECT_THROW(load_hf_weights(dir.string(), m.cfg, m.layout, got.data()), FormatError);
}

// Phi-3 folders hold qkv_proj and gate_up_proj, each the adjacent rows memfit keeps apart: export
// writes them fused, loading splits them back bitwise; the unfused names are refused.
TEST(HfWeights, Phi3FoldersFuseQkvAndGateUp) {
    ModelConfig cfg = llama_config(false);
    cfg.model_type = "phi3";
    Model m(cfg);
    const fs::path dir = fresh_dir("phi3");
    export_hf(dir.string(), m.cfg, m.layout, m.params.data());
    const SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    const std::vector<std::string> names = f.names();
    auto has = [&](const std::string & n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    EXPECT_TRUE(has("model.layers.1.self_attn.qkv_proj.weight"));
    EXPECT_TRUE(has("model.layers.0.mlp.gate_up_proj.weight"));
    EXPECT_FALSE(has("model.layers.0.self_attn.q_proj.weight"));
    EXPECT_EQ(f.info("model.layers.1.self_attn.qkv_proj.weight").shape, (std::vector<int64_t>{16 + 2 * 8, 16}));
    EXPECT_EQ(f.info("model.layers.0.mlp.gate_up_proj.weight").shape, (std::vector<int64_t>{48, 16}));
    const ModelConfig back = resolve_model(dir.string());
    EXPECT_EQ(back.model_type, "phi3");
    std::vector<float> got(m.layout.total, -1.0f);
    load_hf_weights(dir.string(), back, m.layout, got.data());
    EXPECT_EQ(got, m.params);
    // The split names a llama folder has are not a phi3 checkpoint.
    write_folder(dir, m, "F32");
    try {
        load_hf_weights(dir.string(), back, m.layout, got.data());
        ADD_FAILURE() << "accepted";
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find("a phi3 checkpoint holds it fused, in 'model.layers.0.self_attn.qkv_proj.weight'"),
                  std::string::npos) << e.what();
    }
}

// OLMo 2 folders: the norms after attention and the MLP under their own names, q_norm and
// k_norm over all heads; export then load is bitwise, and a llama folder's input_layernorm is
// not an olmo2 checkpoint.
TEST(HfWeights, Olmo2FoldersRoundTrip) {
    ModelConfig cfg = llama_config(false);
    cfg.model_type = "olmo2";
    cfg.n_kv_head = 0;   // as many KV heads as heads
    cfg.qk_norm = cfg.qk_norm_whole = cfg.post_norm = true;
    cfg.validate();
    Model m(cfg);
    const fs::path dir = fresh_dir("olmo2");
    export_hf(dir.string(), m.cfg, m.layout, m.params.data());
    const SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    EXPECT_EQ(f.info("model.layers.1.self_attn.q_norm.weight").shape, (std::vector<int64_t>{16}));
    EXPECT_EQ(f.info("model.layers.0.post_feedforward_layernorm.weight").shape, (std::vector<int64_t>{16}));
    const ModelConfig back = resolve_model(dir.string());
    EXPECT_EQ(back.model_type, "olmo2");
    EXPECT_TRUE(back.post_norm && back.qk_norm_whole);
    std::vector<float> got(m.layout.total, -1.0f);
    load_hf_weights(dir.string(), back, m.layout, got.data());
    EXPECT_EQ(got, m.params);
    Model llama(llama_config(false));
    write_folder(dir, llama, "F32");
    EXPECT_THROW(load_hf_weights(dir.string(), back, m.layout, got.data()), FormatError);
}

// Gemma 3 folders: four norms a block, written as checkpoints hold them (w of the (1 + w)
// multiplier memfit's layout keeps); export then load gives the multipliers back bitwise.
TEST(HfWeights, Gemma3FoldersStoreNormOffsets) {
    const nlohmann::json j = {{"model_type", "gemma3_text"}, {"vocab_size", 50}, {"hidden_size", 16},
                              {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                              {"num_key_value_heads", 1}, {"head_dim", 8}, {"max_position_embeddings", 32}};
    Model m(parse_hf_config(j, "gemma3"));
    const fs::path dir = fresh_dir("gemma3");
    export_hf(dir.string(), m.cfg, m.layout, m.params.data());
    const SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    for (const char * name : {"model.layers.1.pre_feedforward_layernorm.weight", "model.layers.0.self_attn.k_norm.weight",
                              "model.norm.weight", "model.layers.1.mlp.up_proj.weight"}) {
        const ParamInfo & p = m.layout.find(name);
        const std::vector<float> stored = f.read_f32(name);
        const float shift = std::string(name).ends_with("norm.weight") ? 1.0f : 0.0f;
        ASSERT_EQ(stored.size(), p.numel) << name;
        for (size_t i = 0; i < p.numel; ++i) EXPECT_EQ(stored[i], m.params[p.offset + i] - shift) << name << " " << i;
    }
    const ModelConfig back = resolve_model(dir.string());
    EXPECT_EQ(back.model_type, "gemma3_text");
    EXPECT_TRUE(back.sandwich_norm && back.norm_plus_one && back.tied_head);
    std::vector<float> got(m.layout.total, -1.0f);
    load_hf_weights(dir.string(), back, m.layout, got.data());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], m.params[i]) << i;
}

// Gemma 3 4B-27B ship as Gemma3ForConditionalGeneration (model_type gemma3): the text model is
// read from text_config and from the weights under either naming transformers has written
// ("language_model.model.", and "model.language_model." since 4.52), the vision tower skipped.
TEST(HfWeights, Gemma3MultimodalFoldersReadTheirTextModel) {
    const nlohmann::json text = {{"model_type", "gemma3_text"}, {"vocab_size", 50}, {"hidden_size", 16},
                                 {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                 {"num_key_value_heads", 1}, {"head_dim", 8}, {"max_position_embeddings", 32}};
    Model m(parse_hf_config(text, "gemma3"));
    std::vector<float> want(m.layout.total);
    {
        const fs::path dir = fresh_dir("gemma3_text_only");
        write_folder(dir, m, "F32");
        std::ofstream(dir / "config.json") << text.dump();
        load_hf_weights(dir.string(), resolve_model(dir.string()), m.layout, want.data());
    }
    static const float vision[4] = {1, 2, 3, 4};
    for (const bool newer : {false, true}) {
        SCOPED_TRACE(newer ? "model.language_model." : "language_model.model.");
        const fs::path dir = fresh_dir(newer ? "gemma3_mm_new" : "gemma3_mm_old");
        std::vector<std::string> names;
        std::vector<TensorToWrite> t;
        for (const ParamInfo & p : m.layout.params) {
            const std::string rest = p.name.substr(std::string("model.").size());
            names.push_back(newer ? "model.language_model." + rest : "language_model.model." + rest);
            t.push_back({names.back(), "F32", p.shape, m.params.data() + p.offset, p.numel * 4});
        }
        t.push_back({newer ? "model.vision_tower.vision_model.embeddings.patch_embedding.weight"
                           : "vision_tower.vision_model.embeddings.patch_embedding.weight",
                     "F32", {2, 2}, vision, 16});
        t.push_back({newer ? "model.multi_modal_projector.mm_input_projection_weight"
                           : "multi_modal_projector.mm_input_projection_weight", "F32", {4}, vision, 16});
        write_safetensors((dir / "model.safetensors").string(), t);
        std::ofstream(dir / "config.json")
            << nlohmann::json{{"model_type", "gemma3"}, {"text_config", text}, {"vision_config", {{"hidden_size", 8}}}}.dump();
        const ModelConfig back = resolve_model(dir.string());
        EXPECT_EQ(back.model_type, "gemma3_text");
        EXPECT_EQ(back.num_params(), m.cfg.num_params());
        std::vector<float> got(m.layout.total, -1.0f);
        load_hf_weights(dir.string(), back, m.layout, got.data());
        EXPECT_EQ(got, want);
    }
    EXPECT_THROW(parse_hf_config({{"model_type", "gemma3"}}, "no-text"), ConfigError);
}

// GPT-NeoX folders: its own tensor names, q|k|v fused into query_key_value with each head's q, k
// and v rows together (memfit keeps all of q, then k, then v); export then load is bitwise.
TEST(HfWeights, GptNeoxFoldersInterleaveHeads) {
    const nlohmann::json j = {{"model_type", "gpt_neox"}, {"vocab_size", 50}, {"hidden_size", 16},
                              {"intermediate_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                              {"max_position_embeddings", 32}};
    Model m(parse_hf_config(j, "neox"));
    const fs::path dir = fresh_dir("neox");
    export_hf(dir.string(), m.cfg, m.layout, m.params.data());
    const SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    for (const char * name : {"gpt_neox.embed_in.weight", "embed_out.weight", "gpt_neox.final_layer_norm.bias",
                              "gpt_neox.layers.1.attention.dense.bias", "gpt_neox.layers.0.mlp.dense_h_to_4h.weight",
                              "gpt_neox.layers.0.mlp.dense_4h_to_h.bias"})
        EXPECT_NO_THROW(f.info(name)) << name;
    const std::vector<float> qkv = f.read_f32("gpt_neox.layers.1.attention.query_key_value.weight");
    ASSERT_EQ(qkv.size(), size_t(48 * 16));
    const size_t q = m.layout.find("model.layers.1.self_attn.q_proj.weight").offset;
    // Checkpoint row (head h, part p, i) = memfit row (p, h, i); heads of 8.
    for (int h = 0; h < 2; ++h)
        for (int part = 0; part < 3; ++part)
            for (int i = 0; i < 8; ++i)
                for (int c = 0; c < 16; ++c)
                    EXPECT_EQ(qkv[size_t(((h * 3 + part) * 8 + i) * 16 + c)],
                              m.params[q + size_t(((part * 2 + h) * 8 + i) * 16 + c)]);
    const ModelConfig back = resolve_model(dir.string());
    EXPECT_EQ(back.model_type, "gpt_neox");
    std::vector<float> got(m.layout.total, -1.0f);
    load_hf_weights(dir.string(), back, m.layout, got.data());
    EXPECT_EQ(got, m.params);
}

// A NaN or inf in a folder's weights is refused where it is read, naming the tensor (it used
// to train into a "loss became nan" at step 1, or print garbage in `generate`).
TEST(HfWeights, NonFiniteWeightsAreRefusedByName) {
    for (const float bad : {NAN, INFINITY, -INFINITY}) {
        Model m;
        const ParamInfo & p = m.layout.params[3];
        m.params[p.offset + 5] = bad;
        const fs::path dir = fresh_dir("nonfinite");
        write_folder(dir, m, "BF16");
        std::vector<float> got(m.layout.total);
        try {
            load_hf_weights(dir.string(), m.cfg, m.layout, got.data());
            ADD_FAILURE() << "loaded a " << bad;
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find("tensor '" + p.name + "' holds 1 non-finite value (the first, element "
                                                 "5, is " + fmt::format("{}", bad) + ")"),
                      std::string::npos) << e.what();
        }
    }
}
