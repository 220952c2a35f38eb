// How `memfit export` writes a model folder: --dtype (bf16 half of fp32's bytes, the same logits
// within bf16 rounding; fp16 refuses weights beyond its range), --max-shard-size (shards and an
// index that load as the single file does, and that replace each other), and the token ids that
// make transformers' generate stop (config.json, generation_config.json).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "app/export.h"
#include "backend/cpu/cpu_backend.h"
#include "cli/cli_util.h"
#include "core/error.h"
#include "core/json_read.h"
#include "infer/decoder.h"
#include "model/hf_weights.h"
#include "test_util.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

fs::path fresh(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_export_format_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    fs::create_directories(p.parent_path());
    return p;
}

std::vector<float> folder_weights(const std::string & dir, ModelConfig & cfg) {
    cfg = resolve_model(dir + "/");
    std::vector<float> w(size_t(cfg.num_params()));
    load_hf_weights(dir, cfg, make_param_layout(cfg), w.data());
    return w;
}

// The last position's logits of a prompt, in fp32, from a folder's weights.
std::vector<float> logits(const std::string & dir, const std::vector<int32_t> & prompt) {
    ModelConfig cfg;
    const std::vector<float> w = folder_weights(dir, cfg);
    CpuBackend backend;
    Decoder d(cfg, backend, int(prompt.size()));
    d.set_weights(w.data());
    const float * l = d.prefill(prompt);
    return std::vector<float>(l, l + cfg.vocab_size);
}

}  // namespace

TEST(ExportFormat, Bf16IsHalfTheBytesOfFp32AndGivesTheSameLogits) {
    const fs::path run = fresh("bf16run");
    auto r = cli_test::run_memfit("train --quiet --model llama-nano --steps 6 --seq 32 --batch 2 --precision bf16 "
                                  "--eval-every 0 --sample 0 --checkpoint-every 6 --out " + run.string());
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string ck = (run / "checkpoints").string(), b16 = fresh("b16").string(), f32 = fresh("f32").string();
    r = cli_test::run_memfit("export " + ck + " --out " + b16);   // default: the run's precision
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("(bf16,"), std::string::npos) << r.out;
    r = cli_test::run_memfit("export " + ck + " --out " + f32 + " --dtype fp32");
    ASSERT_EQ(r.code, 0) << r.err;
    const double ratio = double(fs::file_size(b16 + "/model.safetensors")) / double(fs::file_size(f32 + "/model.safetensors"));
    EXPECT_GT(ratio, 0.49);
    EXPECT_LT(ratio, 0.51);
    EXPECT_EQ(read_json_file(b16 + "/config.json")["torch_dtype"], "bfloat16");
    EXPECT_EQ(read_json_file(f32 + "/config.json")["torch_dtype"], "float32");

    const std::vector<int32_t> prompt = {70, 105, 114, 115, 116, 32, 67, 105, 116};
    const std::vector<float> a = logits(b16, prompt), b = logits(f32, prompt);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        norm += double(b[i]) * b[i];
    }
    const double rel = std::sqrt(diff / norm);
    EXPECT_GT(rel, 0.0) << "bf16 rounding changed nothing: were the weights rounded?";
    EXPECT_LT(rel, 1e-2) << "bf16 tolerance";
    ModelConfig c16, c32;
    const std::vector<float> w16 = folder_weights(b16, c16), w32 = folder_weights(f32, c32);
    for (size_t i = 0; i < w32.size(); ++i)
        ASSERT_EQ(w16[i], bf16_to_f32(f32_to_bf16(w32[i]))) << "weight " << i << " is not fp32's rounded to bf16";
}

