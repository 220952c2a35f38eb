// Exporting LoRA checkpoints: --merge-lora writes a plain Hugging Face folder whose model computes
// what the LoRA engine computed (both families; dense, int8 and nf4 bases; a base from a folder or
// from the seed), --adapter-only writes PEFT's adapter folder (names, shapes, values, config
// fields), and every misuse is a clear error. Also `memfit generate --weights` from the CLI.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "app/export.h"
#include "app/model_source.h"
#include "cli/cli_util.h"
#include "test_util.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

fs::path fresh(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_lora_export_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    fs::create_directories(p.parent_path());
    return p;
}

ModelConfig tiny(bool llama, int V = 37, int C = 32, int L = 2) { return test::small_family(llama, V, C, L, 4, 64); }

EngineOptions opts(int B, int T, const LoraOptions & lora) {
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.with_eval = false;
    eo.lora = lora;
    return eo;
}

// The meta the trainer writes (app/trainer.cpp checkpoint_meta) for a LoRA run.
nlohmann::json lora_meta(int step, const ModelConfig & cfg, const LoraOptions & lora, uint64_t seed,
                         const std::string & base_model) {
    nlohmann::json model = hf_config_json(cfg);
    model["name"] = cfg.name;
    nlohmann::json m = {{"step", step},   {"model", model}, {"seq", 8}, {"global_batch", 2}, {"seed", seed},
                        {"data", {{"train_epoch", 0}, {"train_cursor", 0}}}};
    m["lora"] = lora_json(lora);
    m["lora"]["base_model"] = base_model;
    return m;
}

// A base model folder: the seed's initialisation of the whole model, trained one step so that it
// is not the initialisation the LoRA engine itself starts from.
fs::path base_folder(const ModelConfig & cfg, const std::string & name) {
    CpuBackend backend;
    Engine e(cfg, backend, opts(2, 8, LoraOptions{}));
    e.init_params(21);
    std::vector<int32_t> in(16), tg(16);
    test::random_batch(in, tg, cfg.vocab_size, 5);
    e.train_step(in.data(), tg.data(), OptimHyper{});
    const fs::path dir = fresh(name);
    export_hf(dir.string(), cfg, e.step().layout(), e.params());
    return dir;
}

struct LoraRun {
    std::unique_ptr<CpuBackend> backend = std::make_unique<CpuBackend>();
    std::unique_ptr<Engine> engine;
    fs::path ckpt;
};

// A LoRA engine on the base (a folder, or the seed's initialisation), its adapters random and
// trained two steps, saved as the trainer saves it.
LoraRun lora_run(const ModelConfig & cfg, const LoraOptions & lora, const std::string & base, const std::string & name) {
    LoraRun r;
    const uint64_t seed = 77;
    r.engine = std::make_unique<Engine>(cfg, *r.backend, opts(2, 8, lora));
    r.engine->init_params(seed);
    if (!base.empty()) {
        std::vector<float> full(size_t(cfg.num_params()));
        load_hf_weights(base, cfg, make_param_layout(cfg), full.data());
        r.engine->set_base(full.data());
    }
    std::mt19937 rng(3);
    const auto a = test::randn(r.engine->step().layout().total, rng, 0.2f);
    std::copy(a.begin(), a.end(), r.engine->params());
    r.engine->params_changed();
    std::vector<int32_t> in(16), tg(16);
    for (int s = 0; s < 2; ++s) {
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(s + 1));
        r.engine->train_step(in.data(), tg.data(), OptimHyper{});
    }
    r.ckpt = fresh(name);
    save_checkpoint(r.ckpt.string(), Checkpoint{r.engine->export_state(), lora_meta(2, cfg, lora, seed, base)}, 1);
    return r;
}

double max_rel(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(b[i])));
    }
    return num / den;
}

}  // namespace

