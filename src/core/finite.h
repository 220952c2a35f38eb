// Non-finite values in a float array: weights and training state are checked when they are read
// (a model folder, a checkpoint), so a NaN there is named where it comes from instead of
// surfacing later as a diverged loss or garbage text.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>

#include <fmt/format.h>

namespace memfit {

struct NonFinite {
    size_t count = 0;
    size_t first = 0;      // the first one's index (when count > 0)
    float  value = 0;      // and its value
    explicit operator bool() const { return count > 0; }
    // "3 non-finite values (the first, element 12, is nan)"
    std::string describe(const char * kind = "non-finite") const {
        return fmt::format("{} {} value{} (the first, element {}, is {})", count, kind, count == 1 ? "" : "s", first,
                           value);
    }
};

// Counts NaN and +-inf; with `non_negative`, negative values count too (AdamW's second moment);
// with a `limit`, values whose magnitude passes it (implausible for what the array holds).
inline NonFinite find_non_finite(const float * x, size_t n, bool non_negative = false, float limit = INFINITY) {
    NonFinite r;
    for (size_t i = 0; i < n; ++i) {
        if (std::isfinite(x[i]) && !(non_negative && x[i] < 0) && std::fabs(x[i]) <= limit) continue;
        if (r.count++ == 0) r.first = i, r.value = x[i];
    }
    return r;
}

}  // namespace memfit
