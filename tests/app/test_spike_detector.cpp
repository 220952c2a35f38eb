// The outlier detector of --skip-spikes: nothing is an outlier before the window is warm; then
// a gradient norm or loss more than Z deviations above the window's mean is (a non-finite loss
// always is), and a window of equal values does not make every small increase one.
#include <gtest/gtest.h>

#include <cmath>

#include "app/spike_detector.h"

namespace memfit {
namespace {

TEST(SpikeDetector, OutliersAgainstTheWindow) {
    SpikeDetector off;
    EXPECT_FALSE(off.enabled());
    EXPECT_EQ(off.norm_threshold(), 0);
    EXPECT_EQ(off.loss_threshold(), 0);

    SpikeDetector d(4);
    EXPECT_EQ(d.loss_threshold(), INFINITY) << "cold: only a non-finite loss is left out";
    for (size_t i = 0; i + 1 < SpikeDetector::kWarm; ++i) d.accept(3.0 + 0.1 * double(i % 3), 1.0 + 0.1 * double(i % 3));
    EXPECT_EQ(d.norm_threshold(), 0) << "not warm yet";
    EXPECT_EQ(d.loss_threshold(), INFINITY);
    d.accept(3.1, 1.1);
    // Values 1.0, 1.1, 1.2 (mean ~1.1, sd ~0.082): the limit is mean + 4 sd.
    const double limit = d.norm_threshold();
    EXPECT_GT(limit, 1.3);
    EXPECT_LT(limit, 1.5);
    EXPECT_GT(d.loss_threshold(), 3.3);
    EXPECT_LT(d.loss_threshold(), 4.0);

    SpikeDetector flat(4);
    for (size_t i = 0; i < 40; ++i) flat.accept(2.0, 1.0);
    EXPECT_NEAR(flat.norm_threshold(), 1.04, 1e-12);   // the 1% floor of the deviation
    EXPECT_NEAR(flat.loss_threshold(), 2.08, 1e-12);
}

}  // namespace
}  // namespace memfit