TEST(LoraExport, MergedFolderComputesWhatTheAdaptersDid) {
    struct Case { bool llama; BaseWeights bw; bool folder; };
    for (const Case & c : {Case{true, BaseWeights::compute, true}, Case{false, BaseWeights::compute, true},
                           Case{true, BaseWeights::nf4, true}, Case{false, BaseWeights::nf4, false},
                           Case{true, BaseWeights::int8, false}, Case{false, BaseWeights::compute, false}}) {
        const std::string tag = std::string(c.llama ? "llama_" : "gpt2_") + base_weights_name(c.bw) +
                                (c.folder ? "_folder" : "_seed");
        SCOPED_TRACE(tag);
        const ModelConfig cfg = tiny(c.llama);
        const std::string base = c.folder ? fs::absolute(base_folder(cfg, tag + "_base")).string() : "";
        LoraRun run = lora_run(cfg, test::lora_options(cfg, 4, c.bw), base, tag + "_ckpt");
        const fs::path out = fresh(tag + "_merged");
        const std::string said = export_checkpoint(run.ckpt.string(), out.string(), ExportMode::merge_lora);
        EXPECT_NE(said.find("merged into the base from " + (c.folder ? base : std::string("the seed-77"))),
                  std::string::npos) << said;

        // A plain folder a full (non-LoRA) engine loads, computing the LoRA engine's logits.
        const ModelConfig back = resolve_model(out.string());
        ASSERT_EQ(back.num_params(), cfg.num_params());
        CpuBackend backend;
        Engine full(back, backend, opts(2, 8, LoraOptions{}));
        load_hf_weights(out.string(), back, full.step().layout(), full.params());
        full.params_changed();
        std::vector<int32_t> in(16), tg(16);
        test::random_batch(in, tg, cfg.vocab_size, 9);
        const auto a = full.logits(in.data(), 2), b = run.engine->logits(in.data(), 2);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_LT(max_rel(a, b), 1e-5);
        // The export is the engine's own merge, bit for bit.
        EXPECT_EQ(std::vector<float>(full.params(), full.params() + full.step().layout().total),
                  run.engine->merged_weights());
    }
}

TEST(LoraExport, AdapterFolderIsPeftsLayout) {
    for (bool llama : {true, false}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = tiny(llama);
        const std::string tag = llama ? "peft_llama" : "peft_gpt2";
        const std::string base = fs::absolute(base_folder(cfg, tag + "_base")).string();
        LoraOptions lora = test::lora_options(cfg, 4, BaseWeights::compute, llama ? "q,v,down" : "c_attn,mlp.c_proj");
        if (llama) lora.dropout = 0.1f;
        LoraRun run = lora_run(cfg, lora, base, tag + "_ckpt");
        const fs::path out = fresh(tag + "_adapter");
        export_checkpoint(run.ckpt.string(), out.string(), ExportMode::adapter_only);
        ASSERT_FALSE(fs::exists(out / "model.safetensors"));

        std::ifstream f(out / "adapter_config.json");
        const nlohmann::json j = nlohmann::json::parse(f);
        EXPECT_EQ(j["peft_type"], "LORA");
        EXPECT_EQ(j["task_type"], "CAUSAL_LM");
        EXPECT_EQ(j["r"], 4);
        EXPECT_TRUE(j["lora_alpha"].is_number_integer());
        EXPECT_EQ(j["lora_alpha"], 8);
        EXPECT_EQ(j["lora_dropout"], llama ? 0.1 : 0.0);
        EXPECT_EQ(j["bias"], "none");
        EXPECT_EQ(j["fan_in_fan_out"], !llama);
        EXPECT_EQ(j["base_model_name_or_path"], base);
        EXPECT_EQ(j["inference_mode"], true);
        EXPECT_TRUE(j["modules_to_save"].is_null());
        EXPECT_EQ(j["target_modules"], llama ? nlohmann::json({"q_proj", "v_proj", "down_proj"})
                                             : nlohmann::json({"attn.c_attn", "mlp.c_proj"}));

        const SafetensorsFile st = SafetensorsFile::open((out / "adapter_model.safetensors").string());
        const ParamLayout al = make_lora_layout(cfg, lora);
        ASSERT_EQ(st.names().size(), al.params.size());
        const std::vector<float> & w = run.engine->export_state().params;
        for (const auto & p : al.params) {
            SCOPED_TRACE(p.name);
            ASSERT_TRUE(st.has(p.name));
            EXPECT_EQ(st.info(p.name).dtype, "F32");
            EXPECT_EQ(st.info(p.name).shape, p.shape);
            EXPECT_EQ(st.read_f32(p.name), std::vector<float>(w.begin() + long(p.offset), w.begin() + long(p.offset + p.numel)));
        }
        // PEFT's keys: "base_model.model.<module>.lora_A.weight" [r, in], lora_B [out, r].
        const std::string first = llama ? "base_model.model.model.layers.0.self_attn.q_proj"
                                        : "base_model.model.transformer.h.0.attn.c_attn";
        EXPECT_EQ(st.info(first + ".lora_A.weight").shape, (std::vector<int64_t>{4, 32}));
        EXPECT_EQ(st.info(first + ".lora_B.weight").shape, (std::vector<int64_t>{llama ? 32 : 96, 4}));
        EXPECT_EQ(st.metadata().at("format"), "pt");
    }
}

