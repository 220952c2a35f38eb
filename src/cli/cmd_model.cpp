// memfit export, generate: model folders in Hugging Face's layout.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/units.h"
#include "model/config.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/decoder.h"
#include "train/generate.h"

namespace memfit::cli {

void add_model_commands(CLI::App & app) {
    static std::string ckpt, export_out;
    CLI::App * exp = app.add_subcommand(
        "export", "write a checkpoint's weights as a Hugging Face folder (config.json + model.safetensors)");
    exp->add_option("checkpoint", ckpt, "checkpoint folder, or a folder of them (the newest)")->required();
    exp->add_option("--out", export_out, "output folder")->required();
    exp->callback([] {
        const Checkpoint c = load_checkpoint(ckpt);
        if (!c.meta.contains("model") || !c.meta["model"].is_object())
            throw FormatError(fmt::format("{}: the checkpoint's meta.json has no model", ckpt));
        ModelConfig cfg = parse_hf_config(c.meta["model"], ckpt + "/meta.json");
        cfg.name = c.meta["model"].value("name", cfg.name);
        const ParamLayout layout = make_param_layout(cfg);
        if (layout.total != c.state.params.size())
            throw FormatError(fmt::format("{}: {} parameters, a model of that shape has {}", ckpt,
                                          c.state.params.size(), layout.total));
        export_hf(export_out, cfg, layout, c.state.params.data());
        std::printf("wrote %s/config.json and %s/model.safetensors (step %d)\n", export_out.c_str(),
                    export_out.c_str(), json_get<int>(c.meta, "step", ckpt + "/meta.json"));
    });

    static std::string gen_model, gen_prompt = "\n", gen_tokenizer;
    static int gen_seq = 0, gen_threads = 0;
    static SampleOptions gen;
    CLI::App * g = app.add_subcommand(
        "generate", "continue a prompt with a model folder from `memfit export` (streams the text)");
    g->add_option("--model", gen_model, "folder with config.json and model.safetensors")->required();
    g->add_option("--prompt", gen_prompt, "text to continue")->capture_default_str();
    g->add_option("--tokenizer", gen_tokenizer, "gpt2, bytes or PATH/tokenizer.model (default: the folder's "
                  "tokenizer.model, else bytes for a vocabulary of 256, gpt2 for 50257)");
    g->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")->capture_default_str()
        ->check(kPositive);
    g->add_option("--temperature", gen.temperature, "softmax temperature (0: greedy)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-k", gen.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-p", gen.top_p, "sample from the smallest set with this much probability")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    g->add_option("--seed", gen.seed, "random seed")->capture_default_str();
    g->add_option("--seq", gen_seq, "KV cache positions (default: the prompt plus --max-new-tokens, at most the model's context); when full, the last half of the context is re-run")->check(kNonNegative);
    g->add_option("--threads", gen_threads, "CPU threads (0: all cores)")->check(kNonNegative);
    g->callback([] {
        if (gen_threads > 0) omp_set_num_threads(gen_threads);
        if (!has_hf_weights(gen_model))
            throw IoError(fmt::format("{}: no model.safetensors; pass a folder written by `memfit export`", gen_model));
        const ModelConfig cfg = resolve_model(gen_model + "/");
        std::string kind = !gen_tokenizer.empty() ? gen_tokenizer : tokenizer_for_folder(gen_model);
        if (kind.empty() && cfg.vocab_size != 256 && cfg.vocab_size != 50257)
            throw ConfigError(fmt::format("{} has no tokenizer.model and its vocabulary ({}) matches neither bytes (256) "
                                          "nor gpt2 (50257); pass --tokenizer", gen_model, cfg.vocab_size));
        if (kind.empty()) kind = cfg.vocab_size == 256 ? "bytes" : "gpt2";
        const auto tok = make_tokenizer(kind, data_dir());
        CpuBackend backend;
        const std::vector<int32_t> prompt = tok->encode(gen_prompt);
        // The KV cache holds the prompt and every new token unless --seq caps it (then the last
        // half of the context is re-run whenever it fills).
        const int want = std::max(1, int(prompt.size()) + gen.max_new_tokens);
        Decoder decoder(cfg, backend, std::min(gen_seq > 0 ? gen_seq : want, cfg.max_seq));
        {
            std::vector<float> weights(decoder.layout().total);
            load_hf_weights(gen_model, cfg, decoder.layout(), weights.data());
            decoder.set_weights(weights.data());
        }
        std::printf("%s", gen_prompt.c_str());
        std::fflush(stdout);
        const auto t0 = std::chrono::steady_clock::now();
        generate(decoder, prompt, gen, [&](int32_t id) {
            std::printf("%s", tok->decode_token(id).c_str());
            std::fflush(stdout);
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("\n");
        const CategoryBytes plan = decoder.planned_peak_live();
        std::fprintf(stderr,
                     "generate: %d tokens in %.2f s (%.1f tokens/s); memory planned %s, measured %s: weights %s, "
                     "KV cache %s (%d positions x %d layers), other activations %s, workspace %s\n",
                     gen.max_new_tokens, s, gen.max_new_tokens / std::max(s, 1e-9), format_bytes(plan.total()).c_str(),
                     format_bytes(decoder.ledger().live_peak().total()).c_str(),
                     format_bytes(plan[Category::parameters]).c_str(), format_bytes(decoder.kv_cache_bytes()).c_str(),
                     decoder.capacity(), cfg.n_layer,
                     format_bytes(plan[Category::activations] - decoder.kv_cache_bytes()).c_str(),
                     format_bytes(plan[Category::workspace]).c_str());
    });

}

}  // namespace memfit::cli
