// --skip-spikes Z: a step whose gradient norm or loss is an outlier against the recent steps
// (its z-score over a running window of accepted steps above Z, as llm.c's outlier detector) is
// a bad step. A gradient-norm outlier (or a non-finite one) is not applied: the optimizer kernels
// compare the step's norm with threshold() before they update anything. A loss outlier is only
// known once the fused step has updated the weights: it is logged and counted, as the skipped
// ones are, towards --spike-rollback's K consecutive bad steps.
#pragma once

#include <cstddef>
#include <deque>

namespace memfit {

class SpikeDetector {
public:
    static constexpr size_t kWindow = 128;   // the accepted steps the statistics cover
    static constexpr size_t kWarm = 16;      // before this many, nothing is an outlier

    explicit SpikeDetector(double z = 0) : z_(z) {}
    bool enabled() const { return z_ > 0; }
    // The gradient norm above which the next step is not applied (0: no threshold yet).
    double norm_threshold() const;
    // Whether a loss this high is an outlier.
    bool loss_outlier(double loss) const;
    // A step that was applied and was no outlier joins the window.
    void accept(double loss, double grad_norm);

private:
    struct Stats {
        double mean = 0, sd = 0;
    };
    Stats stats(const std::deque<double> & v) const;
    double z_;
    std::deque<double> losses_, norms_;
};

}  // namespace memfit