// DoRA (model/lora.h): the merged folder computes what the DoRA engine computed (GPT-2's Conv1D
// columns and biases, LLaMA's rows), the adapter folder says use_dora with one
// lora_magnitude_vector [out] per module, and reading it back onto its base (generate's path)
// folds in exactly the engine's merge.
TEST(LoraExport, DoraMergesAndRoundTripsThroughPeftsFolder) {
    for (bool llama : {true, false}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = tiny(llama);
        const std::string tag = llama ? "dora_llama" : "dora_gpt2";
        const std::string base = fs::absolute(base_folder(cfg, tag + "_base")).string();
        LoraOptions lora = test::lora_options(cfg, 4, BaseWeights::compute, "all");
        lora.dora = true;
        LoraRun run = lora_run(cfg, lora, base, tag + "_ckpt");
        const std::vector<float> merged = run.engine->merged_weights();

        const fs::path folder = fresh(tag + "_merged");
        export_checkpoint(run.ckpt.string(), folder.string(), ExportMode::merge_lora);
        CpuBackend backend;
        Engine full(cfg, backend, opts(2, 8, LoraOptions{}));
        load_hf_weights(folder.string(), cfg, full.step().layout(), full.params());
        full.params_changed();
        EXPECT_EQ(std::vector<float>(full.params(), full.params() + full.step().layout().total), merged);
        std::vector<int32_t> in(16), tg(16);
        test::random_batch(in, tg, cfg.vocab_size, 9);
        EXPECT_LT(max_rel(full.logits(in.data(), 2), run.engine->logits(in.data(), 2)), 1e-5);

        const fs::path out = fresh(tag + "_adapter");
        export_checkpoint(run.ckpt.string(), out.string(), ExportMode::adapter_only);
        std::ifstream f(out / "adapter_config.json");
        const nlohmann::json j = nlohmann::json::parse(f);
        EXPECT_EQ(j["use_dora"], true);
        const SafetensorsFile st = SafetensorsFile::open((out / "adapter_model.safetensors").string());
        const std::string m = llama ? "base_model.model.model.layers.1.mlp.up_proj.lora_magnitude_vector"
                                    : "base_model.model.transformer.h.1.mlp.c_fc.lora_magnitude_vector";
        ASSERT_TRUE(st.has(m));
        EXPECT_EQ(st.info(m).shape, (std::vector<int64_t>{llama ? 64 : 128}));
        EXPECT_EQ(st.names().size(), 3 * lora_sites(cfg, lora).size());
        const LoadedModel back = read_model_weights(base, out.string());
        EXPECT_EQ(back.params, merged);
    }
}

