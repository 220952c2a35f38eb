// Plain-text memory tables: the plan before training, plan vs measured after.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "memory/category.h"

namespace memfit {

// One row per category that has bytes: peak live and reserved.
std::string format_plan_table(const CategoryBytes & peak_live, const CategoryBytes & reserved);
// Planned vs measured, both peak live and reserved, plus a total row.
std::string format_plan_vs_measured(const CategoryBytes & plan_live, const CategoryBytes & meas_live,
                                    const CategoryBytes & plan_reserved, const CategoryBytes & meas_reserved);

// A GPU's memory (--device cuda): the plan's reserved bytes plus the runtime (context and
// library handles, measured at start-up), against the bytes used on the device beyond what was
// used before this process started there (cudaMemGetInfo), with the relative difference.
std::string format_device_memory(uint64_t planned_reserved, uint64_t runtime, uint64_t used_delta);

// Peak resident set size of this process so far (bytes).
uint64_t peak_rss_bytes();
// Resident set size now (bytes): /proc/self/statm's resident pages; 0 where unreadable.
uint64_t current_rss_bytes();

// {"parameters": bytes, ..., "total": bytes}
nlohmann::json category_json(const CategoryBytes & b);

}  // namespace memfit
