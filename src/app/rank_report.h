// What the ranks of a run measured, gathered for rank 0's report: each rank's planned and
// measured bytes, min/max over the ranks, and a pipeline's idle time per stage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/groups.h"
#include "memory/ledger.h"
#include "memory/timeline.h"

namespace memfit {

// Pipeline: each stage's time in transfers over the last step, against the schedule's ideal
// bubble. Collective.
std::string pipeline_idle(Communicator & comm, const ParallelLayout & l, const Timeline & t, int m);

// "rank 3", or with tensor or pipeline parallelism "rank 3 (tp 1, pp 1, dp 0)".
std::string rank_label(const ParallelLayout & l, int rank);

// Per-rank memory, gathered (collective): what each rank's ledger measured, and what its own
// program planned (tensor and pipeline ranks run different programs).
struct RankMemory {
    std::vector<CategoryBytes> reserved, live;                   // [rank], measured
    std::vector<CategoryBytes> planned_reserved, planned_live;   // [rank]
    std::vector<uint64_t> rss;
};
RankMemory gather_memory(Communicator & comm, const Ledger & L, uint64_t rss, const CategoryBytes & planned_live,
                         const CategoryBytes & planned_reserved);

// "memory per rank (4 ranks): reserved min .. (rank i) max .. (rank j); ..." and per category.
std::string format_rank_memory(const RankMemory & r);
nlohmann::json rank_memory_json(const RankMemory & r);

}  // namespace memfit
