#include "report/chrome_trace.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "memory/program.h"

namespace memfit {
namespace {

using nlohmann::json;

constexpr int    kPid = 1;
constexpr int    kTid = 1;
constexpr double kMinDurUs = 0.001;  // zero-length X events vanish in some viewers
constexpr double kMaxShiftUs = 60e6;  // ranks' origins further apart: clocks of different hosts

json category_object(const CategoryBytes & b, bool keep_zero) {
    json o = json::object();
    for (size_t c = 0; c < kCategoryCount; ++c) {
        if (b.v[c] != 0 || keep_zero) o[std::string(kCategoryNames[c])] = b.v[c];
    }
    o["total"] = b.total();
    return o;
}

// Index in tl.events of the failed op's event (the last one), -1 when none failed.
int failed_event(const Timeline & tl) {
    if (tl.failed_op < 0) return -1;
    for (size_t i = tl.events.size(); i-- > 0;)
        if (tl.events[i].op == tl.failed_op) return int(i);
    return -1;
}

// One process's events: its name and thread, an "X" per op and the "memory" / "memory.total"
// counters per op, from `tl`, every time shifted by `shift_us`.
void append_process(json & trace, int pid, const std::string & name, const Timeline & tl, double shift_us) {
    trace.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", kTid}, {"args", {{"name", name}}}});
    trace.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", kTid}, {"args", {{"name", "ops"}}}});

    // Categories that hold bytes at some op: every counter sample carries all of them (zero
    // included), so each stacked series is continuous across the step.
    std::array<bool, kCategoryCount> used{};
    for (const auto & e : tl.events) {
        for (size_t c = 0; c < kCategoryCount; ++c) used[c] = used[c] || e.live.v[c] != 0;
    }

    for (const auto & e : tl.events) {
        const char * op_name = e.name ? e.name : "";
        const char * phase = phase_name(e.phase);
        const uint64_t total = e.live.total();
        const double ts = e.begin_us + shift_us;
        trace.push_back({{"ph", "X"}, {"name", op_name}, {"cat", phase}, {"ts", ts},
                         {"dur", std::max(e.end_us - e.begin_us, kMinDurUs)}, {"pid", pid}, {"tid", kTid},
                         {"args", {{"op", e.op}, {"layer", e.layer}, {"phase", phase}, {"live_total", total}}}});
        json per_category = json::object();
        for (size_t c = 0; c < kCategoryCount; ++c) {
            if (used[c]) per_category[std::string(kCategoryNames[c])] = e.live.v[c];
        }
        trace.push_back({{"ph", "C"}, {"name", "memory"}, {"ts", ts}, {"pid", pid}, {"tid", kTid},
                         {"args", std::move(per_category)}});
        trace.push_back({{"ph", "C"}, {"name", "memory.total"}, {"ts", ts}, {"pid", pid}, {"tid", kTid},
                         {"args", {{"total", total}}}});
    }
}

// A global instant event at `e` (rank 0's process).
json instant(const std::string & name, const TimelineEvent & e, int pid) {
    return {{"ph", "i"}, {"s", "g"}, {"name", name}, {"ts", e.begin_us}, {"pid", pid}, {"tid", kTid},
            {"args", {{"op", e.op}, {"name", e.name ? e.name : ""}, {"live", category_object(e.live, false)}}}};
}

}  // namespace

json chrome_trace(const ReportData & r) {
    json trace = json::array();
    json ranks = json::array();
    int pid0 = kPid;   // the process holding r.timeline (rank 0's)
    if (r.ranks.size() > 1) {
        // Rank 0's timeline is r.timeline when it was not gathered into ranks[0] as well.
        auto timeline_of = [&r](size_t k) -> const Timeline & {
            return k == 0 && r.ranks[0].timeline.events.empty() ? r.timeline : r.ranks[k].timeline;
        };
        pid0 = r.ranks[0].rank + 1;
        for (size_t k = 0; k < r.ranks.size(); ++k) {
            const RankView & rv = r.ranks[k];
            const Timeline & tl = timeline_of(k);
            // Steady clocks agree on one host: line the ranks up on rank 0's origin. A larger
            // difference than a minute is another host's clock: no shift.
            double shift_us = (tl.origin_s - timeline_of(0).origin_s) * 1e6;
            if (!(std::abs(shift_us) <= kMaxShiftUs)) shift_us = 0;
            append_process(trace, rv.rank + 1, rv.label.empty() ? fmt::format("rank {}", rv.rank) : rv.label, tl,
                           shift_us);
            ranks.push_back({{"rank", rv.rank}, {"label", rv.label}, {"pid", rv.rank + 1}, {"shift_us", shift_us},
                             {"planned_peak", category_object(rv.planned_peak, true)},
                             {"measured_peak", category_object(rv.measured_peak, true)}, {"peak_rss", rv.peak_rss}});
        }
    } else {
        append_process(trace, kPid, "memfit step", r.timeline, 0);
    }

    const int peak = peak_event(r);
    if (peak >= 0) {
        const auto & e = r.timeline.events[size_t(peak)];
        trace.push_back(instant(fmt::format("peak {}", format_bytes(e.live.total())), e, pid0));
    }
    if (const int f = failed_event(r.timeline); !r.failure.empty() && f >= 0)
        trace.push_back(instant("out of memory: " + r.failure, r.timeline.events[size_t(f)], pid0));

    json other = json::object();
    other["title"] = r.title;
    other["program"] = r.timeline.program;
    other["num_ops"] = r.num_ops;
    other["peak_op"] = r.peak_op;
    other["budget"] = r.budget;
    other["peak_rss"] = r.peak_rss;
    other["planned_peak"] = category_object(r.planned_peak, true);
    other["measured_peak"] = category_object(r.measured_peak, true);
    other["planned_reserved"] = category_object(r.planned_reserved, true);
    other["measured_reserved"] = category_object(r.measured_reserved, true);
    other["config"] = r.config.is_null() ? json::object() : r.config;
    if (!ranks.empty()) other["ranks"] = std::move(ranks);
    if (!r.failure.empty()) {
        other["failure"] = r.failure;
        other["failed_op"] = r.timeline.failed_op;
    }

    return json{{"traceEvents", std::move(trace)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

void write_chrome_trace(const std::string & path, const ReportData & r) {
    // Replace invalid UTF-8 (e.g. in a config string) rather than throwing halfway through.
    const std::string text = chrome_trace(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    write_file_atomic(path, text + '\n');
}

}  // namespace memfit
