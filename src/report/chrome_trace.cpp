#include "report/chrome_trace.h"

#include <algorithm>
#include <array>
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

json category_object(const CategoryBytes & b, bool keep_zero) {
    json o = json::object();
    for (size_t c = 0; c < kCategoryCount; ++c) {
        if (b.v[c] != 0 || keep_zero) o[std::string(kCategoryNames[c])] = b.v[c];
    }
    o["total"] = b.total();
    return o;
}

}  // namespace

json chrome_trace(const ReportData & r) {
    const auto & events = r.timeline.events;
    json trace = json::array();

    trace.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", kPid}, {"tid", kTid},
                     {"args", {{"name", "memfit step"}}}});
    trace.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", kPid}, {"tid", kTid},
                     {"args", {{"name", "ops"}}}});

    // Categories that hold bytes at some op: every counter sample carries all of them (zero
    // included), so each stacked series is continuous across the step.
    std::array<bool, kCategoryCount> used{};
    for (const auto & e : events) {
        for (size_t c = 0; c < kCategoryCount; ++c) used[c] = used[c] || e.live.v[c] != 0;
    }

    for (const auto & e : events) {
        const char * name = e.name ? e.name : "";
        const char * phase = phase_name(e.phase);
        const uint64_t total = e.live.total();
        trace.push_back({{"ph", "X"}, {"name", name}, {"cat", phase}, {"ts", e.begin_us},
                         {"dur", std::max(e.end_us - e.begin_us, kMinDurUs)}, {"pid", kPid}, {"tid", kTid},
                         {"args", {{"op", e.op}, {"layer", e.layer}, {"phase", phase}, {"live_total", total}}}});
        json per_category = json::object();
        for (size_t c = 0; c < kCategoryCount; ++c) {
            if (used[c]) per_category[std::string(kCategoryNames[c])] = e.live.v[c];
        }
        trace.push_back({{"ph", "C"}, {"name", "memory"}, {"ts", e.begin_us}, {"pid", kPid}, {"tid", kTid},
                         {"args", std::move(per_category)}});
        trace.push_back({{"ph", "C"}, {"name", "memory.total"}, {"ts", e.begin_us}, {"pid", kPid}, {"tid", kTid},
                         {"args", {{"total", total}}}});
    }

    const int peak = peak_event(r);
    if (peak >= 0) {
        const auto & e = events[size_t(peak)];
        const uint64_t total = e.live.total();
        trace.push_back({{"ph", "i"}, {"s", "g"}, {"name", fmt::format("peak {}", format_bytes(total))}, {"ts", e.begin_us},
                         {"pid", kPid}, {"tid", kTid},
                         {"args", {{"op", e.op}, {"name", e.name ? e.name : ""}, {"live", category_object(e.live, false)}}}});
    }

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

    return json{{"traceEvents", std::move(trace)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

void write_chrome_trace(const std::string & path, const ReportData & r) {
    // Replace invalid UTF-8 (e.g. in a config string) rather than throwing halfway through.
    const std::string text = chrome_trace(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    write_file_atomic(path, text + '\n');
}

}  // namespace memfit
