// Memory budgets: refuse, before anything is allocated, a plan that does not fit.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "memory/category.h"

namespace memfit {

// Expected failure: the plan needs more than the budget. The message lists needed vs available
// bytes, the split by category, and a hint.
class OutOfMemory : public Error { using Error::Error; };

// Throws OutOfMemory when need.total() > budget. `hint` ends the message.
void check_budget(const CategoryBytes & need, uint64_t budget, const std::string & hint);

// Memory this process may use: the cgroup limit if there is one, else MemAvailable.
uint64_t available_memory();

}  // namespace memfit
