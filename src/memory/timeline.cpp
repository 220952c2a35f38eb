#include "memory/timeline.h"

#include <fmt/format.h>

namespace memfit {

std::string compare_live_bytes(const Timeline & a, const Timeline & b) {
    if (a.events.size() != b.events.size())
        return fmt::format("the two steps ran {} and {} ops", a.events.size(), b.events.size());
    for (size_t i = 0; i < a.events.size(); ++i) {
        const auto & x = a.events[i];
        const auto & y = b.events[i];
        for (size_t c = 0; c < kCategoryCount; ++c) {
            if (x.live.v[c] == y.live.v[c]) continue;
            return fmt::format("live {} bytes at op {} ({}) differ between the two steps: {} then {} ({:+d})",
                               kCategoryNames[c], i, x.name, x.live.v[c], y.live.v[c],
                               int64_t(y.live.v[c]) - int64_t(x.live.v[c]));
        }
    }
    return {};
}

}  // namespace memfit
