#include "train/techniques.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "memory/budget.h"

namespace memfit {

DType parse_precision(const std::string & p) {
    if (p == "fp32") return DType::f32;
    if (p == "bf16") return DType::bf16;
    if (p == "fp16") return DType::f16;
    throw ConfigError(fmt::format("--precision '{}': expected fp32, bf16 or fp16 (auto only with --fit auto)", p));
}

std::string precision_name(DType compute) {
    return compute == DType::f32 ? "fp32" : compute == DType::bf16 ? "bf16" : "fp16";
}

double TimeModel::op_seconds(const OpRecord & op, bool lowp) const {
    const std::string_view n = op.name;
    const double eff = n.starts_with("matmul")            ? (lowp ? lowp_gemm : 1.0)
                       : n.starts_with("flash_attention") ? 0.8
                       : n.starts_with("attention")       ? 0.2
                       : n.starts_with("xent")            ? 0.015
                                                          : 0.15;
    return op_overhead + std::max(op.flops / (flops_rate * eff), op.bytes / byte_rate);
}

double TimeModel::step_seconds(const StepPlans & plans, int grad_accum) const {
    auto seconds = [&](const TrainStep * s) {
        double t = 0;
        if (s)
            for (const OpRecord & op : s->program().ops()) t += op_seconds(op, s->compute() != DType::f32);
        return t;
    };
    return seconds(plans.train.get()) + (grad_accum > 1 ? seconds(plans.first.get()) : 0) +
           (grad_accum > 2 ? double(grad_accum - 2) * seconds(plans.mid.get()) : 0);
}

LoraOptions lora_options(const RunShape & s, const ModelConfig & cfg, DType compute) {
    LoraOptions l;
    const BaseWeights base = parse_base_weights(s.base_weights);
    if (s.lora_rank == 0) {
        if (base != BaseWeights::compute)
            throw ConfigError(fmt::format("--base-weights {} freezes and quantizes the base: it needs --lora-rank "
                                          "(e.g. --lora-rank 8)", s.base_weights));
        return l;
    }
    if (s.lora_rank < 0 || s.lora_rank > cfg.n_embd)
        throw ConfigError(fmt::format("--lora-rank {}: must be between 1 and the model width {}", s.lora_rank,
                                      cfg.n_embd));
    if (!(s.lora_alpha > 0) || !std::isfinite(s.lora_alpha))
        throw ConfigError(fmt::format("--lora-alpha {}: must be positive", s.lora_alpha));
    if (base == BaseWeights::compute && s.base_weights != "compute" && s.precision != "auto" &&
        parse_precision(s.base_weights) != compute)
        throw ConfigError(fmt::format("--base-weights {} keeps the frozen base in the compute precision, which is {}; "
                                      "add --precision {} (or use int8 / nf4)",
                                      s.base_weights, precision_name(compute), s.base_weights));
    l.rank = s.lora_rank;
    l.alpha = s.lora_alpha;
    l.targets = parse_lora_targets(cfg, s.lora_targets);
    l.base = base;
    if (!(s.lora_dropout >= 0 && s.lora_dropout < 1))
        throw ConfigError(fmt::format("--lora-dropout {}: must be in [0, 1)", s.lora_dropout));
    l.dropout = s.lora_dropout;
    if (l.quantized()) make_quant_layout(cfg, l.format());   // nf4 block alignment: a clear error now
    return l;
}

void check_data_parallel_flags(const RunShape & s) {
    if (s.zero < 0 || s.zero > 3)
        throw ConfigError(fmt::format("--zero {}: expected 0 (no sharding), 1 (optimizer states), 2 (+ gradients) or "
                                      "3 (+ parameters)", s.zero));
    if (!(s.bucket_mb >= 0) || !std::isfinite(s.bucket_mb) || s.bucket_mb > 1048576.0)
        throw ConfigError(fmt::format("--bucket-mb {}: expected a size in MiB, 0 or more (0: one bucket per "
                                      "transformer block)", s.bucket_mb));
    if (s.tp < 1 || s.tp > 4096)
        throw ConfigError(fmt::format("--tp {}: expected the number of ranks of a tensor group, 1 or more", s.tp));
    if (s.pp < 1 || s.pp > 4096)
        throw ConfigError(fmt::format("--pp {}: expected the number of pipeline stages, 1 or more", s.pp));
    parse_schedule(s.schedule);
    if ((s.tp > 1 || s.pp > 1) && s.fit == "auto")
        throw ConfigError("--fit auto searches one rank's micro-batch, precision and recomputation; with --tp or --pp "
                          "set them yourself (memfit plan --tp T --pp P shows what fits)");
}

namespace {

std::string describe(const EngineOptions & eo) {
    return fmt::format("micro-batch {} x {} accumulated, {}, {} attention, recompute {}, loss chunk {}", eo.B,
                       eo.grad_accum, precision_name(eo.compute), eo.flash_attention ? "flash" : "naive",
                       eo.recompute.name, eo.loss_chunk == 0 ? std::string("off") : std::to_string(eo.loss_chunk));
}

// `--recompute budget`: the kept bytes the budget leaves over full recomputation, solved
// exactly per layer and unit (model/recompute.h) and confirmed by the planner. The kept-bytes
// model is additive and the placed plan is not quite (full recomputation's own transients, for
// one), so the room is corrected by the planner's over- or undershoot and the solve repeats; the
// least-FLOP plan that fits wins. nullopt: even full recomputation does not fit.
std::optional<RecomputePlan> fit_recompute(EngineOptions eo, const ModelConfig & cfg, const Backend & backend,
                                           uint64_t budget, CategoryBytes * smallest) {
    eo.budget = 0;
    eo.recompute = parse_recompute("none", cfg.n_layer);
    if (StepPlans(cfg, backend, eo).reserved().total() <= budget) return eo.recompute;
    eo.recompute = parse_recompute("full", cfg.n_layer);
    const CategoryBytes r0 = StepPlans(cfg, backend, eo).reserved();
    if (smallest) *smallest = r0;
    if (r0.total() > budget) return std::nullopt;
    RecomputePlan best = eo.recompute;
    double best_flops = 1e300;
    uint64_t room = budget - r0.total();
    for (int i = 0; i < 8; ++i) {
        eo.recompute = recompute_for_budget(cfg, eo.B, eo.T, eo.flash_attention, eo.compute, room);
        const StepPlans plans(cfg, backend, eo);
        const uint64_t need = plans.reserved().total();
        if (need <= budget) {
            const double flops = plans.train->program().phase_flops(Phase::recompute);
            if (flops < best_flops) best = eo.recompute, best_flops = flops;
        }
        if (need == budget) break;
        const uint64_t next = need < budget ? room + (budget - need) : room - std::min(room, need - budget);
        if (next == room) break;
        room = next;
    }
    return best;
}

EngineOptions base_options(const RunShape & s, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                           uint64_t budget) {
    check_data_parallel_flags(s);
    EngineOptions eo;
    eo.data_parallel = s.data_parallel;
    eo.rank = s.rank;
    eo.tensor_parallel = s.tp;
    eo.tp_rank = s.tp_rank;
    eo.sequence_parallel = s.sp;
    eo.pipeline_parallel = s.pp;
    eo.pp_rank = s.pp_rank;
    eo.schedule = parse_schedule(s.schedule, &eo.virtual_stages);
    if (s.pp > 1) check_pipeline(cfg, s.pp, eo.virtual_stages);
    eo.zero = s.zero;
    eo.bucket_bytes = size_t(std::llround(s.bucket_mb * 1048576.0));
    eo.B = s.batch;
    eo.T = s.seq;
    eo.grad_accum = s.grad_accum;
    eo.loss_chunk = s.loss_chunk;
    eo.with_eval = with_eval;
    eo.budget = budget;
    if (s.attention != "auto" && s.attention != "flash" && s.attention != "naive")
        throw ConfigError(fmt::format("--attention '{}': expected auto, flash or naive", s.attention));
    // auto: flash where the backend's kernels take the model's head dimension.
    eo.flash_attention = s.attention == "flash" || (s.attention == "auto" && backend.runs_flash_attention(cfg.head_dim()));
    if (s.precision == "auto" && s.fit != "auto")
        throw ConfigError("--precision auto needs --fit auto (it lets the search choose the precision)");
    eo.compute = s.precision == "auto" ? DType::f32 : parse_precision(s.precision);
    if (s.recompute != "budget") eo.recompute = parse_recompute(s.recompute, cfg.n_layer);
    eo.lora = lora_options(s, cfg, s.precision == "auto" ? DType::f32 : eo.compute);
    eo.seed = s.seed;
    return eo;
}

ResolvedRun fit_auto(const RunShape & s, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                     uint64_t budget) {
    const int G = s.batch * s.grad_accum;   // the global batch the user asked for
    std::vector<DType> precisions = {DType::f32, DType::bf16};
    if (s.precision != "auto") precisions = {parse_precision(s.precision)};
    const TimeModel model;
    struct Found { EngineOptions eo; double seconds = 0; uint64_t bytes = 0; };
    std::optional<Found> best, second;
    std::optional<std::pair<EngineOptions, CategoryBytes>> smallest;
    int tried = 0, fitting = 0;
    auto consider = [&](const EngineOptions & eo, const StepPlans & plans) {
        ++tried;
        const CategoryBytes need = plans.reserved();
        if (!smallest || need.total() < smallest->second.total()) smallest = {eo, need};
        if (need.total() > budget) return;
        ++fitting;
        const Found f{eo, model.step_seconds(plans, eo.grad_accum), need.total()};
        auto better = [](const Found & a, const Found & b) {
            return a.seconds < b.seconds || (a.seconds == b.seconds && a.bytes < b.bytes);
        };
        if (!best || better(f, *best)) {
            second = best;
            best = f;
        } else if (!second || better(f, *second)) {
            second = f;
        }
    };
    const bool flash_runs = backend.runs_flash_attention(cfg.head_dim());
    for (int b = 1; b <= G; ++b) {
        if (G % b) continue;
        for (DType p : precisions)
            for (bool flash : {true, false})
                for (int chunk : {0, std::max(1, b * s.seq / 8)}) {
                    if (chunk > 0 && b * s.seq < 16) continue;
                    if (flash && !flash_runs) continue;
                    EngineOptions eo = base_options(s, cfg, backend, with_eval, budget);
                    eo.B = b;
                    eo.grad_accum = G / b;
                    eo.compute = p;
                    eo.flash_attention = flash;
                    eo.loss_chunk = chunk;
                    bool none_fits = false;
                    for (const char * rc : {"none", "selective", "full"}) {
                        eo.recompute = parse_recompute(rc, cfg.n_layer);
                        const StepPlans plans(cfg, backend, eo);
                        if (rc == std::string("none"))
                            none_fits = plans.reserved().total() <= budget;
                        consider(eo, plans);
                    }
                    if (none_fits) continue;   // the budget solver would keep everything
                    if (auto rc = fit_recompute(eo, cfg, backend, budget, nullptr)) {
                        eo.recompute = *rc;
                        consider(eo, StepPlans(cfg, backend, eo));
                    }
                }
    }
    if (!best) {
        check_budget(smallest->second, budget,
                     fmt::format("even the smallest configuration ({}) does not fit; lower --seq, pick a smaller "
                                 "--model or raise --memory-budget",
                                 describe(smallest->first)));
        MF_ASSERT(false);
    }
    ResolvedRun r;
    r.eo = best->eo;
    r.eo.budget = budget;
    const double tokens = double(G) * s.seq;
    r.notes.push_back(fmt::format("--fit auto chose {}: predicted {:.0f} tokens/s, plan {} of the {} budget",
                                  describe(best->eo), tokens / best->seconds, format_bytes(best->bytes),
                                  format_bytes(budget)));
    r.notes.push_back(fmt::format(
        "  why: the fastest predicted of {} configurations that fit ({} tried, global batch {} kept){}", fitting, tried,
        G,
        second ? fmt::format("; next: {} at {:.0f} tokens/s, {}", describe(second->eo), tokens / second->seconds,
                             format_bytes(second->bytes))
               : ""));
    return r;
}

}  // namespace

ResolvedRun resolve_run(const RunShape & s, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                        uint64_t budget) {
    if (s.fit != "off" && s.fit != "auto") throw ConfigError(fmt::format("--fit '{}': expected off or auto", s.fit));
    if (s.fit == "auto") {
        if (budget == 0) throw ConfigError("--fit auto needs a memory budget");
        return fit_auto(s, cfg, backend, with_eval, budget);
    }
    ResolvedRun r;
    r.eo = base_options(s, cfg, backend, with_eval, budget);
    if (s.attention == "auto" && !r.eo.flash_attention)
        r.notes.push_back(fmt::format("attention: naive ({})", backend.flash_attention_refusal(cfg.head_dim())));
    if (s.recompute == "budget") {
        if (budget == 0) throw ConfigError("--recompute budget needs a memory budget");
        CategoryBytes smallest;
        const auto rc = fit_recompute(r.eo, cfg, backend, budget, &smallest);
        if (!rc)
            check_budget(smallest, budget,
                         "even full recomputation does not fit; lower --batch or --seq, or use --fit auto");
        r.eo.recompute = *rc;
        const double all = layer_keep_cost(cfg, r.eo.B, r.eo.T, r.eo.flash_attention, r.eo.compute, kKeepAll).bytes;
        double kept = 0, flops = 0;
        for (int layer = 0; layer < cfg.n_layer; ++layer) {   // rc->kept: every unit where keep is empty
            const KeepSet k = layer_keep_cost(cfg, r.eo.B, r.eo.T, r.eo.flash_attention, r.eo.compute, rc->kept(layer));
            kept += double(k.bytes);
            flops += k.flops;
        }
        r.notes.push_back(fmt::format(
            "--recompute budget: keeps {} of the {} activations the layers save ({:.0f}%), recomputing {:.3g} GFLOP "
            "per micro-step to fit {}",
            format_bytes(uint64_t(kept)), format_bytes(uint64_t(all * cfg.n_layer)),
            100.0 * kept / (all * cfg.n_layer), flops / 1e9, format_bytes(budget)));
    }
    return r;
}

}  // namespace memfit
