// Everything a memory report shows, gathered by the trainer/profiler and rendered by
// html_report (report.html) and chrome_trace (trace.json). Plain data: no engine types beyond
// the timeline and categories.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory/category.h"
#include "memory/timeline.h"

namespace memfit {

struct ReportBuffer {
    std::string name;            // "h.3.attn.probs"
    Category    category = Category::activations;
    uint64_t    bytes = 0;
    int         first_op = -1;   // lifetime in op indexes; persistent buffers span the whole step
    int         last_op = -1;
    bool        persistent = false;
};

struct CurvePoint {
    int    step = 0;
    double value = 0;
};

// One rank of a multi-process run, as rank 0 gathered it.
struct RankView {
    int           rank = 0;
    std::string   label;                        // "rank 1" or "rank 1 (tp 0, pp 1, dp 0)"
    CategoryBytes planned_peak, measured_peak;  // live bytes per category over the run
    uint64_t      peak_rss = 0;
    Timeline      timeline;                     // that rank's last step; no events when not gathered
};

struct ReportData {
    std::string    title;                 // "memfit profile: gpt2-6l, batch 8 x seq 256"
    nlohmann::json config;                // flat object of configuration fields, shown as a table
    Timeline       timeline;              // one training step, measured (ledger bytes per op)
    int            num_ops = 0;
    CategoryBytes  planned_peak, measured_peak, planned_reserved, measured_reserved;
    uint64_t       budget = 0;            // 0: none
    uint64_t       peak_rss = 0;
    int            peak_op = -1;          // op index where total live bytes peak
    std::vector<ReportBuffer> live_at_peak;   // buffers alive at peak_op, largest first
    std::vector<ReportBuffer> largest;        // the ten largest buffers, largest first
    std::vector<std::string>  hints;          // sentences computed by the planner
    // A multi-process run: every rank (rank 0 first), for the per-rank view and one trace
    // process per rank. Empty for one process.
    std::vector<RankView> ranks;
    // A step that failed out of memory: what failed ("allocation of h.3.attn.probs (1.50 MiB)
    // failed"). The timeline then ends at the op that failed (timeline.failed_op, the last event:
    // its live bytes are those held when the allocation failed), peak_op is that op and
    // live_at_peak the buffers the plan has live at it. Empty when the step completed.
    std::string failure;
    // Training curves (empty for `memfit profile`).
    std::vector<CurvePoint> loss, val_loss, tokens_per_s;
    // Preference tuning (--objective dpo): TRL's rewards/margins and rewards/accuracies by step.
    std::vector<CurvePoint> margins, accuracies;
    // A mixture of experts: moe/aux_loss and moe/max_load by step, and the tokens each expert of
    // each sparse layer received in the last step ([layer][expert]).
    std::vector<CurvePoint> aux_loss, max_load;
    std::vector<std::vector<double>> expert_tokens;
};

// Index in r.timeline.events of the peak: the event of r.peak_op, or (when that is unset or not
// in the timeline) the first event with the largest total live bytes; -1 if there are none.
int peak_event(const ReportData & r);

}  // namespace memfit
