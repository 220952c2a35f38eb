#include "app/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace memfit {

SpikeDetector::Stats SpikeDetector::stats(const std::deque<double> & v) const {
    Stats s;
    if (v.empty()) return s;
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    double var = 0;
    for (double x : v) var += (x - s.mean) * (x - s.mean);
    // A floor of 1% of the mean: a window of equal values would make any increase an outlier.
    s.sd = std::max(std::sqrt(var / double(v.size())), 0.01 * std::fabs(s.mean));
    return s;
}

double SpikeDetector::norm_threshold() const {
    if (!enabled() || norms_.size() < kWarm) return 0;
    const Stats s = stats(norms_);
    return s.mean + z_ * s.sd;
}

double SpikeDetector::loss_threshold() const {
    if (!enabled()) return 0;
    if (losses_.size() < kWarm) return std::numeric_limits<double>::infinity();
    const Stats s = stats(losses_);
    return s.mean + z_ * s.sd;
}

void SpikeDetector::accept(double loss, double grad_norm) {
    if (!enabled()) return;
    losses_.push_back(loss);
    norms_.push_back(grad_norm);
    if (losses_.size() > kWindow) losses_.pop_front();
    if (norms_.size() > kWindow) norms_.pop_front();
}

}  // namespace memfit
