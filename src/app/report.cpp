#include "app/report.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "report/memory_report.h"

namespace memfit {

namespace {

ReportBuffer to_report(const BufferDecl & b, int num_ops) {
    ReportBuffer r;
    r.name = b.name;
    r.category = b.category;
    r.bytes = b.bytes;
    r.persistent = b.persistent;
    r.first_op = b.persistent ? 0 : b.first_op;
    r.last_op = b.persistent ? num_ops - 1 : b.last_op;
    return r;
}

// Sentences about where the bytes go, each with numbers the planner computed.
std::vector<std::string> make_hints(const Engine & engine, const std::vector<ReportBuffer> & at_peak) {
    std::vector<std::string> hints;
    const MemoryPlan & plan = engine.plan();
    const TrainStep & step = engine.step();
    const uint64_t total = plan.peak_live_total;
    if (total == 0) return hints;

    // The category that dominates the peak.
    uint64_t live_at_peak[kCategoryCount] = {};
    for (const auto & b : at_peak) live_at_peak[size_t(b.category)] += b.bytes;
    size_t top = 0;
    for (size_t c = 1; c < kCategoryCount; ++c)   // of the device's (offloaded bytes are not in its peak)
        if (c != size_t(Category::offloaded) && live_at_peak[c] > live_at_peak[top]) top = c;
    const auto & peak_op = step.program().ops()[size_t(plan.peak_op)];
    hints.push_back(fmt::format("{} are {:.0f}% of the {} peak, reached at op {} ({}{}, {}).", kCategoryNames[top],
                                100.0 * double(live_at_peak[top]) / double(total), format_bytes(total), plan.peak_op,
                                peak_op.name, peak_op.layer >= 0 ? fmt::format(", layer {}", peak_op.layer) : "",
                                phase_name(peak_op.phase)));

    // Alternatives, each re-planned exactly: same model and batch, one option changed; listed by
    // the bytes they save, most first.
    const EngineOptions & eo = engine.options();
    const double flops = step.program().total_flops();
    std::vector<std::pair<uint64_t, std::string>> saving;
    auto replan = [&](const std::string & flag, int B, const ModelOptions & mo, const std::string & why) {
        // The whole model's config: the step's is this rank's tensor slice, which the options split again.
        std::unique_ptr<TrainStep> alt;
        try {
            alt = std::make_unique<TrainStep>(engine.config(), B, step.T(), StepMode::train, &engine.backend(), mo,
                                              StepParts{true, true, eo.data_parallel > 1 || eo.zero > 0}, eo.dp(),
                                              eo.pp(step.micro_batches()));
        } catch (const ConfigError &) {
            return;   // not a configuration this layout can run (sequence parallel rows, say)
        }
        const MemoryPlan p2 = plan_memory(alt->program());
        if (double(p2.peak_live_total) > 0.99 * double(total)) return;   // under 1%: not worth a line
        const double extra = alt->program().total_flops() / flops - 1.0;
        saving.emplace_back(total - p2.peak_live_total,
                            fmt::format("{} would lower the planned peak from {} to {} (-{:.0f}%){}{}.", flag,
                                        format_bytes(total), format_bytes(p2.peak_live_total),
                                        100.0 * double(total - p2.peak_live_total) / double(total),
                                        extra > 0.005 ? fmt::format(" for {:.0f}% more compute", 100.0 * extra) : "",
                                        why));
    };
    if (eo.compute == DType::f32) {
        ModelOptions mo = eo.model();
        mo.compute = mo.grad = DType::bf16;
        replan("--precision bf16", step.B(), mo,
               ": weights, gradients and activations in 16 bits, with fp32 master weights and moments");
    }
    if (!eo.flash_attention && engine.backend().runs_flash_attention(engine.config().head_dim())) {
        ModelOptions mo = eo.model();
        mo.flash_attention = true;
        replan("--attention flash", step.B(), mo, ": it keeps one log-sum-exp per query instead of the T x T probabilities");
    }
    const int BT = step.B() * step.T();
    if (eo.loss_chunk == 0 && BT >= 16) {
        ModelOptions mo = eo.model();
        mo.loss_chunk = BT / 8;
        replan(fmt::format("--loss-chunk {}", BT / 8), step.B(), mo, ": the B*T*V logits are never stored whole");
    }
    const int L = step.config().n_layer;
    if (!eo.recompute.recomputes()) {
        ModelOptions mo = eo.model();
        mo.recompute = parse_recompute("selective", L);
        replan("--recompute selective", step.B(), mo,
               fmt::format(": norm outputs, {} outputs and attention probabilities are recomputed, matmul outputs kept",
                           !step.config().llama() ? "GELU" : step.config().glu == Glu::gelu_tanh ? "GeGLU" : "SwiGLU"));
    }
    if (eo.recompute.name != "full" && L > 1) {
        ModelOptions mo = eo.model();
        mo.recompute = parse_recompute("full", L);
        replan("--recompute full", step.B(), mo, ": only each layer's input is kept for backward");
    }
    if (eo.distill.enabled() && !eo.distill.quantized()) {
        ModelOptions mo = eo.model();
        mo.distill.weights = BaseWeights::nf4;
        replan("--teacher-weights nf4", step.B(), mo,
               ": the teacher's block projections in 4 bits, as a QLoRA base (it only runs forward)");
    }
    if (eo.lora.enabled() && !eo.lora.quantized()) {
        ModelOptions mo = eo.model();
        mo.lora.base = BaseWeights::nf4;
        replan("--base-weights nf4", step.B(), mo, ": the frozen base's block projections in 4 bits (QLoRA)");
    }
    if (eo.pref.copy()) {
        ModelOptions mo = eo.model();
        mo.pref.reference = Reference::precompute;
        replan("--reference precompute", step.B(), mo,
               ": the reference's log-probabilities computed once before training instead of a frozen copy");
    }
    // Preference pairs stay whole: no odd micro-batch.
    if (step.B() > 1 && !(eo.pref.enabled() && step.B() / 2 % 2))
        replan(fmt::format("--micro-batch {}", step.B() / 2), step.B() / 2, eo.model(),
               " (the global batch halves unless two micro-batches are accumulated)");
    std::stable_sort(saving.begin(), saving.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
    for (auto & [bytes, text] : saving) hints.push_back(std::move(text));

    // Sharding or offloading the optimizer states: only where they are a part of the peak worth it.
    const uint64_t opt = plan.peak_live[Category::optimizer_states];
    if (opt > 0 && eo.zero == 0 && eo.offload == 0 && double(opt) >= 0.05 * double(total))
        hints.push_back(fmt::format("the optimizer states take {} ({:.2f} bytes per parameter, {:.0f}% of the peak); "
                                    "sharding them over data-parallel ranks (mpirun -np N ... --zero 1) divides them "
                                    "by the rank count, and --offload optimizer moves them off the device.",
                                    format_bytes(opt), double(opt) / double(std::max<size_t>(1, step.layout().total)),
                                    100.0 * double(opt) / double(total)));
    else if (eo.zero < 3 && eo.data_parallel > 1)
        hints.push_back(fmt::format("--zero {} would also shard the {} over the {} ranks.", eo.zero + 1,
                                    eo.zero == 1 ? "gradients" : "parameters", eo.data_parallel));
    return hints;
}

bool by_size(const ReportBuffer & a, const ReportBuffer & b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
}

// The buffers of the device live at op `op`, largest first.
std::vector<ReportBuffer> live_at(const std::vector<ReportBuffer> & all, int op) {
    std::vector<ReportBuffer> live;
    for (const auto & b : all)
        if (b.first_op <= op && op <= b.last_op && b.bytes > 0 && b.category != Category::offloaded) live.push_back(b);
    std::sort(live.begin(), live.end(), by_size);
    return live;
}

std::vector<ReportBuffer> report_buffers(const Program & p) {
    std::vector<ReportBuffer> all;
    for (const auto & b : p.buffers()) {
        if (!b.persistent && b.first_op < 0) continue;
        all.push_back(to_report(b, p.num_ops()));
    }
    return all;
}

}  // namespace

ReportData build_report(const Engine & engine, const Timeline & timeline, const std::string & title,
                        const nlohmann::json & config, uint64_t budget) {
    ReportData r;
    const Program & p = engine.step().program();
    const MemoryPlan & plan = engine.plan();
    r.title = title;
    r.config = config;
    r.timeline = timeline;
    r.num_ops = p.num_ops();
    r.planned_peak = engine.planned_peak_live();
    r.planned_reserved = engine.planned_reserved();
    r.measured_peak = engine.ledger().live_peak();
    r.measured_reserved = engine.ledger().reserved_peak();
    r.budget = budget;
    r.peak_rss = peak_rss_bytes();
    r.peak_op = plan.peak_op;

    const std::vector<ReportBuffer> all = report_buffers(p);
    r.live_at_peak = live_at(all, r.peak_op);
    r.largest = all;
    std::sort(r.largest.begin(), r.largest.end(), by_size);
    if (r.largest.size() > 10) r.largest.resize(10);
    r.hints = make_hints(engine, r.live_at_peak);
    return r;
}

ReportData build_failure_report(const Engine & engine, const Timeline & timeline, const std::string & title,
                                const nlohmann::json & config, uint64_t budget, const std::string & failure) {
    ReportData r = build_report(engine, timeline, title, config, budget);
    r.failure = failure;
    if (timeline.failed_op >= 0) {
        r.peak_op = timeline.failed_op;
        r.live_at_peak = live_at(report_buffers(engine.step().program()), r.peak_op);
    }
    return r;
}

// The plan's own picture of its step: op i's event holds the bytes the plan has live there,
// over [i, i + 1) microseconds (a plan has no times).
Timeline planned_timeline(const Program & p) {
    Timeline t;
    t.program = "train (planned)";
    CategoryBytes live;
    for (const auto & b : p.buffers())
        if (b.persistent) live[b.category] += b.bytes;
    for (int i = 0; i < p.num_ops(); ++i) {
        for (BufferId id : p.starts_at(i))
            if (!p.buffer(id).persistent) live[p.buffer(id).category] += p.buffer(id).bytes;
        const auto & op = p.ops()[size_t(i)];
        TimelineEvent e;
        e.op = i;
        e.name = op.name;
        e.phase = op.phase;
        e.layer = op.layer;
        e.live = live;
        e.begin_us = i;
        e.end_us = i + 1;
        t.events.push_back(e);
        for (BufferId id : p.ends_at(i))
            if (!p.buffer(id).persistent) live[p.buffer(id).category] -= p.buffer(id).bytes;
    }
    return t;
}

ReportData build_refused_plan_report(const StepPlans & plans, const std::string & title, const nlohmann::json & config,
                                     uint64_t budget, const std::string & failure) {
    const Program & p = plans.train->program();
    ReportData r;
    r.title = title;
    r.config = config;
    r.timeline = planned_timeline(p);
    r.num_ops = p.num_ops();
    r.planned_peak = plans.peak_live();
    r.planned_reserved = plans.reserved();
    r.budget = budget;
    r.peak_rss = peak_rss_bytes();
    r.failure = failure;
    // Where the step would stop: the first op whose live bytes pass the budget, else (the
    // regions, with their alignment, are what passed it) the plan's peak.
    r.peak_op = plans.train_plan.peak_op;
    for (const auto & e : r.timeline.events)
        if (budget > 0 && e.live.total() > budget) {
            r.peak_op = e.op;
            break;
        }
    r.timeline.events.resize(size_t(r.peak_op) + 1);
    r.timeline.failed_op = r.peak_op;
    const std::vector<ReportBuffer> all = report_buffers(p);
    r.live_at_peak = live_at(all, r.peak_op);
    r.largest = all;
    std::sort(r.largest.begin(), r.largest.end(), by_size);
    if (r.largest.size() > 10) r.largest.resize(10);
    return r;
}

}  // namespace memfit