// Fused modules (Phi-3's qkv_proj and gate_up_proj, GPT-NeoX's query_key_value): DoRA on every
// module merges into the checkpoint's fused tensors (Phi-3's merge once failed an assertion: it
// looked the parts' names up), and GPT-NeoX's PEFT folder holds query_key_value's B and magnitude
// rows interleaved head by head as its weight's, read back to the same merged model.
TEST(LoraExport, FusedModulesMergeAndRoundTripThroughPeftsFolder) {
    const nlohmann::json phi3 = {{"model_type", "phi3"}, {"vocab_size", 37}, {"hidden_size", 32},
                                 {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2}, {"max_position_embeddings", 64}};
    const nlohmann::json neox = {{"model_type", "gpt_neox"}, {"vocab_size", 37}, {"hidden_size", 32},
                                 {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                 {"max_position_embeddings", 64}};
    for (const nlohmann::json & j : {phi3, neox}) {
        const ModelConfig cfg = parse_hf_config(j, j["model_type"].get<std::string>());
        SCOPED_TRACE(cfg.model_type);
        const std::string tag = "fused_" + cfg.model_type;
        const std::string base = fs::absolute(base_folder(cfg, tag + "_base")).string();
        LoraOptions lora = test::lora_options(cfg, 4, BaseWeights::compute, "all");
        lora.dora = true;
        LoraRun run = lora_run(cfg, lora, base, tag + "_ckpt");
        const std::vector<float> merged = run.engine->merged_weights();
        const fs::path folder = fresh(tag + "_merged");
        export_checkpoint(run.ckpt.string(), folder.string(), ExportMode::merge_lora);
        CpuBackend backend;
        Engine full(cfg, backend, opts(2, 8, LoraOptions{}));
        load_hf_weights(folder.string(), cfg, full.step().layout(), full.params());
        full.params_changed();
        std::vector<int32_t> in(16), tg(16);
        test::random_batch(in, tg, cfg.vocab_size, 9);
        EXPECT_LT(max_rel(full.logits(in.data(), 2), run.engine->logits(in.data(), 2)), 1e-5);

        const fs::path out = fresh(tag + "_adapter");
        export_checkpoint(run.ckpt.string(), out.string(), ExportMode::adapter_only);
        const LoadedModel back = read_model_weights(base, out.string());
        EXPECT_EQ(back.params, merged);
        if (cfg.model_type != "gpt_neox") continue;
        const SafetensorsFile st = SafetensorsFile::open((out / "adapter_model.safetensors").string());
        const std::string b = "base_model.model.gpt_neox.layers.1.attention.query_key_value.lora_B.weight";
        ASSERT_TRUE(st.has(b));
        const std::vector<float> file = st.read_f32(b);
        const ParamLayout al = make_lora_layout(cfg, lora);
        const float * ours = run.engine->params() + al.find(b).offset;
        // File row (head h, part p, i) = memfit row (p, h, i): 4 heads of 8, rank 4.
        for (int h = 0; h < 4; ++h)
            for (int part = 0; part < 3; ++part)
                for (int i = 0; i < 8; ++i)
                    for (int k = 0; k < 4; ++k)
                        EXPECT_EQ(file[size_t(((h * 3 + part) * 8 + i) * 4 + k)], ours[((part * 4 + h) * 8 + i) * 4 + k]);
    }
}

// rsLoRA (--use-rslora, PEFT's use_rslora): the adapters scaled by alpha / sqrt(r) in training, in
// the merge and in the PEFT folder's config, read back with the same scale.
TEST(LoraExport, RsLoraScaleRoundTripsThroughPeftsFolder) {
    const ModelConfig cfg = tiny(true);
    const std::string base = fs::absolute(base_folder(cfg, "rslora_base")).string();
    LoraOptions lora = test::lora_options(cfg, 4, BaseWeights::compute, "q,v,down");
    lora.rslora = true;
    EXPECT_FLOAT_EQ(lora.scaling(), 8.0f / 2.0f);   // alpha 8 / sqrt(4)
    LoraRun run = lora_run(cfg, lora, base, "rslora_ckpt");
    const std::vector<float> merged = run.engine->merged_weights();
    CpuBackend backend;
    Engine full(cfg, backend, opts(2, 8, LoraOptions{}));
    std::copy(merged.begin(), merged.end(), full.params());
    full.params_changed();
    std::vector<int32_t> in(16), tg(16);
    test::random_batch(in, tg, cfg.vocab_size, 9);
    EXPECT_LT(max_rel(full.logits(in.data(), 2), run.engine->logits(in.data(), 2)), 1e-5);
    // Plain LoRA's scale on the same adapters merges to other weights.
    LoraOptions plain = lora;
    plain.rslora = false;
    std::vector<float> other = run.engine->base_weights();
    merge_lora(cfg, plain, other.data(), run.engine->full_params().data());
    EXPECT_GT(max_rel(other, merged), 1e-4);

    const fs::path out = fresh("rslora_adapter");
    export_checkpoint(run.ckpt.string(), out.string(), ExportMode::adapter_only);
    std::ifstream f(out / "adapter_config.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j["use_rslora"], true);
    EXPECT_FALSE(j.contains("use_dora"));
    EXPECT_TRUE(peft_lora_options(cfg, j, "adapter_config.json").rslora);
    EXPECT_EQ(read_model_weights(base, out.string()).params, merged);
}

TEST(LoraExport, MisuseIsAClearError) {
    const ModelConfig cfg = tiny(true);
    const fs::path base = fs::absolute(base_folder(cfg, "err_base"));
    LoraRun run = lora_run(cfg, test::lora_options(cfg, 2, BaseWeights::compute), base.string(), "err_ckpt");
    const std::string ck = run.ckpt.string(), out = fresh("err_out").string();
    auto message = [](auto && f) {
        try {
            f();
        } catch (const Error & e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    // No flag on a LoRA checkpoint: pick one.
    EXPECT_THROW(export_checkpoint(ck, out, ExportMode::plain), ConfigError);
    const std::string plain = message([&] { export_checkpoint(ck, out, ExportMode::plain); });
    EXPECT_NE(plain.find("--merge-lora"), std::string::npos) << plain;
    EXPECT_NE(plain.find("--adapter-only"), std::string::npos) << plain;
    // A flag on a full checkpoint.
    const fs::path full_ckpt = fresh("err_full");
    {
        CpuBackend backend;
        Engine e(cfg, backend, opts(1, 4, LoraOptions{}));
        e.init_params(1);
        nlohmann::json meta = lora_meta(1, cfg, LoraOptions{}, 1, "");
        meta.erase("lora");
        save_checkpoint(full_ckpt.string(), Checkpoint{e.export_state(), meta}, 1);
    }
    EXPECT_THROW(export_checkpoint(full_ckpt.string(), out, ExportMode::merge_lora), ConfigError);
    EXPECT_THROW(export_checkpoint(full_ckpt.string(), out, ExportMode::adapter_only), ConfigError);
    EXPECT_THROW(export_checkpoint(full_ckpt.string(), out, ExportMode::plain, base.string()), ConfigError);
    EXPECT_NO_THROW(export_checkpoint(full_ckpt.string(), out, ExportMode::plain));
    // The base folder moved: an error naming it; --base-model finds it again.
    const fs::path moved = fresh("err_base_moved");
    fs::rename(base, moved);
    const std::string gone = message([&] { export_checkpoint(ck, out, ExportMode::merge_lora); });
    EXPECT_NE(gone.find(base.string()), std::string::npos) << gone;
    EXPECT_NE(gone.find("--base-model"), std::string::npos) << gone;
    EXPECT_THROW(export_checkpoint(ck, out, ExportMode::merge_lora), IoError);
    EXPECT_NO_THROW(export_checkpoint(ck, out, ExportMode::merge_lora, moved.string()));
    // A state that is not this record's adapters.
    {
        Checkpoint c = load_checkpoint(ck);
        c.meta["lora"]["r"] = 3;
        const fs::path bad = fresh("err_rank");
        save_checkpoint(bad.string(), c, 1);
        EXPECT_THROW(export_checkpoint(bad.string(), out, ExportMode::adapter_only), FormatError);
        c.meta["lora"]["r"] = 2;
        c.meta["lora"].erase("base_model");
        save_checkpoint(bad.string(), c, 1);
        EXPECT_THROW(export_checkpoint(bad.string(), out, ExportMode::merge_lora), FormatError);
        c.meta["lora"]["base_model"] = "";
        save_checkpoint(bad.string(), c, 1);
        // --base-model on a run whose base was the seed's initialisation.
        EXPECT_THROW(export_checkpoint(bad.string(), out, ExportMode::merge_lora, moved.string()), ConfigError);
    }
}

// ----- the CLI -----

namespace {

using cli_test::CmdResult;
using cli_test::expect_clean_failure;
using cli_test::run_memfit;

}  // namespace

TEST(LoraExport, CommandLine) {
    const ModelConfig cfg = tiny(false);
    LoraRun run = lora_run(cfg, test::lora_options(cfg, 2, BaseWeights::int8), "", "cli_ckpt");
    const std::string ck = run.ckpt.string(), merged = fresh("cli_merged").string(), ad = fresh("cli_ad").string();
    expect_clean_failure(run_memfit("export " + ck + " --out " + merged), "--merge-lora");
    expect_clean_failure(run_memfit("export " + ck + " --out " + merged + " --merge-lora --adapter-only"), "pick one");
    const CmdResult m = run_memfit("export " + ck + " --out " + merged + " --merge-lora");
    ASSERT_EQ(m.code, 0) << m.err;
    EXPECT_NE(m.out.find("model.safetensors"), std::string::npos) << m.out;
    EXPECT_TRUE(fs::exists(fs::path(merged) / "config.json"));
    const CmdResult a = run_memfit("export " + ck + " --out " + ad + " --adapter-only");
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_TRUE(fs::exists(fs::path(ad) / "adapter_model.safetensors"));
    EXPECT_TRUE(fs::exists(fs::path(ad) / "adapter_config.json"));
}

TEST(LoraExport, GenerateFromQuantizedWeights) {
    // A byte-level model folder, so that generate picks the bytes tokenizer.
    const ModelConfig cfg = tiny(true, 256, 64, 2);
    CpuBackend backend;
    Engine e(cfg, backend, opts(1, 4, LoraOptions{}));
    e.init_params(2);
    const fs::path dir = fresh("gen_folder");
    export_hf(dir.string(), cfg, e.step().layout(), e.params());
    const std::string gen = "generate --model " + dir.string() + " --prompt ab --max-new-tokens 5 --seed 1 ";
    for (const char * w : {"int8", "nf4", "bf16", "fp32"}) {
        SCOPED_TRACE(w);
        const CmdResult r = run_memfit(gen + "--weights " + w);
        ASSERT_EQ(r.code, 0) << r.err;
        EXPECT_EQ(r.out.size(), 2u + 5u + 1u) << r.out;
        EXPECT_NE(r.err.find("of bf16"), std::string::npos) << r.err;
        if (std::string(w) == "int8" || std::string(w) == "nf4") {
            EXPECT_NE(r.err.find("projections"), std::string::npos) << r.err;
        }
    }
    expect_clean_failure(run_memfit(gen + "--weights int4"), "--weights int4");
    // nf4 needs blocks of 64 elements: a clear error naming the flag.
    ModelConfig odd = test::small_config(256, 20, 1, 2, 64);   // q|k|v: 60 x 20 = 1200 elements
    odd.family = "llama";
    odd.ffn = 64;
    odd.tied_head = false;
    odd.validate();
    Engine o(odd, backend, opts(1, 4, LoraOptions{}));
    o.init_params(2);
    const fs::path odd_dir = fresh("gen_odd");
    export_hf(odd_dir.string(), odd, o.step().layout(), o.params());
    expect_clean_failure(run_memfit("generate --model " + odd_dir.string() + " --prompt ab --max-new-tokens 2 "
                                    "--weights nf4"),
                         "--weights nf4");
}
