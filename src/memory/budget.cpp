#include "memory/budget.h"

#include <fstream>
#include <string>

#include "core/units.h"

namespace memfit {

void check_budget(const CategoryBytes & need, uint64_t budget, const std::string & hint) {
    const uint64_t total = need.total();
    if (total <= budget) return;
    std::string split;
    for (int c = 0; c < kCategoryCount; ++c) {
        const uint64_t b = need.v[size_t(c)];
        if (b == 0) continue;
        if (!split.empty()) split += ", ";
        split += std::string(kCategoryNames[size_t(c)]) + " " + format_bytes(b);
    }
    throw OutOfMemory("does not fit: the plan needs " + format_bytes(total) + " but the budget is " +
                      format_bytes(budget) + " (short by " + format_bytes(total - budget) + "; " + split +
                      "); hint: " + hint);
}

uint64_t available_memory() {
    uint64_t avail = 0;
    std::ifstream mi("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (mi >> key >> kb) {
        std::getline(mi, unit);
        if (key == "MemAvailable:") { avail = kb * 1024; break; }
    }
    std::ifstream cg("/sys/fs/cgroup/memory.max");
    std::string lim;
    if (cg >> lim && lim != "max") {
        const uint64_t l = std::stoull(lim);
        if (avail == 0 || l < avail) avail = l;
    }
    return avail;
}

}  // namespace memfit
