// Learning-rate schedule: linear warmup from 0 to lr over `warmup` steps, then a decay to
// lr * min_ratio at step `total`: cosine, linear, or none (constant: lr after the warmup).
#pragma once

#include <algorithm>
#include <cmath>

namespace memfit {

enum class LrDecay { cosine, linear, constant };
inline const char * lr_decay_name(LrDecay d) {
    return d == LrDecay::cosine ? "cosine" : d == LrDecay::linear ? "linear" : "constant";
}

struct LrSchedule {
    float lr = 1e-3f;
    int   warmup = 0;
    int   total = 1;
    float min_ratio = 0.1f;
    LrDecay decay = LrDecay::cosine;

    // step is 1-based.
    float at(int step) const {
        if (warmup > 0 && step <= warmup) return lr * float(step) / float(warmup);
        const int span = std::max(1, total - warmup);
        const float progress = std::clamp(float(step - warmup) / float(span), 0.0f, 1.0f);
        if (decay == LrDecay::constant) return lr;
        const float left = decay == LrDecay::linear ? 1.0f - progress
                                                    : 0.5f * (1.0f + std::cos(3.14159265358979f * progress));
        return lr * (min_ratio + (1.0f - min_ratio) * left);
    }
};

}  // namespace memfit
