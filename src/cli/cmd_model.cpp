// memfit export, generate: model folders in Hugging Face's layout.
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/paths.h"
#include "model/config.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/generate.h"

namespace memfit::cli {

void add_model_commands(CLI::App & app) {
    static std::string ckpt, export_out;
    CLI::App * exp = app.add_subcommand(
        "export", "write a checkpoint's weights as a Hugging Face GPT-2 folder (config.json + model.safetensors)");
    exp->add_option("checkpoint", ckpt, "checkpoint folder, or a folder of them (the newest)")->required();
    exp->add_option("--out", export_out, "output folder")->required();
    exp->callback([] {
        const Checkpoint c = load_checkpoint(ckpt);
        ModelConfig cfg;
        try {
            const auto & m = c.meta.at("model");
            cfg.name = m.at("name").get<std::string>();
            cfg.n_layer = m.at("n_layer").get<int>();
            cfg.n_embd = m.at("n_embd").get<int>();
            cfg.n_head = m.at("n_head").get<int>();
            cfg.vocab_size = m.at("vocab_size").get<int>();
            cfg.max_seq = m.at("max_seq").get<int>();
            cfg.ln_eps = m.value("ln_eps", cfg.ln_eps);
        } catch (const std::exception & e) {
            throw FormatError(fmt::format("{}: the checkpoint's meta.json has no usable model ({})", ckpt, e.what()));
        }
        cfg.validate();
        const ParamLayout layout = gpt2_param_layout(cfg);
        if (layout.total != c.state.params.size())
            throw FormatError(fmt::format("{}: {} parameters, a model of that shape has {}", ckpt,
                                          c.state.params.size(), layout.total));
        export_hf(export_out, cfg, layout, c.state.params.data());
        std::printf("wrote %s/config.json and %s/model.safetensors (step %d)\n", export_out.c_str(),
                    export_out.c_str(), c.meta.at("step").get<int>());
    });

    static std::string gen_model, gen_prompt = "\n", gen_tokenizer;
    static int gen_seq = 0, gen_threads = 0;
    static SampleOptions gen;
    CLI::App * g = app.add_subcommand(
        "generate", "continue a prompt with a model folder from `memfit export` (streams the text)");
    g->add_option("--model", gen_model, "folder with config.json and model.safetensors")->required();
    g->add_option("--prompt", gen_prompt, "text to continue")->capture_default_str();
    g->add_option("--tokenizer", gen_tokenizer, "gpt2 or bytes (default: bytes for vocabularies up to 256, else gpt2)");
    g->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")->capture_default_str()
        ->check(kPositive);
    g->add_option("--temperature", gen.temperature, "softmax temperature (0: greedy)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-k", gen.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-p", gen.top_p, "sample from the smallest set with this much probability")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    g->add_option("--seed", gen.seed, "random seed")->capture_default_str();
    g->add_option("--seq", gen_seq, "context window (default: the model's, at most 256)")->check(kNonNegative);
    g->add_option("--threads", gen_threads, "CPU threads (0: all cores)")->check(kNonNegative);
    g->callback([] {
        if (gen_threads > 0) omp_set_num_threads(gen_threads);
        if (!has_hf_weights(gen_model))
            throw IoError(fmt::format("{}: no model.safetensors; pass a folder written by `memfit export`", gen_model));
        const ModelConfig cfg = resolve_model(gen_model + "/");
        CpuBackend backend;
        EngineOptions eo;
        eo.B = 1;
        eo.T = gen_seq > 0 ? std::min(gen_seq, cfg.max_seq) : std::min(cfg.max_seq, 256);
        eo.with_eval = false;
        eo.flash_attention = true;
        Engine engine(cfg, backend, eo);
        load_hf_weights(gen_model, cfg, engine.step().layout(), engine.params());
        engine.params_changed();
        const std::string kind = !gen_tokenizer.empty() ? gen_tokenizer : cfg.vocab_size <= 256 ? "bytes" : "gpt2";
        const auto tok = make_tokenizer(kind, data_dir());
        std::printf("%s", gen_prompt.c_str());
        std::fflush(stdout);
        generate(engine, tok->encode(gen_prompt), gen, [&](int32_t id) {
            std::printf("%s", tok->decode({id}).c_str());
            std::fflush(stdout);
        });
        std::printf("\n");
    });

}

}  // namespace memfit::cli
