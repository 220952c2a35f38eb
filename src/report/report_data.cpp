#include "report/report_data.h"

namespace memfit {

int peak_event(const ReportData & r) {
    const auto & ev = r.timeline.events;
    if (r.peak_op >= 0) {
        for (size_t i = 0; i < ev.size(); ++i)
            if (ev[i].op == r.peak_op) return int(i);
    }
    int best = -1;
    uint64_t best_bytes = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
        const uint64_t t = ev[i].live.total();
        if (best < 0 || t > best_bytes) best = int(i), best_bytes = t;
    }
    return best;
}

}  // namespace memfit
