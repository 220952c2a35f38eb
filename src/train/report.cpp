#include "train/report.h"

#include <algorithm>

#include <fmt/format.h>

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
    for (size_t c = 1; c < kCategoryCount; ++c)
        if (live_at_peak[c] > live_at_peak[top]) top = c;
    const auto & peak_op = step.program().ops()[size_t(plan.peak_op)];
    hints.push_back(fmt::format("{} are {:.0f}% of the {} peak, reached at op {} ({}{}, {}).", kCategoryNames[top],
                                100.0 * double(live_at_peak[top]) / double(total), format_bytes(total), plan.peak_op,
                                peak_op.name, peak_op.layer >= 0 ? fmt::format(", layer {}", peak_op.layer) : "",
                                phase_name(peak_op.phase)));

    // Halving the batch, re-planned exactly.
    if (step.B() > 1) {
        const int half = step.B() / 2;
        TrainStep smaller(step.config(), half, step.T(), StepMode::train, &engine.backend(),
                          engine.options().model());
        const MemoryPlan p2 = plan_memory(smaller.program());
        hints.push_back(fmt::format("--batch {} instead of {} would lower the planned peak from {} to {} "
                                    "(activations {} -> {}); accumulating two micro-batches would keep the global batch.",
                                    half, step.B(), format_bytes(total), format_bytes(p2.peak_live_total),
                                    format_bytes(plan.peak_live[Category::activations]),
                                    format_bytes(p2.peak_live[Category::activations])));
    }

    // Saved attention probabilities and the logits.
    uint64_t probs = 0, logits = 0;
    for (const auto & b : at_peak) {
        if (b.name.ends_with("attn.probs")) probs += b.bytes;
        if (b.name == "logits") logits += b.bytes;
    }
    if (probs > 0)
        hints.push_back(fmt::format("saved attention probabilities (B*NH*T*T floats per layer) are {} ({:.0f}% of the "
                                    "peak); a tiled attention that keeps one log-sum-exp per query would not store them.",
                                    format_bytes(probs), 100.0 * double(probs) / double(total)));
    if (logits > 0)
        hints.push_back(fmt::format("the logits (B*T*V floats) are {} at the peak ({:.0f}%); an LM head computed in "
                                    "chunks of tokens would never hold them whole.",
                                    format_bytes(logits), 100.0 * double(logits) / double(total)));
    const uint64_t opt = plan.peak_live[Category::optimizer_states];
    if (opt > 0)
        hints.push_back(fmt::format("AdamW moments take {} (2 x 4 bytes per parameter, {:.0f}% of the peak); "
                                    "sharding them over data-parallel ranks (ZeRO-1) divides them by the rank count.",
                                    format_bytes(opt), 100.0 * double(opt) / double(total)));
    return hints;
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

    std::vector<ReportBuffer> all;
    for (const auto & b : p.buffers()) {
        if (!b.persistent && b.first_op < 0) continue;
        all.push_back(to_report(b, r.num_ops));
    }
    auto by_size = [](const ReportBuffer & a, const ReportBuffer & b) {
        return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
    };
    for (const auto & b : all)
        if (b.first_op <= r.peak_op && r.peak_op <= b.last_op && b.bytes > 0) r.live_at_peak.push_back(b);
    std::sort(r.live_at_peak.begin(), r.live_at_peak.end(), by_size);
    r.largest = all;
    std::sort(r.largest.begin(), r.largest.end(), by_size);
    if (r.largest.size() > 10) r.largest.resize(10);
    r.hints = make_hints(engine, r.live_at_peak);
    return r;
}

}  // namespace memfit
