// memfit generate: one prompt streamed, or a file of requests served at once (continuous
// batching over a paged KV cache, app/batch_requests.h).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "app/batch_requests.h"
#include "app/model_source.h"
#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/text.h"
#include "core/units.h"
#include "data/instruct.h"
#include "infer/decoder.h"
#include "infer/generate.h"
#include "model/config.h"
#include "report/memory_report.h"
#include "run/run_config.h"
#include "tokenizer/tokenizer.h"

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


struct GenFlags {
    std::string model, prompt = "\n", tokenizer, weights = "fp32", chat_template = "auto", system, device = "cpu",
                adapter, prompts, out, kv_memory, kv_cache = "paged", kv_dtype = "auto", memory_budget;
    bool chat = false;
    int seq = 0, threads = 0, kv_block = 16, max_num_seqs = 32, max_num_batched_tokens = 128;
    SampleOptions sample;
};
GenFlags f;

struct WeightChoice {
    DType dtype = DType::f32;
    std::optional<QuantFormat> quant;
};

WeightChoice weight_choice(const std::string & w) {
    WeightChoice c;
    if (w == "bf16") c.dtype = DType::bf16;
    else if (w == "int8") c.quant = QuantFormat::int8;
    else if (w == "nf4") c.quant = QuantFormat::nf4_dq;
    else if (w == "sparse24") c.quant = QuantFormat::sparse24;
    else if (w != "fp32") throw ConfigError(fmt::format("--weights {}: expected fp32, bf16, int8, nf4 or sparse24", w));
    return c;
}

// The model's tokenizer: --tokenizer, the folder's, or the one its vocabulary implies.
std::string tokenizer_kind(const LoadedModel & source) {
    std::string kind = !f.tokenizer.empty() ? f.tokenizer : source.tokenizer;
    const int V = source.cfg.vocab_size;
    if (kind.empty() && V != 256 && V != 50257)
        throw ConfigError(fmt::format("{} has no tokenizer.json or tokenizer.model and its vocabulary ({}) matches "
                                      "neither bytes (256) nor gpt2 (50257); pass --tokenizer", f.model, V));
    return !kind.empty() ? kind : V == 256 ? "bytes" : "gpt2";
}

// The KV cache's positions: --seq, else `want` within the context the model was trained on
// (config.json's memfit_trained_context; more warns).
int context_for(const ModelConfig & cfg, int want) {
    const int trained = cfg.trained_context();
    if (f.seq > trained)
        std::fprintf(stderr,
                     "generate: warning: --seq %d goes past the %d positions this model was trained on (of %d); "
                     "text there may be garbage\n",
                     f.seq, trained, cfg.max_seq);
    return std::min(f.seq > 0 ? f.seq : std::min(std::max(1, want), trained), cfg.max_seq);
}

// The packed projections: a GPTQ folder's, or --weights int8 | nf4 | sparse24's (none: empty).
QuantLayout quant_layout_of(const LoadedModel & source, const WeightChoice & w) {
    if (!source.quant.entries.empty() && (w.quant || w.dtype != DType::f32))
        throw ConfigError(fmt::format("--weights {}: {} is a GPTQ folder; its projections compute as stored (drop "
                                      "--weights)", f.weights, f.model));
    try {
        return !source.quant.entries.empty() ? source.quant
               : w.quant                     ? make_quant_layout(source.cfg, *w.quant)
                                             : QuantLayout{};
    } catch (const ConfigError & e) {
        // make_quant_layout speaks of training's --base-weights; here the flag is --weights.
        std::string m = e.what();
        if (m.starts_with("--base-weights")) m.replace(0, std::string("--base-weights").size(), "--weights");
        throw ConfigError(m);
    }
}

// The decoder with the weights set (paged: a paged one); source.params is freed.
std::unique_ptr<Decoder> make_decoder(LoadedModel & source, Backend & backend, const WeightChoice & w, int capacity,
                                      const PagedKv * paged) {
    const ModelConfig & cfg = source.cfg;
    const QuantLayout q = quant_layout_of(source, w);
    std::unique_ptr<Decoder> d = paged ? std::make_unique<Decoder>(cfg, backend, *paged, capacity, w.dtype, q)
                                       : std::make_unique<Decoder>(cfg, backend, capacity, w.dtype, q);
    MF_ASSERT(source.params.size() == d->layout().total);
    d->set_weights(source.params.data(), source.packed.empty() ? nullptr : &source.packed);
    source.params = {};
    std::fprintf(stderr, "%s\n", describe_weight_bytes(*d).c_str());
    return d;
}

