// What `memfit plan` says before and after a search when the request cannot be answered as asked:
// contradictory or impossible layouts and batches (one line with the numbers and what to change),
// and, when nothing fits, a change checked to make something fit.
#pragma once

#include <string>

#include "plan/search.h"

namespace memfit {

// ConfigError for a request no layout can satisfy: sizes out of range, devices that do not fill
// whole nodes, a fixed --tp / --pp that does not divide the devices, the heads or the blocks, and
// batch sizes that contradict each other (micro-batch x accumulation x data-parallel size must be
// the global batch for some layout).
void check_request(const PlanRequest & r);

// The message when no layout of the devices divides the global batch: the data-parallel sizes
// the layouts have and global batches that would divide.
std::string no_layout_message(const PlanRequest & r);

// When nothing fits: the first of these, each checked by a search, that makes something fit:
// dropping a fixed choice, --loss-chunk auto, a packed LoRA base; or a layout `memfit train` does
// not run yet that fits (--include-plan-only). Else what is left: more devices, a shorter sequence.
// A change the request already has is never suggested.
std::string nothing_fits_hint(const PlanRequest & r, const SearchReport & rep);

}  // namespace memfit