TEST(ExportFormat, ShardsLoadAsTheSingleFileAndReplaceIt) {
    const ModelConfig cfg = test::small_family(true, 40, 32, 2, 4, 64);
    const ParamLayout layout = make_param_layout(cfg);
    std::mt19937 rng(3);
    const std::vector<float> w = test::randn(layout.total, rng, 0.5f);
    const std::string dir = fresh("sharded").string();
    HfWriteOptions o;
    o.max_shard_bytes = 8 * 1024;   // several shards; the 40 x 32 embedding alone is 5 KiB
    const HfWritten sh = export_hf(dir, cfg, layout, w.data(), o);
    ASSERT_GT(sh.files.size(), 3u);
    EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
    const nlohmann::json index = read_json_file(dir + "/model.safetensors.index.json");
    EXPECT_EQ(index["metadata"]["total_size"], layout.total * 4);
    EXPECT_EQ(index["weight_map"].size(), layout.params.size());
    for (size_t k = 0; k + 1 < sh.files.size(); ++k) EXPECT_LE(fs::file_size(dir + "/" + sh.files[k]), 8 * 1024 + 4096u);
    std::vector<float> back(layout.total);
    load_hf_weights(dir, cfg, layout, back.data());
    EXPECT_EQ(back, w);

    // One file into the same folder: the shards and the index go, so nothing stale is read.
    const HfWritten one = export_hf(dir, cfg, layout, w.data());
    ASSERT_EQ(one.files, std::vector<std::string>{"model.safetensors"});
    size_t left = 0;
    for (const auto & e : fs::directory_iterator(dir)) left += e.path().filename().string().starts_with("model-");
    EXPECT_EQ(left, 0u);
    EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
    std::fill(back.begin(), back.end(), 0.0f);
    load_hf_weights(dir, cfg, layout, back.data());
    EXPECT_EQ(back, w);
}

TEST(ExportFormat, Fp16RefusesWeightsBeyondItsRangeByName) {
    const ModelConfig cfg = test::small_family(false, 40, 32, 1, 4, 64);
    const ParamLayout layout = make_param_layout(cfg);
    std::vector<float> w(layout.total, 0.25f);
    HfWriteOptions o;
    o.dtype = "F16";
    EXPECT_NO_THROW(export_hf(fresh("f16ok").string(), cfg, layout, w.data(), o));
    w[layout.params[1].offset + 3] = 70000.0f;
    try {
        export_hf(fresh("f16bad").string(), cfg, layout, w.data(), o);
        FAIL() << "fp16 took 70000";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find(layout.params[1].name + " element 3 is 70000"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("--dtype bf16"), std::string::npos) << e.what();
    }
    o.dtype = "I8";
    EXPECT_THROW(export_hf(fresh("i8").string(), cfg, layout, w.data(), o), ConfigError);
}

TEST(ExportFormat, TokenIdsMakeGenerateStopAtTheEndOfAReply) {
    EXPECT_TRUE(tokenizer_token_ids("bytes").empty());
    EXPECT_TRUE(tokenizer_token_ids("").empty());
    const nlohmann::json g = tokenizer_token_ids("gpt2");
    EXPECT_EQ(g["eos_token_id"], 50256);
    EXPECT_EQ(g["bos_token_id"], 50256);
    // Qwen3: eos_token and the template's end of turn are both <|im_end|>; pad is <|endoftext|>.
    const nlohmann::json q = tokenizer_token_ids(std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json");
    EXPECT_EQ(q["eos_token_id"], 151645) << q.dump();
    EXPECT_EQ(q["pad_token_id"], 151643) << q.dump();
}

TEST(ExportFormat, AChatTemplatesEndOfTurnJoinsTheEndOfText) {
    // Qwen2.5's base models: eos_token <|endoftext|>, a ChatML template whose turns end in
    // <|im_end|>: generate must stop at either, as the Hub's generation_config.json lists them.
    const fs::path dir = fresh("qwen-base");
    fs::create_directories(dir);
    fs::copy_file(std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json", dir / "tokenizer.json");
    nlohmann::json tc = read_json_file(std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer_config.json");
    tc["eos_token"] = "<|endoftext|>";
    std::ofstream(dir / "tokenizer_config.json") << tc.dump();
    const nlohmann::json q = tokenizer_token_ids((dir / "tokenizer.json").string());
    EXPECT_EQ(q["eos_token_id"], nlohmann::json({151645, 151643})) << q.dump();
}
