#include "plan/request_checks.h"

#include <algorithm>
#include <functional>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "model/pipeline.h"
#include "model/tensor_parallel.h"
#include "plan/lora_plan.h"

namespace memfit {

namespace {

std::vector<int> divisors(int n, int cap) {
    std::vector<int> d;
    for (int i = 1; i <= std::min(n, cap); ++i)
        if (n % i == 0) d.push_back(i);
    return d;
}

std::string listed(const std::vector<int> & v) { return fmt::format("{}", fmt::join(v, ", ")); }

// The data-parallel sizes the searched (or fixed) tensor and pipeline sizes leave.
std::vector<int> data_parallel_sizes(const PlanRequest & r) {
    std::set<int> dps;
    const int node = std::max(1, r.hw.per_node);
    for (int tp : r.tp ? std::vector<int>{*r.tp} : divisors(r.gpus, node)) {
        if (r.gpus % tp || r.cfg.n_head % tp || (r.cfg.kv_heads() % tp && tp % r.cfg.kv_heads())) continue;
        for (int pp : r.pp ? std::vector<int>{*r.pp} : divisors(r.gpus / tp, r.cfg.n_layer))
            if ((r.gpus / tp) % pp == 0) dps.insert(r.gpus / (tp * pp));
    }
    return {dps.begin(), dps.end()};
}

void check_sizes(const PlanRequest & r) {
    const RunConfig & run = r.run;
    if (r.gpus < 1 || run.seq < 1 || run.global_batch < 0 || (run.global_batch == 0 && !r.micro_batch))
        throw ConfigError(fmt::format("--gpus {}, --seq {}, --global-batch {}: each must be at least 1", r.gpus, run.seq,
                                      run.global_batch));
    if (r.gpus > kMaxPlannedDevices)
        throw ConfigError(fmt::format("--gpus {}: the planner models at most {} devices (the largest clusters have "
                                      "about 100,000)", r.gpus, kMaxPlannedDevices));
    if (run.seq > r.cfg.max_seq)
        throw ConfigError(fmt::format("--seq {} exceeds the model's {} positions", run.seq, r.cfg.max_seq));
}

// Devices fill whole nodes beyond one (the time model places tp innermost, node by node).
void check_nodes(const PlanRequest & r) {
    const int node = std::max(1, r.hw.per_node);
    if (r.nodes < 1) throw ConfigError(fmt::format("--nodes {}: must be at least 1", r.nodes));
    if (int64_t(r.gpus) > int64_t(r.nodes) * node)
        throw ConfigError(fmt::format("--gpus {} on {} node{} of {} x {}: at most {} devices; use --nodes {}", r.gpus,
                                      r.nodes, r.nodes > 1 ? "s" : "", node, r.hw.name, int64_t(r.nodes) * node,
                                      (int64_t(r.gpus) + node - 1) / node));
    if (r.nodes > 1 && int64_t(r.gpus) != int64_t(r.nodes) * node) {
        const int lo = std::max(1, r.gpus / node) * node, hi = (r.gpus / node + 1) * node;
        throw ConfigError(fmt::format("--gpus {} over {} nodes of {} x {}: a layout past one node uses whole nodes "
                                      "(the rings and groups are placed node by node); use --gpus {} or {} (--nodes {} "
                                      "or {}), or --gpus {} or fewer on one node",
                                      r.gpus, r.nodes, node, r.hw.name, lo, hi, lo / node, hi / node, node));
    }
}

void check_fixed_layout(const PlanRequest & r) {
    const ModelConfig & cfg = r.cfg;
    const int tp = r.tp.value_or(1);
    if (r.tp && r.gpus % tp)
        throw ConfigError(fmt::format("--tp {} does not divide --gpus {}; tensor-parallel sizes that do: {}", tp, r.gpus,
                                      listed(divisors(r.gpus, r.gpus))));
    if (r.tp) {
        ModelConfig sized = cfg;   // tp_local_config says which dimension does not split
        if (sized.vocab_size == 0) sized.vocab_size = tp;
        tp_local_config(sized, tp);
    }
    if (r.pp) {
        const int left = r.gpus / tp;
        if (left % *r.pp)
            throw ConfigError(fmt::format("--pp {} does not divide the {} devices per tensor group ({} / tp {}); "
                                          "pipeline sizes that do: {}", *r.pp, left, r.gpus, tp,
                                          listed(divisors(left, cfg.n_layer))));
        check_pipeline(cfg, *r.pp, r.schedule == PipeSchedule::interleaved ? r.virtual_stages : 1);
    }
}

// micro-batch x accumulation x dp = global batch, for some layout's dp.
void check_batch(const PlanRequest & r) {
    const int gb = r.run.global_batch;
    if (gb == 0) return;   // per layout: micro-batch x accumulation x dp
    const std::vector<int> dps = data_parallel_sizes(r);
    if (r.micro_batch && r.grad_accum) {
        const int64_t per_rank = int64_t(*r.micro_batch) * *r.grad_accum;
        if (gb % per_rank)
            throw ConfigError(fmt::format("--micro-batch {} x --grad-accum {} = {} sequences per data-parallel rank do "
                                          "not divide --global-batch {} (global batch = micro-batch x accumulation x "
                                          "data-parallel ranks); drop one of the three, or use --global-batch {}",
                                          *r.micro_batch, *r.grad_accum, per_rank, gb, per_rank * dps.front()));
        const int64_t dp = gb / per_rank;
        if (std::find(dps.begin(), dps.end(), dp) == dps.end())
            throw ConfigError(fmt::format("--global-batch {} / (--micro-batch {} x --grad-accum {}) = {} data-parallel "
                                          "ranks, but the layouts of {} devices have {}; drop one of the three batch "
                                          "flags, or use --global-batch {}",
                                          gb, *r.micro_batch, *r.grad_accum, dp, r.gpus, listed(dps),
                                          per_rank * dps.front()));
    }
    for (const auto & [flag, v] : {std::pair{"--micro-batch", r.micro_batch}, std::pair{"--grad-accum", r.grad_accum}}) {
        if (!v) continue;
        const bool some = std::any_of(dps.begin(), dps.end(), [&](int dp) { return gb % dp == 0 && (gb / dp) % *v == 0; });
        if (!some)
            throw ConfigError(fmt::format("{} {} divides no layout's per-rank batch: --global-batch {} over the "
                                          "data-parallel sizes {} of {} devices; use a --global-batch that {} x one "
                                          "of them divides (e.g. {})",
                                          flag, *v, gb, listed(dps), r.gpus, *v, int64_t(*v) * dps.front()));
    }
}

}  // namespace

void check_request(const PlanRequest & r) {
    check_sizes(r);
    check_nodes(r);
    check_fixed_layout(r);
    check_batch(r);
}

std::string no_layout_message(const PlanRequest & r) {
    const std::vector<int> dps = data_parallel_sizes(r);
    if (dps.empty())
        return fmt::format("no tensor-parallel size of {} devices splits {}'s {} heads ({} KV heads); pick --gpus "
                           "or --tp to match", r.gpus, r.cfg.name, r.cfg.n_head, r.cfg.kv_heads());
    return fmt::format("no layout of {} devices divides the global batch of {}: the data-parallel sizes are {}; use "
                       "a --global-batch one of them divides (e.g. {})",
                       r.gpus, r.run.global_batch, listed(dps), dps.front());
}

namespace {

// One change to a request that found nothing: what to tell the user, and the change.
struct Change {
    std::string what;
    std::function<void(PlanRequest &)> apply;
};

std::vector<Change> changes(const PlanRequest & r) {
    std::vector<Change> out;
    auto drop = [&](bool fixed, std::string what, std::function<void(PlanRequest &)> f) {
        if (fixed) out.push_back({std::move(what), std::move(f)});
    };
    drop(r.micro_batch && *r.micro_batch > 1 && r.run.global_batch > 0,
         fmt::format("dropping --micro-batch {} (searched down to 1)", r.micro_batch.value_or(0)),
         [](PlanRequest & q) { q.micro_batch.reset(), q.grad_accum.reset(); });
    drop(r.recompute && *r.recompute != "full", fmt::format("dropping --recompute {}", r.recompute.value_or("")),
         [](PlanRequest & q) { q.recompute.reset(); });
    drop(r.offload.has_value(), fmt::format("dropping --offload {}", offload_name(r.offload.value_or(Offload::none))),
         [](PlanRequest & q) { q.offload.reset(); });
    drop(r.zero.has_value(), fmt::format("dropping --zero {}", r.zero.value_or(0)), [](PlanRequest & q) { q.zero.reset(); });
    drop(r.offload_acts == false && r.hw.name != "cpu", "offloading the activations too",
         [](PlanRequest & q) { q.offload_acts = true; });
    drop(r.tp || r.pp || r.sp || r.schedule, "dropping the fixed --tp / --pp / --sp / --schedule",
         [](PlanRequest & q) { q.tp.reset(), q.pp.reset(), q.sp.reset(), q.schedule.reset(); });
    drop(r.flash && !*r.flash, "dropping --attention naive", [](PlanRequest & q) { q.flash.reset(); });
    drop(r.run.loss_chunk == 0, "--loss-chunk auto", [](PlanRequest & q) { q.run.loss_chunk = -1; });
    drop(r.lora && !r.lora->quantized(), "--base-weights nf4 (QLoRA)", [](PlanRequest & q) {
        LoraOptions o = q.lora->opts;
        o.base = BaseWeights::nf4;
        q.lora = make_lora_plan(q.cfg, o);
        q.run.lora.base_weights = "nf4";
    });
    return out;
}

}  // namespace

std::string nothing_fits_hint(const PlanRequest & r, const SearchReport & rep) {
    for (const Change & ch : changes(r)) {
        PlanRequest q = r;
        try {
            ch.apply(q);
        } catch (const ConfigError &) {
            continue;   // e.g. nf4's block alignment on this model
        }
        q.top = 1, q.explain = false, q.hint = false;
        try {
            const SearchReport s = search_plans(q);
            if (!s.best.empty())
                return fmt::format("{} fits: {} | {}, {} per device", ch.what, layout_name(s.best[0].c.layout),
                                   technique_name(s.best[0].c), format_bytes(s.best[0].mem.total()));
        } catch (const ConfigError &) {
        }
    }
    if (!rep.plan_only_best.empty()) {
        const PlanResult & p = rep.plan_only_best.front();
        return fmt::format("{} layout{} fit that memfit train does not run yet, the fastest {} ({}: {}); "
                           "--include-plan-only lists them",
                           rep.plan_only, rep.plan_only > 1 ? "s" : "", layout_name(p.c.layout),
                           format_bytes(p.mem.total()), p.refused);
    }
    return fmt::format("nothing this request leaves open fits on {} x {}: more devices (--min-gpus finds how many), "
                       "a shorter --seq, {}",
                       r.gpus, r.hw.name,
                       !r.lora ? "or LoRA / QLoRA (--lora-rank 16 --base-weights nf4)"
                               : "or a smaller --lora-rank or fewer --lora-targets");
}

}  // namespace memfit
