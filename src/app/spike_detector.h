// --skip-spikes Z: a step whose gradient norm or loss is an outlier against the recent steps
// (its z-score over a running window of accepted steps above Z, as llm.c's outlier detector) is
// a bad step, and is not applied: the engine compares the step's loss with loss_threshold() once
// its backward is done, the optimizer kernels its gradient norm with norm_threshold(), both
// before anything is updated. Bad steps are logged and counted towards --spike-rollback's K
// consecutive ones.
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
    // The loss above which the next step is not applied: infinity before the window is warm
    // (only a non-finite loss is left out then); 0 when disabled.
    double loss_threshold() const;
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
