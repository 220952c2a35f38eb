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
    // Training curves (empty for `memfit profile`).
    std::vector<CurvePoint> loss, val_loss, tokens_per_s;
};

// Index in r.timeline.events of the peak: the event of r.peak_op, or (when that is unset or not
// in the timeline) the first event with the largest total live bytes; -1 if there are none.
int peak_event(const ReportData & r);

}  // namespace memfit
