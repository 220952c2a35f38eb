// The outlier detector of --skip-spikes: nothing is an outlier before the window is warm; then
// a gradient norm or loss more than Z deviations above the window's mean is, NaN always is, and
// a window of equal values does not make every small increase one.
#include <gtest/gtest.h>

#include <cmath>

#include "app/spike_detector.h"

namespace memfit {
namespace {

TEST(SpikeDetector, OutliersAgainstTheWindow) {
    SpikeDetector off;
    EXPECT_FALSE(off.enabled());
    EXPECT_EQ(off.norm_threshold(), 0);
    EXPECT_FALSE(off.loss_outlier(1e30));

    SpikeDetector d(4);
    EXPECT_TRUE(d.loss_outlier(NAN));
    for (size_t i = 0; i + 1 < SpikeDetector::kWarm; ++i) d.accept(3.0 + 0.1 * double(i % 3), 1.0 + 0.1 * double(i % 3));
    EXPECT_EQ(d.norm_threshold(), 0) << "not warm yet";
    EXPECT_FALSE(d.loss_outlier(100));
    d.accept(3.1, 1.1);
    // Values 1.0, 1.1, 1.2 (mean ~1.1, sd ~0.082): the limit is mean + 4 sd.
    const double limit = d.norm_threshold();
    EXPECT_GT(limit, 1.3);
    EXPECT_LT(limit, 1.5);
    EXPECT_FALSE(d.loss_outlier(3.3));
    EXPECT_TRUE(d.loss_outlier(4.0));

    SpikeDetector flat(4);
    for (size_t i = 0; i < 40; ++i) flat.accept(2.0, 1.0);
    EXPECT_NEAR(flat.norm_threshold(), 1.04, 1e-12);   // the 1% floor of the deviation
    EXPECT_FALSE(flat.loss_outlier(2.05));
    EXPECT_TRUE(flat.loss_outlier(2.2));
}

}  // namespace
}  // namespace memfit