// "HEAD memory planned ..., measured ...: weights, KV cache (kv_detail), other activations, workspace".
void print_memory(const Decoder & d, const Backend & backend, const std::string & head, const std::string & kv_detail) {
    const CategoryBytes plan = d.planned_peak_live();
    std::fprintf(stderr, "%s memory planned %s, measured %s: weights %s, KV cache %s (%s), other activations %s, "
                 "workspace %s\n", head.c_str(), format_bytes(plan.total()).c_str(),
                 format_bytes(d.ledger().live_peak().total()).c_str(), format_bytes(plan[Category::parameters]).c_str(),
                 format_bytes(d.kv_cache_bytes()).c_str(), kv_detail.c_str(),
                 format_bytes(plan[Category::activations] - d.kv_cache_bytes()).c_str(),
                 format_bytes(plan[Category::workspace]).c_str());
    if (!backend.host_memory())
        std::fprintf(stderr, "%s\n", format_device_memory(d.planned_reserved().total(), backend.runtime_bytes(),
                                                          backend.device_used_delta()).c_str());
}

// One prompt, its continuation streamed to stdout.
void run_prompt(LoadedModel & source, const Tokenizer & tok, const std::string & kind, Backend & backend) {
    SampleOptions gen = f.sample;
    std::string text = f.prompt;
    if (f.chat) {
        const ChatFormat chat = load_chat_format(kind, tok, f.chat_template);
        if (!chat.chat)
            throw ConfigError(fmt::format("--chat: the tokenizer {} has no chat template beside it; {}", kind,
                                          chat.why_none.empty() ? "pass --chat-template chatml, llama3, mistral "
                                                                  "or a Jinja file" : chat.why_none));
        text = chat_prompt(chat, f.system, f.prompt);
        for (const int32_t id : {chat.end_of_turn_id, chat.eos_id})
            if (id >= 0) gen.stop.push_back(id);
    } else if (!f.system.empty()) {
        throw ConfigError("--system is a chat's system message: add --chat");
    }
    const std::vector<int32_t> prompt = tok.encode(text);
    // When the cache fills, the last half of the context is re-run (a sliding window).
    const int capacity = context_for(source.cfg, int(prompt.size()) + gen.max_new_tokens);
    const std::unique_ptr<Decoder> decoder = make_decoder(source, backend, weight_choice(f.weights), capacity, nullptr);
    if (!f.chat) std::printf("%s", f.prompt.c_str());   // a chat prints the reply alone
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const bool tty = isatty(fileno(stdout)) != 0;
    const auto out = generate(*decoder, prompt, gen, [&](int32_t id) {
        // On a terminal, control bytes print escaped (ESC c would reset it); a file gets the bytes.
        const std::string piece = tty ? printable_text(tok.decode_token(id)) : tok.decode_token(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);   // every byte, a NUL too
        std::fflush(stdout);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("\n");
    std::fflush(stdout);   // the reply's last line before the statistics on stderr, also into one file
    print_memory(*decoder, backend,
                 fmt::format("generate: {} tokens in {:.2f} s ({:.1f} tokens/s);", out.size(), s,
                             double(out.size()) / std::max(s, 1e-9)),
                 fmt::format("{} positions x {} layers", decoder->capacity(), source.cfg.n_layer));
}

// --prompts FILE --out RESULTS: every request served at once (app/batch_requests.h).
void run_prompts_file(LoadedModel & source, const Tokenizer & tok, const std::string & kind, Backend & backend) {
    if (f.out.empty()) throw ConfigError("--prompts: name the results file with --out RESULTS.jsonl");
    if (f.chat || f.prompt != "\n" || !f.system.empty())
        throw ConfigError("--prompts: each line holds its own prompt or messages (drop --prompt, --chat and --system)");
    const WeightChoice w = weight_choice(f.weights);
    const ChatFormat chat = load_chat_format(kind, tok, f.chat_template);
    const std::vector<GenerationRequest> reqs = read_generation_requests(f.prompts, tok, chat, f.sample);
    int want = 1;
    for (const GenerationRequest & r : reqs) want = std::max(want, int(r.prompt.size()) + r.sample.max_new_tokens);
    BatchServeOptions o;
    o.kv_block = f.kv_block;
    o.kv_memory = f.kv_memory.empty() ? 0 : parse_bytes(f.kv_memory);
    o.max_num_seqs = f.max_num_seqs;
    o.max_num_batched_tokens = f.max_num_batched_tokens;
    o.context = context_for(source.cfg, want);
    o.kv_int8 = f.kv_dtype == "int8";
    if (!f.kv_memory.empty() && !f.memory_budget.empty())
        throw ConfigError("--kv-memory and --memory-budget: give one (the pool's bytes, or everything's)");
    PagedKv kv = batch_kv_geometry(source.cfg, w.dtype, o, reqs);
    if (!f.memory_budget.empty())
        kv.blocks = blocks_within_budget(source.cfg, backend, kv, o.context, w.dtype, quant_layout_of(source, w),
                                         parse_bytes(f.memory_budget));
    const std::unique_ptr<Decoder> decoder = make_decoder(source, backend, w, o.context, &kv);
    std::fprintf(stderr, "generate: %zu requests from %s; up to %d sequences and %d token rows a step; KV cache %s, "
                 "%s: %d blocks of %d positions, %d positions a sequence\n", reqs.size(), f.prompts.c_str(),
                 f.max_num_seqs, kv.tokens, f.kv_cache.c_str(), kv.int8 ? "int8" : precision_name(w.dtype).c_str(),
                 kv.blocks, kv.block, o.context);
    BatchOptions bo;
    bo.reserve_context = f.kv_cache == "contiguous";
    bo.max_seqs = f.max_num_seqs;
    const std::vector<GenerationResult> results = serve_requests(*decoder, reqs, stderr, bo);
    write_file_atomic(f.out, generation_results_jsonl(results, tok));
    int failed = 0;
    for (const GenerationResult & r : results) failed += !r.error.empty();
    std::fprintf(stderr, "generate: wrote %s (%zu lines%s)\n", f.out.c_str(), results.size(),
                 failed ? fmt::format(", {} with an \"error\"", failed).c_str() : "");
    print_memory(*decoder, backend, "generate:", fmt::format("{} blocks of {} positions x {} layers", kv.blocks,
                                                             kv.block, source.cfg.n_layer));
}

}  // namespace

void add_generate_command(CLI::App & app) {
    CLI::App * g = app.add_subcommand(
        "generate", "continue a prompt with a model folder, a checkpoint, or a base and a PEFT adapter (streams the text)");
    g->add_option("--model", f.model, "a model folder (config.json + model.safetensors, from memfit export or the "
                  "Hub), or a training checkpoint (a step-N folder, or <out>/checkpoints: the newest; LoRA adapters "
                  "merged into their base)")->required();
    g->add_option("--adapter", f.adapter, "a PEFT LoRA adapter folder (adapter_config.json + "
                  "adapter_model.safetensors, from memfit export --adapter-only or PEFT) merged into --model's "
                  "weights");
    g->add_option("--prompt", f.prompt, "text to continue")->capture_default_str();
    g->add_option("--tokenizer", f.tokenizer, "gpt2, bytes, PATH/tokenizer.json or PATH/tokenizer.model (default: "
                  "the folder's tokenizer.json, else its tokenizer.model, else bytes for a vocabulary of 256, gpt2 "
                  "for 50257)");
    g->add_option("--max-new-tokens", f.sample.max_new_tokens, "tokens to generate")->capture_default_str()
        ->check(kPositive);
    g->add_option("--temperature", f.sample.temperature, "softmax temperature (0: greedy)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-k", f.sample.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str()
        ->check(kNonNegative);
    g->add_option("--top-p", f.sample.top_p, "sample from the smallest set with this much probability")
        ->capture_default_str()->check(kFraction);
    g->add_option("--seed", f.sample.seed, "random seed")->capture_default_str()->check(kSeed);
    g->add_option("--seq", f.seq, "KV cache positions (default: the prompt plus --max-new-tokens, at most the context the model was trained on, config.json's memfit_trained_context; more warns); when full, the last half of the context is re-run")->check(kNonNegative);
    g->add_option("--threads", f.threads, "CPU threads (0: all cores)")->check(kNonNegative);
    g->add_option("--device", f.device, "where the decoder runs: cpu, or cuda (the first GPU; its weights, KV "
                  "cache and activations planned exactly in device memory)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
    g->add_flag("--chat", f.chat, "the prompt is a user turn: rendered with the chat template (and --system), the "
                "reply generated until the template's end-of-turn token");
    g->add_option("--chat-template", f.chat_template, "with --chat: auto (the tokenizer_config.json beside the "
                  "tokenizer), chatml, llama3, mistral or a Jinja file")->capture_default_str();
    g->add_option("--system", f.system, "with --chat: a system message before the prompt");
    g->add_option("--weights", f.weights, "weight storage: fp32, bf16, or int8 | nf4 | sparse24 (the block "
                  "projections packed as a QLoRA base: nf4 with double-quantized scales; sparse24 keeps the 2 "
                  "largest of every 4 inputs as bf16 with 2-bit positions, lossless for a --sparsity 2:4 model; "
                  "embeddings, norms and head fp32)")
        ->capture_default_str();
    g->add_option("--prompts", f.prompts, "a JSONL file of requests, one per line: {\"prompt\": TEXT} or "
                  "{\"messages\": [...]}, with optional max_tokens, temperature, top_p, top_k, seed (else these "
                  "flags'); served at once by continuous batching over a paged KV cache (needs --out)")->check(kPath);
    g->add_option("--out", f.out, "with --prompts: the results file, one JSON line per request in the input's order "
                  "(index, text, token_ids, finish_reason, prompt_tokens, completion_tokens, preemptions; error)")->check(kPath);
    g->add_option("--kv-block", f.kv_block, "with --prompts: positions per KV cache block")->capture_default_str()
        ->check(CLI::Range(1, 4096));
    g->add_option("--kv-memory", f.kv_memory, "with --prompts: bytes of the KV block pool (512MiB, 2GB, ...; "
                  "default: every block the --max-num-seqs largest requests can use)");
    g->add_option("--memory-budget", f.memory_budget, "with --prompts: bytes for everything the decoder plans "
                  "(weights, KV pool, activations, workspace); the pool gets what the rest leaves (instead of "
                  "--kv-memory)");
    g->add_option("--max-num-seqs", f.max_num_seqs, "with --prompts: sequences running at once at most")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    g->add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "with --prompts: token rows one step runs "
                  "at most, decoding rows first and prompt chunks after (rounded up to a multiple of 8)")
        ->capture_default_str()->check(CLI::Range(1, 1 << 20));
    g->add_option("--kv-dtype", f.kv_dtype, "with --prompts: the KV cache's storage: auto (the compute dtype: fp32, "
                  "or bf16 with --weights bf16), or int8 (per position and KV head, codes of x / s with s = max |x| / "
                  "127 and the fp32 scale s)")->capture_default_str()->check(CLI::IsMember({"auto", "int8"}));
    g->add_option("--kv-cache", f.kv_cache, "with --prompts: paged (blocks taken as sequences grow), or contiguous "
                  "(each sequence reserves its whole context when admitted: the baseline paging is measured against)")
        ->capture_default_str()->check(CLI::IsMember({"paged", "contiguous"}));
    g->callback([] {
        if (f.threads > 0) omp_set_num_threads(f.threads);
        weight_choice(f.weights);   // flags first, before any file is read
        LoadedModel source = read_model_weights(f.model, f.adapter);
        const std::string kind = tokenizer_kind(source);
        const auto tok = make_tokenizer(kind, data_dir());
        const std::unique_ptr<Backend> backend = make_backend(f.device);
        if (!f.prompts.empty()) run_prompts_file(source, *tok, kind, *backend);
        else run_prompt(source, *tok, kind, *backend);
    });
}

}  // namespace memfit::cli
