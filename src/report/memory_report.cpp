#include "report/memory_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "core/units.h"

namespace memfit {

std::string format_plan_table(const CategoryBytes & peak_live, const CategoryBytes & reserved) {
    std::string s = fmt::format("  {:<18} {:>14} {:>14}\n", "category", "peak live", "reserved");
    auto row = [&](std::string_view name, uint64_t a, uint64_t b) {
        s += fmt::format("  {:<18} {:>14} {:>14}\n", name, format_bytes(a), format_bytes(b));
    };
    const size_t off = size_t(Category::offloaded);
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (c != off && (peak_live.v[c] != 0 || reserved.v[c] != 0)) row(kCategoryNames[c], peak_live.v[c], reserved.v[c]);
    row("total", peak_live.total(), reserved.total());
    // Off the device, after the device's total (which leaves them out).
    if (peak_live.v[off] != 0 || reserved.v[off] != 0) row("+ offloaded", peak_live.v[off], reserved.v[off]);
    return s;
}

std::string format_plan_vs_measured(const CategoryBytes & plan_live, const CategoryBytes & meas_live,
                                    const CategoryBytes & plan_reserved, const CategoryBytes & meas_reserved) {
    std::string s = fmt::format("  {:<18} {:>14} {:>14} {:>14} {:>14}\n", "category", "planned peak", "measured peak",
                                "planned rsv", "measured rsv");
    auto row = [&](std::string_view name, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
        s += fmt::format("  {:<18} {:>14} {:>14} {:>14} {:>14}{}\n", name, format_bytes(a), format_bytes(b),
                         format_bytes(c), format_bytes(d), (a == b && c == d) ? "" : "  <- differs");
    };
    const size_t off = size_t(Category::offloaded);
    auto any = [&](size_t c) {
        return plan_live.v[c] != 0 || meas_live.v[c] != 0 || plan_reserved.v[c] != 0 || meas_reserved.v[c] != 0;
    };
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (c != off && any(c)) row(kCategoryNames[c], plan_live.v[c], meas_live.v[c], plan_reserved.v[c], meas_reserved.v[c]);
    row("total (sum)", plan_live.total(), meas_live.total(), plan_reserved.total(), meas_reserved.total());
    // Off the device (pinned host memory or --offload-dir's files), after the device's total.
    if (any(off)) row("+ offloaded", plan_live.v[off], meas_live.v[off], plan_reserved.v[off], meas_reserved.v[off]);
    return s;
}

uint64_t peak_rss_bytes() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return uint64_t(ru.ru_maxrss) * 1024;
}

uint64_t current_rss_bytes() {
    std::FILE * f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, resident = 0;
    const int n = std::fscanf(f, "%llu %llu", &size, &resident);
    std::fclose(f);
    return n == 2 ? uint64_t(resident) * uint64_t(::sysconf(_SC_PAGESIZE)) : 0;
}

nlohmann::json category_json(const CategoryBytes & b) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t c = 0; c < kCategoryCount; ++c) j[std::string(kCategoryNames[c])] = b.v[c];
    j["total"] = b.total();
    return j;
}

std::string format_device_memory(uint64_t planned_reserved, uint64_t runtime, uint64_t used_delta) {
    const uint64_t predicted = planned_reserved + runtime;
    const double diff = used_delta ? 100.0 * (double(predicted) - double(used_delta)) / double(used_delta) : 0.0;
    return fmt::format("  device memory: planned reserved {} + runtime {} (context, cuBLASLt; measured at start-up) = "
                       "{} predicted; used on the device by this process {} (cudaMemGetInfo); prediction off by {:+.2f}%",
                       format_bytes(planned_reserved), format_bytes(runtime), format_bytes(predicted),
                       format_bytes(used_delta), diff);
}

}  // namespace memfit
