#include "plan/inference_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "backend/quant_format.h"
#include "infer/decoder.h"
#include "model/tensor_parallel.h"

namespace memfit {

namespace {

int round_up(int x, int m) { return (std::max(1, x) + m - 1) / m * m; }

PagedKv geometry(const InferenceRequest & r, int concurrency) {
    PagedKv kv;
    kv.block = r.kv_block;
    kv.seqs = round_up(concurrency, Decoder::kRowTile);
    kv.tokens = round_up(r.batched_tokens, Decoder::kRowTile);
    kv.max_blocks = (r.context + r.kv_block - 1) / r.kv_block;
    kv.blocks = std::max(1, concurrency) * kv.max_blocks;
    kv.int8 = r.kv_int8;
    return kv;
}

// One rank's bytes at `concurrency` full contexts.
CategoryBytes rank_bytes(const InferenceRequest & r, const ModelConfig & local, const Backend & sizing,
                         int concurrency) {
    const PagedKv kv = geometry(r, concurrency);
    const QuantLayout q = r.quant ? make_quant_layout(local, *r.quant) : QuantLayout{};
    CategoryBytes b = Decoder::plan_paged(local, sizing, kv, r.context, r.compute, q);
    // Sampling needs the whole vocabulary's logits of each sequence on one rank.
    if (r.tp > 1) b[Category::activations] += uint64_t(kv.seqs) * uint64_t(r.cfg.vocab_size) * 4;
    return b;
}

// The roofline of one decode step and of one prompt's prefill (inference_plan.h).
void time_model(const InferenceRequest & r, const ModelConfig & local, InferencePlan & p) {
    const Hardware & hw = r.hw;
    const int C = std::max(1, p.concurrency);
    const double bw = hw.mem_bw * hw.bandwidth_eff;
    const double flops = hw.flops(r.compute) * hw.matmul_eff;
    const double kv_read = double(C) * double(p.kv_per_token) * 0.5 * r.context;
    const double params = double(local.num_params());
    const double step_flops = 2.0 * params * C + 4.0 * C * 0.5 * r.context * local.n_head * local.head_dim() * local.n_layer;
    double comm = 0;
    if (r.tp > 1) {   // two all-reduces of C rows per layer (ring: 2 (tp - 1) / tp of the bytes)
        const double bytes = double(C) * r.cfg.n_embd * dtype_size(r.compute) * 2.0 * (r.tp - 1) / r.tp;
        const bool one_node = r.tp <= std::max(1, hw.per_node);
        const double link = one_node ? hw.intra_bw : hw.inter_bw, lat = one_node ? hw.intra_latency : hw.inter_latency;
        comm = 2.0 * r.cfg.n_layer * (bytes / std::max(link, 1.0) + 2.0 * (r.tp - 1) * lat);
    }
    p.decode_step_s = std::max((double(p.weights) + kv_read) / std::max(bw, 1.0), step_flops / std::max(flops, 1.0)) + comm;
    p.decode_tokens_per_s = C / p.decode_step_s;
    const double L = r.context;
    const double prefill_flops = 2.0 * params * L + 2.0 * L * L * local.n_head * local.head_dim() * local.n_layer;
    p.prefill_s = prefill_flops / std::max(flops, 1.0);
}

}  // namespace

InferencePlan plan_inference(const InferenceRequest & r, const Backend & sizing) {
    if (r.context < 1 || r.context > r.cfg.max_seq)
        throw ConfigError(fmt::format("--context {}: the model '{}' has {} positions", r.context, r.cfg.name,
                                      r.cfg.max_seq));
    const ModelConfig local = tp_local_config(r.cfg, r.tp);
    InferencePlan p;
    p.usable = r.hw.usable;
    p.kv_per_token = uint64_t(2) * local.n_layer *
                     uint64_t(paged_row_bytes(geometry(r, 1), local.kv_heads(), local.head_dim(),
                                              int64_t(dtype_size(r.compute))));
    auto fits = [&](int c) { return rank_bytes(r, local, sizing, c).total() <= p.usable; };
    // The most that fit: doubling, then bisection (the bytes grow with the concurrency).
    int lo = 0, hi = 1;
    while (hi <= kMaxConcurrency && fits(hi)) lo = hi, hi *= 2;
    hi = std::min(hi, kMaxConcurrency + 1);
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    p.max_concurrency = lo;
    p.concurrency = r.concurrency > 0 ? r.concurrency : std::max(1, lo);
    p.bytes = rank_bytes(r, local, sizing, p.concurrency);
    p.fits = p.bytes.total() <= p.usable;
    p.blocks = geometry(r, p.concurrency).blocks;
    p.kv_pool = uint64_t(p.blocks) * r.kv_block * p.kv_per_token;
    p.weights = p.bytes[Category::parameters];
    time_model(r, local, p);
    return p;
}

std::string format_inference_plan(const InferenceRequest & r, const InferencePlan & p) {
    const uint64_t act = p.bytes[Category::activations] - p.kv_pool;
    std::string w = r.quant ? fmt::format("{} projections, {} elsewhere", quant_format_name(r.quant->format),
                                          dtype_name(r.compute))
                            : std::string(dtype_name(r.compute));
    std::string s = fmt::format(
        "serving {} on {} x {} (tensor parallel {}): weights {}, KV cache {} in blocks of {} positions, {} positions a "
        "request, steps of up to {} token rows\n",
        r.cfg.name, r.tp, r.hw.name, r.tp, w, r.kv_int8 ? "int8" : dtype_name(r.compute), r.kv_block, r.context,
        r.batched_tokens);
    s += fmt::format("  per device, {} requests at once:\n", p.concurrency);
    s += fmt::format("    weights            {:>12}\n", format_bytes(p.weights));
    s += fmt::format("    KV cache           {:>12}  ({} blocks; {} a position, {} a request)\n",
                     format_bytes(p.kv_pool), p.blocks, format_bytes(p.kv_per_token),
                     format_bytes(p.kv_per_token * uint64_t(r.context)));
    s += fmt::format("    activations        {:>12}\n", format_bytes(act));
    s += fmt::format("    workspace          {:>12}\n", format_bytes(p.bytes[Category::workspace]));
    s += fmt::format("    total              {:>12}  of {} usable: {}\n", format_bytes(p.bytes.total()),
                     format_bytes(p.usable), p.fits ? "fits" : "does NOT fit");
    s += p.max_concurrency > 0
             ? fmt::format("  largest concurrency that fits: {}{} requests of {} positions\n", p.max_concurrency,
                           p.max_concurrency >= kMaxConcurrency ? " (the most searched) or more" : "", r.context)
             : fmt::format("  not one request of {} positions fits (try --weights nf4, a shorter --context or --tp)\n",
                           r.context);
    s += fmt::format("  decode: {:.0f} tokens/s ({} requests, a step {:.2f} ms); prefill of {} tokens: {:.3f} s\n",
                     p.decode_tokens_per_s, p.concurrency, 1e3 * p.decode_step_s, r.context, p.prefill_s);
    return s;
}

nlohmann::json inference_plan_json(const InferenceRequest & r, const InferencePlan & p) {
    return {{"model", r.cfg.name},
            {"hardware", r.hw.name},
            {"tp", r.tp},
            {"context", r.context},
            {"kv_block", r.kv_block},
            {"kv_dtype", r.kv_int8 ? "int8" : dtype_name(r.compute)},
            {"concurrency", p.concurrency},
            {"max_concurrency", p.max_concurrency},
            {"fits", p.fits},
            {"weights_bytes", p.weights},
            {"kv_cache", {{"bytes", p.kv_pool}, {"blocks", p.blocks}, {"bytes_per_token", p.kv_per_token}}},
            {"activations_bytes", p.bytes[Category::activations] - p.kv_pool},
            {"workspace_bytes", p.bytes[Category::workspace]},
            {"total_bytes", p.bytes.total()},
            {"usable_bytes", p.usable},
            {"decode_tokens_per_s", p.decode_tokens_per_s},
            {"decode_step_s", p.decode_step_s},
            {"prefill_s", p.prefill_s}};
}

}  // namespace memfit
