// What `memfit plan` prints: the ranked table (layout, micro-batch x accumulation, memory per
// device, step time, tokens/s, MFU, whether the bytes are the engine's exact program), what the
// words mean, the best row's bytes by category and the command that runs it, the rejected
// candidates with what would make them fit (--explain), and the same as JSON (--json;
// docs/plan.md documents it). Lines fit 120 columns unless `wide` (every column, the bar).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "plan/search.h"

namespace memfit {

// The width the report keeps to without `wide`.
constexpr size_t kPlanColumns = 120;

// What "exact" means in a plan, as the report and the JSON say it.
extern const char * const kExactMeaning;

std::string format_plan(const PlanRequest & r, const SearchReport & rep, bool explain, bool wide = false);
nlohmann::json plan_json(const PlanRequest & r, const SearchReport & rep);

// "h200's efficiencies are h100-80g's" when the kind borrows them; empty otherwise.
std::string borrowed_efficiencies(const Hardware & hw);

// `text` broken at spaces into lines of at most `width` columns, the later ones indented by
// `indent` spaces (a word longer than a line stays whole).
std::string wrap(const std::string & text, size_t indent, size_t width = kPlanColumns);

}  // namespace memfit
