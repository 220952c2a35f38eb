#include "app/batch_requests.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_read.h"
#include "core/units.h"

namespace memfit {

namespace {

using ojson = nlohmann::ordered_json;

// One line's sampling keys over the defaults; ConfigError (with `where`) for a wrong type or range.
SampleOptions line_sampling(const ojson & j, const SampleOptions & defaults, const std::string & where) {
    SampleOptions o = defaults;
    auto number = [&](const char * key, double lo, double hi) -> std::optional<double> {
        if (!j.contains(key)) return std::nullopt;
        const ojson & v = j[key];
        if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
            throw ConfigError(fmt::format("{}: \"{}\" must be a number from {} to {} (it is {})", where, key, lo, hi,
                                          v.dump()));
        return v.get<double>();
    };
    if (auto v = number("max_tokens", 1, 1e9)) o.max_new_tokens = int(*v);
    if (auto v = number("temperature", 0, 1e6)) o.temperature = float(*v);
    if (auto v = number("top_p", 0, 1)) o.top_p = float(*v);
    if (auto v = number("top_k", 0, 1e9)) o.top_k = int(*v);
    if (auto v = number("seed", 0, 9e15)) o.seed = uint64_t(*v);
    return o;
}

}  // namespace

std::vector<GenerationRequest> read_generation_requests(const std::string & path, const Tokenizer & tok,
                                                        const ChatFormat & chat, const SampleOptions & defaults) {
    static const char * kKeys[] = {"prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed"};
    std::istringstream in(read_text_file(path));
    std::vector<GenerationRequest> out;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = fmt::format("{} line {}", path, n);
        const ojson j = parse_ordered_json(line, where);
        if (!j.is_object()) throw ConfigError(fmt::format("{}: a request is a JSON object", where));
        for (const auto & [key, value] : j.items())
            if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char * k) { return key == k; }) ==
                std::end(kKeys))
                throw ConfigError(fmt::format("{}: unknown key \"{}\" (expected prompt or messages, and max_tokens, "
                                              "temperature, top_p, top_k, seed)", where, key));
        GenerationRequest r;
        r.sample = line_sampling(j, defaults, where);
        if (j.contains("prompt") == j.contains("messages"))
            throw ConfigError(fmt::format("{}: a request has \"prompt\" (text) or \"messages\" (a chat), one of them",
                                          where));
        if (j.contains("prompt")) {
            if (!j["prompt"].is_string()) throw ConfigError(fmt::format("{}: \"prompt\" must be a string", where));
            r.prompt = tok.encode(j["prompt"].get<std::string>());
        } else {
            if (!chat.chat)
                throw ConfigError(fmt::format("{}: \"messages\" need a chat template and the tokenizer has none; {}",
                                              where, chat.why_none.empty() ? "pass --chat-template" : chat.why_none));
            if (!j["messages"].is_array()) throw ConfigError(fmt::format("{}: \"messages\" must be an array", where));
            try {
                r.prompt = tok.encode(chat_prompt(chat, j["messages"]));
            } catch (const ConfigError & e) {
                throw ConfigError(fmt::format("{}: {}", where, e.what()));
            }
            for (const int32_t id : {chat.end_of_turn_id, chat.eos_id})
                if (id >= 0) r.sample.stop.push_back(id);
        }
        out.push_back(std::move(r));
    }
    if (out.empty()) throw ConfigError(fmt::format("{}: no requests (one JSON object per line)", path));
    return out;
}

std::string generation_results_jsonl(const std::vector<GenerationResult> & results, const Tokenizer & tok) {
    std::string out;
    for (size_t i = 0; i < results.size(); ++i) {
        const GenerationResult & r = results[i];
        nlohmann::ordered_json j;
        j["index"] = i;
        j["text"] = tok.decode(r.tokens);
        j["token_ids"] = r.tokens;   // exact where the text is not valid UTF-8 (replaced in "text")
        j["finish_reason"] = r.finish_reason;
        j["prompt_tokens"] = r.prompt_tokens;
        j["completion_tokens"] = r.tokens.size();
        j["preemptions"] = r.preemptions;
        if (!r.error.empty()) j["error"] = r.error;
        out += j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    }
    return out;
}

