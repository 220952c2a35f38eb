// memfit export, generate: model folders in Hugging Face's layout.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "app/export.h"
#include "app/model_source.h"
#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/text.h"
#include "core/units.h"
#include "infer/decoder.h"
#include "data/instruct.h"
#include "infer/generate.h"
#include "model/config.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "report/memory_report.h"
#include "run/run_config.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"

namespace memfit::cli {

namespace {

// "generate: weights 1.23 MiB planned (int8 projections): ..." with the ratios to the same
// model in bf16 and fp32, for the quantized projections alone and for the whole model (whose
// embeddings, norms and head stay unquantized).
std::string describe_weight_bytes(const Decoder & d) {
    const uint64_t planned = d.planned_peak_live()[Category::parameters];
    const double all = double(d.config().num_params());
    auto ratios = [](double bytes, double elems) {
        return fmt::format("{:.1f}% of bf16, {:.1f}% of fp32", 100.0 * bytes / (2 * elems), 100.0 * bytes / (4 * elems));
    };
    const QuantLayout & q = d.quant_layout();
    if (q.entries.empty())
        return fmt::format("generate: weights {} planned ({}) = {}", format_bytes(planned), precision_name(d.compute()),
                           ratios(double(planned), all));
    double proj = 0;
    for (const auto & e : q.entries) proj += double(e.q.out) * double(e.q.in);
    return fmt::format("generate: weights {} planned: {} projections {} = {}; whole model = {} (embeddings, norms "
                       "and head in {})",
                       format_bytes(planned), quant_format_name(q.entries.front().q.format), format_bytes(q.bytes),
                       ratios(double(q.bytes), proj), ratios(double(planned), all), precision_name(d.compute()));
}

}  // namespace

void add_model_commands(CLI::App & app) {
    static std::string ckpt, export_out, export_base, export_shard = "5GB";
    static bool merge_lora_flag = false, adapter_only = false;
    static ExportFormat export_format;
    CLI::App * exp = app.add_subcommand(
        "export", "write a checkpoint's weights as a Hugging Face folder (config.json + model.safetensors)");
    exp->add_option("checkpoint", ckpt, "checkpoint folder, or a folder of them (the newest)")->required();
    exp->add_option("--out", export_out, "output folder")->required()->check(kPath);
    exp->add_flag_callback("--allow-unverified", [] { set_unverified_checkpoints_allowed(true); },
                           "export a checkpoint that records no content digests, with a warning, instead of refusing "
                           "it");
    exp->add_flag("--merge-lora", merge_lora_flag,
                  "LoRA checkpoint: fold the adapters into the base and write a plain Hugging Face folder");
    exp->add_flag("--adapter-only", adapter_only,
                  "LoRA checkpoint: write PEFT's adapter folder (adapter_config.json + adapter_model.safetensors)");
    exp->add_option("--base-model", export_base,
                    "LoRA checkpoint: the Hugging Face folder the run trained from, when it has moved (default: the "
                    "path the checkpoint records)");
    exp->add_option("--dtype", export_format.dtype, "weights in the model folder: fp32, bf16 or fp16 (default: the "
                    "run's --precision, as the checkpoint records it; fp32 for checkpoints that do not say)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    exp->add_option("--max-shard-size", export_shard, "above this the weights are split into "
                    "model-0000K-of-0000N.safetensors with model.safetensors.index.json, as save_pretrained does "
                    "(5GB, 500MB, 2GiB, ...)")->capture_default_str();
    exp->callback([] {
        export_format.max_shard_bytes = parse_bytes(export_shard);
        if (export_format.max_shard_bytes == 0)
            throw ConfigError("--max-shard-size 0: a shard must hold at least one byte (e.g. 5GB)");
        if (merge_lora_flag && adapter_only)
            throw ConfigError("--merge-lora and --adapter-only: pick one (a merged model folder, or PEFT's adapter "
                              "folder)");
        const ExportMode mode = merge_lora_flag ? ExportMode::merge_lora
                                : adapter_only  ? ExportMode::adapter_only
                                                : ExportMode::plain;
        std::printf("%s\n", export_checkpoint(ckpt, export_out, mode, export_base, export_format).c_str());
    });

    static std::string gen_model, gen_prompt = "\n", gen_tokenizer, gen_weights = "fp32", gen_template = "auto",
                       gen_system, gen_device = "cpu", gen_adapter;
    static bool gen_chat = false;
    static int gen_seq = 0, gen_threads = 0;
    static SampleOptions gen;
    CLI::App * g = app.add_subcommand(
        "generate", "continue a prompt with a model folder, a checkpoint, or a base and a PEFT adapter (streams the text)");
    g->add_option("--model", gen_model, "a model folder (config.json + model.safetensors, from memfit export or the "
                  "Hub), or a training checkpoint (a step-N folder, or <out>/checkpoints: the newest; LoRA adapters "
                  "merged into their base)")->required();
    g->add_option("--adapter", gen_adapter, "a PEFT LoRA adapter folder (adapter_config.json + "
                  "adapter_model.safetensors, from memfit export --adapter-only or PEFT) merged into --model's "
                  "weights");
    g->add_option("--prompt", gen_prompt, "text to continue")->capture_default_str();
    g->add_option("--tokenizer", gen_tokenizer, "gpt2, bytes, PATH/tokenizer.json or PATH/tokenizer.model (default: "
                  "the folder's tokenizer.json, else its tokenizer.model, else bytes for a vocabulary of 256, gpt2 "
                  "for 50257)");
    g->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")->capture_default_str()
        ->check(kPositive);
    g->add_option("--temperature", gen.temperature, "softmax temperature (0: greedy)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-k", gen.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-p", gen.top_p, "sample from the smallest set with this much probability")
        ->capture_default_str()->check(kFraction);
    g->add_option("--seed", gen.seed, "random seed")->capture_default_str()->check(kSeed);
    g->add_option("--seq", gen_seq, "KV cache positions (default: the prompt plus --max-new-tokens, at most the context the model was trained on, config.json's memfit_trained_context; more warns); when full, the last half of the context is re-run")->check(kNonNegative);
    g->add_option("--threads", gen_threads, "CPU threads (0: all cores)")->check(kNonNegative);
    g->add_option("--device", gen_device, "where the decoder runs: cpu, or cuda (the first GPU; its weights, KV "
                  "cache and activations planned exactly in device memory)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
    g->add_flag("--chat", gen_chat, "the prompt is a user turn: rendered with the chat template (and --system), the "
                "reply generated until the template's end-of-turn token");
    g->add_option("--chat-template", gen_template, "with --chat: auto (the tokenizer_config.json beside the "
                  "tokenizer), chatml, llama3, mistral or a Jinja file")->capture_default_str();
    g->add_option("--system", gen_system, "with --chat: a system message before the prompt");
    g->add_option("--weights", gen_weights, "weight storage: fp32, bf16, or int8 | nf4 | sparse24 (the block "
                  "projections packed as a QLoRA base: nf4 with double-quantized scales; sparse24 keeps the 2 "
                  "largest of every 4 inputs as bf16 with 2-bit positions, lossless for a --sparsity 2:4 model; "
                  "embeddings, norms and head fp32)")
        ->capture_default_str();
    g->callback([] {
        if (gen_threads > 0) omp_set_num_threads(gen_threads);
        // Flags first, before any file is read.
        DType wdt = DType::f32;
        std::optional<QuantFormat> quant;
        if (gen_weights == "bf16") wdt = DType::bf16;
        else if (gen_weights == "int8") quant = QuantFormat::int8;
        else if (gen_weights == "nf4") quant = QuantFormat::nf4_dq;
        else if (gen_weights == "sparse24") quant = QuantFormat::sparse24;
        else if (gen_weights != "fp32")
            throw ConfigError(fmt::format("--weights {}: expected fp32, bf16, int8, nf4 or sparse24", gen_weights));
        LoadedModel source = read_model_weights(gen_model, gen_adapter);
        const ModelConfig & cfg = source.cfg;
        std::string kind = !gen_tokenizer.empty() ? gen_tokenizer : source.tokenizer;
        if (kind.empty() && cfg.vocab_size != 256 && cfg.vocab_size != 50257)
            throw ConfigError(fmt::format("{} has no tokenizer.json or tokenizer.model and its vocabulary ({}) matches neither bytes (256) "
                                          "nor gpt2 (50257); pass --tokenizer", gen_model, cfg.vocab_size));
        if (kind.empty()) kind = cfg.vocab_size == 256 ? "bytes" : "gpt2";
        const auto tok = make_tokenizer(kind, data_dir());
        const std::unique_ptr<Backend> owned = make_backend(gen_device);
        Backend & backend = *owned;
        std::string text = gen_prompt;
        if (gen_chat) {
            const ChatFormat chat = load_chat_format(kind, *tok, gen_template);
            if (!chat.chat)
                throw ConfigError(fmt::format("--chat: the tokenizer {} has no chat template beside it; {}", kind,
                                              chat.why_none.empty() ? "pass --chat-template chatml, llama3, mistral "
                                                                      "or a Jinja file" : chat.why_none));
            text = chat_prompt(chat, gen_system, gen_prompt);
            for (const int32_t id : {chat.end_of_turn_id, chat.eos_id})
                if (id >= 0) gen.stop.push_back(id);
        } else if (!gen_system.empty()) {
            throw ConfigError("--system is a chat's system message: add --chat");
        }
        const std::vector<int32_t> prompt = tok->encode(text);
        // The KV cache holds the prompt and every new token, within the positions the model was
        // trained on (config.json's memfit_trained_context) unless --seq asks for more; when it
        // fills, the last half of the context is re-run (a sliding window).
        const int want = std::max(1, int(prompt.size()) + gen.max_new_tokens);
        const int trained = cfg.trained_context();
        if (gen_seq > trained)
            std::fprintf(stderr,
                         "generate: warning: --seq %d goes past the %d positions this model was trained on (of %d); "
                         "text there may be garbage\n",
                         gen_seq, trained, cfg.max_seq);
        const int capacity = std::min(gen_seq > 0 ? gen_seq : std::min(want, trained), cfg.max_seq);
        std::unique_ptr<Decoder> made;
        if (!source.quant.entries.empty() && (quant || wdt != DType::f32))
            throw ConfigError(fmt::format("--weights {}: {} is a GPTQ folder; its projections compute as stored (drop "
                                          "--weights)", gen_weights, gen_model));
        try {
            made = source.quant.entries.empty() ? std::make_unique<Decoder>(cfg, backend, capacity, wdt, quant)
                                                : std::make_unique<Decoder>(cfg, backend, capacity, wdt, source.quant);
        } catch (const ConfigError & e) {
            // make_quant_layout speaks of training's --base-weights; here the flag is --weights.
            std::string m = e.what();
            if (m.starts_with("--base-weights")) m.replace(0, std::string("--base-weights").size(), "--weights");
            throw ConfigError(m);
        }
        Decoder & decoder = *made;
        MF_ASSERT(source.params.size() == decoder.layout().total);
        decoder.set_weights(source.params.data(), source.packed.empty() ? nullptr : &source.packed);
        source.params = {};
        std::fprintf(stderr, "%s\n", describe_weight_bytes(decoder).c_str());
        if (!gen_chat) std::printf("%s", gen_prompt.c_str());   // a chat prints the reply alone
        std::fflush(stdout);
        const auto t0 = std::chrono::steady_clock::now();
        const bool tty = isatty(fileno(stdout)) != 0;
        const auto out = generate(decoder, prompt, gen, [&](int32_t id) {
            // On a terminal, control bytes print escaped (ESC c would reset it); a file gets the bytes.
            const std::string piece = tok->decode_token(id);
            std::printf("%s", (tty ? printable_text(piece) : piece).c_str());
            std::fflush(stdout);
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("\n");
        std::fflush(stdout);   // the reply's last line before the statistics on stderr, also into one file
        const CategoryBytes plan = decoder.planned_peak_live();
        std::fprintf(stderr,
                     "generate: %d tokens in %.2f s (%.1f tokens/s); memory planned %s, measured %s: weights %s, "
                     "KV cache %s (%d positions x %d layers), other activations %s, workspace %s\n",
                     int(out.size()), s, double(out.size()) / std::max(s, 1e-9), format_bytes(plan.total()).c_str(),
                     format_bytes(decoder.ledger().live_peak().total()).c_str(),
                     format_bytes(plan[Category::parameters]).c_str(), format_bytes(decoder.kv_cache_bytes()).c_str(),
                     decoder.capacity(), cfg.n_layer,
                     format_bytes(plan[Category::activations] - decoder.kv_cache_bytes()).c_str(),
                     format_bytes(plan[Category::workspace]).c_str());
        if (!backend.host_memory())
            std::fprintf(stderr, "%s\n",
                         format_device_memory(decoder.planned_reserved().total(), backend.runtime_bytes(),
                                              backend.device_used_delta()).c_str());
    });

}

}  // namespace memfit::cli
