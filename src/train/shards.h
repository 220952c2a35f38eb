// How ZeRO cuts a flat buffer over the data-parallel ranks: equal shards of `size` elements, a
// multiple of an alignment, rank r's elements [r size, r size + size) of [0, total) (the last
// ranks' may be short or empty). Whole (ZeRO 0, or a buffer every rank keeps): every rank's shard
// is [0, total).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace memfit {

struct FlatShards {
    size_t total = 0, size = 0;
    int ranks = 1;
    bool whole = true;

    static FlatShards whole_of(size_t total, int ranks = 1) { return FlatShards{total, total, ranks, true}; }
    static FlatShards cut(size_t total, int ranks, size_t align) {
        const size_t per = size_t(ranks) * align;
        return FlatShards{total, (total + per - 1) / per * align, ranks, false};
    }
    size_t lo(int r) const { return whole ? 0 : std::min(size_t(r) * size, total); }
    size_t hi(int r) const { return whole ? total : std::min(lo(r) + size, total); }
    // Elements of [a, b) in rank r's shard; and in every rank's, in rank order.
    size_t in(size_t a, size_t b, int r) const {
        const size_t x = std::max(a, lo(r)), y = std::min(b, hi(r));
        return y > x ? y - x : 0;
    }
    std::vector<size_t> counts(size_t a, size_t b) const {
        std::vector<size_t> c;
        for (int r = 0; r < ranks; ++r) c.push_back(in(a, b, r));
        return c;
    }
    // The most of [a, b) any one rank's shard holds. O(1) in the ranks: only those whose shards
    // meet [a, b) hold any of it, and one strictly between the first and the last a whole shard.
    size_t most(size_t a, size_t b) const {
        if (b <= a) return 0;
        if (whole) return b - a;
        const int r0 = int(a / size), r1 = std::min(int((b - 1) / size), ranks - 1);
        if (r1 - r0 >= 2) return size;
        return std::max(in(a, b, r0), in(a, b, r1));
    }
};

}  // namespace memfit
