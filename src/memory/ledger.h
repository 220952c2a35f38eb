// Ledger: current and peak bytes per category, for two quantities (docs/design.md, "Placement and measurement"):
//   live     - bytes of buffers acquired and not yet released by the executing step;
//   reserved - bytes of regions actually obtained from the system (arena allocations).
// The peak of the total is tracked separately from the per-category peaks (they need not
// happen at the same moment).
#pragma once

#include "memory/category.h"

namespace memfit {

class Ledger {
public:
    void acquire(Category c, uint64_t bytes);
    void release(Category c, uint64_t bytes);   // aborts if it would go negative (logic error)
    void reserve(Category c, uint64_t bytes);
    void unreserve(Category c, uint64_t bytes);

    const CategoryBytes & live() const { return live_; }
    const CategoryBytes & live_peak() const { return live_peak_; }
    const CategoryBytes & reserved() const { return reserved_; }
    const CategoryBytes & reserved_peak() const { return reserved_peak_; }
    uint64_t live_total() const { return live_total_; }
    uint64_t live_total_peak() const { return live_total_peak_; }
    uint64_t reserved_total() const { return reserved_.total(); }
    uint64_t reserved_total_peak() const { return reserved_total_peak_; }

    // Forget the peaks (keep current values), e.g. to measure one step.
    void reset_peaks();

private:
    CategoryBytes live_, live_peak_, reserved_, reserved_peak_;
    uint64_t live_total_ = 0, live_total_peak_ = 0, reserved_total_peak_ = 0;
};

}  // namespace memfit
