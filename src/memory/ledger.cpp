#include "memory/ledger.h"

#include <algorithm>

#include "core/error.h"

namespace memfit {

void Ledger::acquire(Category c, uint64_t bytes) {
    live_[c] += bytes;
    if (c != Category::offloaded) live_total_ += bytes;   // the device's bytes
    live_peak_[c] = std::max(live_peak_[c], live_[c]);
    live_total_peak_ = std::max(live_total_peak_, live_total_);
}

void Ledger::release(Category c, uint64_t bytes) {
    MF_ASSERT(live_[c] >= bytes && "ledger live bytes would go negative (likely logic error)");
    live_[c] -= bytes;
    if (c != Category::offloaded) live_total_ -= bytes;
}

void Ledger::reserve(Category c, uint64_t bytes) {
    reserved_[c] += bytes;
    reserved_peak_[c] = std::max(reserved_peak_[c], reserved_[c]);
    reserved_total_peak_ = std::max(reserved_total_peak_, reserved_.total());
}

void Ledger::unreserve(Category c, uint64_t bytes) {
    MF_ASSERT(reserved_[c] >= bytes && "ledger reserved bytes would go negative (likely logic error)");
    reserved_[c] -= bytes;
}

void Ledger::reset_peaks() {
    live_peak_ = live_;
    reserved_peak_ = reserved_;
    live_total_peak_ = live_total_;
    reserved_total_peak_ = reserved_.total();
}

}  // namespace memfit