PagedKv batch_kv_geometry(const ModelConfig & cfg, DType kv_dtype, const BatchServeOptions & o,
                          const std::vector<GenerationRequest> & requests) {
    const int tile = Decoder::kRowTile;
    PagedKv kv;
    kv.block = o.kv_block;
    kv.seqs = (std::max(1, o.max_num_seqs) + tile - 1) / tile * tile;
    kv.tokens = (std::max(1, o.max_num_batched_tokens) + tile - 1) / tile * tile;
    kv.int8 = o.kv_int8;
    const uint64_t per_block = uint64_t(2) * cfg.n_layer * uint64_t(o.kv_block) *
                               uint64_t(paged_row_bytes(kv, cfg.kv_heads(), cfg.head_dim(), int64_t(dtype_size(kv_dtype))));
    if (o.kv_memory > 0) {
        const uint64_t blocks = o.kv_memory / per_block;
        if (blocks < 2)
            throw ConfigError(fmt::format("--kv-memory {} holds {} KV blocks of {} positions ({} each, all {} layers); "
                                          "give it at least {}", format_bytes(o.kv_memory), blocks, o.kv_block,
                                          format_bytes(per_block), cfg.n_layer, format_bytes(2 * per_block)));
        kv.blocks = int(std::min<uint64_t>(blocks, uint64_t(1) << 30));
        return kv;
    }
    // Every block the largest max_num_seqs requests can hold at once (their whole length, and one spare).
    std::vector<int> need;
    for (const GenerationRequest & r : requests) {
        const int64_t len = std::min<int64_t>(o.context, int64_t(r.prompt.size()) + r.sample.max_new_tokens);
        need.push_back(int((len + o.kv_block - 1) / o.kv_block) + 1);
    }
    std::sort(need.rbegin(), need.rend());
    int64_t blocks = 0;
    for (size_t i = 0; i < need.size() && i < size_t(std::max(1, o.max_num_seqs)); ++i) blocks += need[i];
    kv.blocks = int(std::max<int64_t>(blocks, 2));
    return kv;
}

int blocks_within_budget(const ModelConfig & cfg, const Backend & sizing, PagedKv kv, int context, DType compute,
                         const QuantLayout & quant, uint64_t budget) {
    kv.blocks = 1;
    const uint64_t one = Decoder::plan_paged(cfg, sizing, kv, context, compute, quant).total();
    kv.blocks = 2;
    const uint64_t per_block = Decoder::plan_paged(cfg, sizing, kv, context, compute, quant).total() - one;
    const uint64_t rest = one - per_block;
    const uint64_t blocks = budget > rest ? (budget - rest) / per_block : 0;
    if (blocks < 2)
        throw ConfigError(fmt::format("--memory-budget {}: the weights, activations and workspace take {} of it, which "
                                      "leaves room for {} KV blocks of {} ({} positions, all {} layers); give it at "
                                      "least {}", format_bytes(budget), format_bytes(rest), blocks,
                                      format_bytes(per_block), kv.block, cfg.n_layer,
                                      format_bytes(rest + 2 * per_block)));
    return int(std::min<uint64_t>(blocks, uint64_t(1) << 30));
}

std::vector<GenerationResult> serve_requests(Decoder & decoder, const std::vector<GenerationRequest> & requests,
                                             std::FILE * progress, const BatchOptions & options) {
    BatchOptions bo = options;
    double last = 0;
    const int total = int(requests.size());
    const PagedKv & kv = decoder.paged();
    bo.on_step = [&](const BatchStats & st) {
        if (!progress || st.seconds - last < 1.0) return;
        last = st.seconds;
        std::fprintf(progress,
                     "generate: step %lld: %d running, %d waiting, %d/%d done; KV blocks %d/%d in use; %.1f tokens/s\n",
                     (long long) st.steps, st.running, st.waiting, st.finished, total, st.blocks_used, kv.blocks,
                     double(st.decode_tokens) / std::max(st.seconds, 1e-9));
        std::fflush(progress);
    };
    BatchStats st;
    std::vector<GenerationResult> out = generate_batch(decoder, requests, bo, &st);
    if (progress) {
        int64_t generated = 0;
        for (const auto & r : out) generated += int64_t(r.tokens.size());
        const uint64_t block_bytes = kv.blocks > 0 ? decoder.kv_cache_bytes() / uint64_t(kv.blocks) : 0;
        std::fprintf(progress,
                     "generate: %d requests, %lld tokens generated in %.2f s (%.1f tokens/s), %lld steps; at most %d "
                     "sequences at once; KV pool %s (%d blocks of %d positions), at most %s in use (%.0f%%), %.0f%% "
                     "of it holding keys; %lld pre-emptions\n",
                     total, (long long) generated, st.seconds, double(generated) / std::max(st.seconds, 1e-9),
                     (long long) st.steps, st.peak_running, format_bytes(decoder.kv_cache_bytes()).c_str(), kv.blocks,
                     kv.block, format_bytes(uint64_t(st.peak_blocks_used) * block_bytes).c_str(),
                     100.0 * st.peak_blocks_used / std::max(1, kv.blocks),
                     100.0 * double(st.positions_at_peak) / std::max(1.0, double(st.peak_blocks_used) * kv.block),
                     (long long) st.preemptions);
    }
    return out;
}

}  // namespace memfit
