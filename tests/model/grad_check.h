// Analytic gradients against central differences of the loss, for the model tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "train/engine.h"

namespace memfit::test {

// One lr-0 step on (in, tg) for the gradients; then, for every tensor of the engine's layout,
// the element with the largest gradient against (loss(x + h) - loss(x - h)) / 2h, within 2% (+2e-4),
// and that gradient large enough (> 1e-4) to prove something.
inline void expect_largest_grads_match_fd(Engine & e, const std::vector<int32_t> & in,
                                          const std::vector<int32_t> & tg, float h) {
    const ParamLayout & layout = e.step().layout();
    e.train_step(in.data(), tg.data(), OptimHyper{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1});   // lr 0: grads only
    const std::vector<float> g(e.grads(), e.grads() + layout.total);
    for (const auto & p : layout.params) {
        size_t best = p.offset;
        for (size_t i = p.offset; i < p.offset + p.numel; ++i)
            if (std::fabs(g[i]) > std::fabs(g[best])) best = i;
        const float x0 = e.params()[best];
        e.params()[best] = x0 + h;
        e.params_changed();
        const double up = e.eval_loss(in.data(), tg.data());
        e.params()[best] = x0 - h;
        e.params_changed();
        const double down = e.eval_loss(in.data(), tg.data());
        e.params()[best] = x0;
        e.params_changed();
        const double fd = (up - down) / (2.0 * h);
        EXPECT_NEAR(fd, g[best], 0.02 * std::fabs(g[best]) + 2e-4) << p.name;
        EXPECT_GT(std::fabs(g[best]), 1e-4) << p.name << ": a gradient this small proves nothing";
    }
}

}  // namespace memfit::test
