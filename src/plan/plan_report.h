// What `memfit plan` prints: the ranked table (layout, micro-batch x accumulation, per-device
// memory by category as a bar, step time, tokens/s, MFU), the rejected candidates with what
// would make them fit (--explain), and the same as JSON (--json; docs/planner.md documents it).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "plan/search.h"

namespace memfit {

std::string format_plan(const PlanRequest & r, const SearchReport & rep, bool explain);
nlohmann::json plan_json(const PlanRequest & r, const SearchReport & rep);

}  // namespace memfit
