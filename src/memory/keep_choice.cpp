#include "memory/keep_choice.h"

#include <algorithm>
#include <bit>
#include <cstddef>

#include "core/error.h"

namespace memfit {

namespace {

// Units of one (bytes, flops), wherever they are: the copies are interchangeable.
struct UnitType {
    uint64_t bytes = 0;
    double   flops = 0;
    std::vector<std::pair<uint32_t, uint32_t>> copies;   // (layer, unit), in layer order
};

// A point of a frontier: totals of the kept copies and how it was reached. saved is the flops
// those copies spare; a frontier has bytes ascending and saved strictly ascending.
struct Point {
    uint64_t bytes = 0;
    double   saved = 0;
    uint32_t pred  = 0;       // index of the predecessor point in the previous frontier
    bool     took  = false;   // whether this step's chunk of copies is kept
};

// One 0/1 step: keep a chunk of `count` copies of a type (bytes and saved flops are the chunk's).
// Two sorted lists, the frontier and the frontier plus the chunk, merge in linear time into the
// next frontier; points over room and dominated points (more bytes without more saved) are dropped.
std::vector<Point> merge_chunk(const std::vector<Point> & frontier, uint64_t bytes, double saved, uint64_t room) {
    std::vector<Point> next;
    next.reserve(frontier.size() * 2);
    auto emit = [&](uint64_t b, double s, uint32_t pred, bool took) {
        if (next.empty() || s > next.back().saved) next.push_back(Point{b, s, pred, took});
    };
    const uint32_t n = uint32_t(frontier.size());
    uint32_t i = 0, j = 0;
    // Taking fits for a prefix of the frontier; j runs over that prefix.
    const uint32_t n_take = bytes > room ? 0
        : uint32_t(std::partition_point(frontier.begin(), frontier.end(),
                                         [&](const Point & p) { return p.bytes <= room - bytes; }) -
                   frontier.begin());
    while (i < n || j < n_take) {
        // Smaller bytes first; on equal bytes the larger saved first (the other is then dominated),
        // and not taking on a full tie.
        bool take = false;
        if (i == n) {
            take = true;
        } else if (j < n_take) {
            const uint64_t tb = frontier[j].bytes + bytes;
            const double ts = frontier[j].saved + saved;
            take = tb < frontier[i].bytes || (tb == frontier[i].bytes && ts > frontier[i].saved);
        }
        if (take) {
            emit(frontier[j].bytes + bytes, frontier[j].saved + saved, j, true);
            j++;
        } else {
            emit(frontier[i].bytes, frontier[i].saved, i, false);
            i++;
        }
    }
    return next;
}

}  // namespace

std::vector<KeepSet> pareto_keep_sets(const std::vector<KeepCost> & units) {
    MF_ASSERT(units.size() <= 16);
    const uint32_t n = uint32_t(units.size());
    const uint32_t count = 1u << n;
    const uint32_t full = count - 1;

    // Sums over every subset, each built from the subset without its lowest bit. flops sums the
    // dropped units of a mask, i.e. the sum over the complement, so it is exactly 0 when all are kept.
    std::vector<uint64_t> bytes(count, 0);
    std::vector<double> sum_flops(count, 0);
    for (uint32_t m = 1; m < count; m++) {
        const uint32_t low = uint32_t(std::countr_zero(m));
        const uint64_t rest = bytes[m & (m - 1)];
        MF_ASSERT(units[low].bytes <= UINT64_MAX - rest);
        bytes[m] = rest + units[low].bytes;
        sum_flops[m] = sum_flops[m & (m - 1)] + units[low].flops;
    }

    std::vector<KeepSet> sets(count);
    for (uint32_t m = 0; m < count; m++) sets[m] = KeepSet{m, bytes[m], sum_flops[full & ~m]};
    std::sort(sets.begin(), sets.end(), [](const KeepSet & a, const KeepSet & b) {
        if (a.bytes != b.bytes) return a.bytes < b.bytes;
        if (a.flops != b.flops) return a.flops < b.flops;
        return a.mask < b.mask;
    });
    // The first of every run of equal bytes (least flops, then smallest mask), and only if it beats
    // every set with fewer bytes.
    size_t kept = 0;
    for (size_t i = 0; i < sets.size(); i++) {
        if (kept == 0 || sets[i].flops < sets[kept - 1].flops) sets[kept++] = sets[i];
    }
    sets.resize(kept);
    return sets;
}

std::optional<KeepPlan> min_recompute(const std::vector<std::vector<KeepCost>> & layers, uint64_t budget,
                                      uint64_t fixed_bytes) {
    if (fixed_bytes > budget) return std::nullopt;
    const uint64_t room = budget - fixed_bytes;

    KeepPlan plan;
    plan.mask.assign(layers.size(), 0);

    // Group the units into types. A unit that saves no flops is never kept (keeping it cannot
    // lower the flops, and fewer bytes win ties); one that costs no bytes always is.
    struct Tagged { KeepCost cost; uint32_t layer, unit; };
    std::vector<Tagged> units;
    uint64_t total_bytes = 0;
    for (uint32_t l = 0; l < layers.size(); l++) {
        MF_ASSERT(layers[l].size() <= 32);
        for (uint32_t i = 0; i < layers[l].size(); i++) {
            const KeepCost & u = layers[l][i];
            MF_ASSERT(u.flops >= 0);
            MF_ASSERT(u.bytes <= UINT64_MAX - total_bytes);
            total_bytes += u.bytes;
            if (u.flops == 0) continue;
            if (u.bytes == 0) {
                plan.mask[l] |= 1u << i;
            } else {
                units.push_back(Tagged{u, l, i});
            }
        }
    }
    // Largest units first: coarse byte sums first keep the early frontiers small (a heuristic; any
    // order is exact). Ties by flops, then by position, so the copies are in layer order.
    std::sort(units.begin(), units.end(), [](const Tagged & a, const Tagged & b) {
        if (a.cost.bytes != b.cost.bytes) return a.cost.bytes > b.cost.bytes;
        if (a.cost.flops != b.cost.flops) return a.cost.flops > b.cost.flops;
        if (a.layer != b.layer) return a.layer < b.layer;
        return a.unit < b.unit;
    });
    std::vector<UnitType> types;
    for (const Tagged & t : units) {
        if (types.empty() || types.back().bytes != t.cost.bytes || types.back().flops != t.cost.flops) {
            types.push_back(UnitType{t.cost.bytes, t.cost.flops, {}});
        }
        types.back().copies.emplace_back(t.layer, t.unit);
    }

    // Every type but the last is merged as chunks of 1, 2, 4, ... copies and a remainder (binary
    // splitting): each count 0..c is a sum of a subset of chunks, so the frontier after a type's
    // chunks is its frontier for counts 0..c, in log(c) linear merges. The last type is not merged:
    // its copies save flops, so each point keeps as many as fit, and the best such total is the
    // answer. (The last type has the smallest units, whose merge would make the frontier finest.)
    struct Chunk { uint32_t type, count; };
    std::vector<Chunk> chunks;
    for (uint32_t t = 0; t + 1 < types.size(); t++) {
        uint32_t left = uint32_t(types[t].copies.size());
        for (uint32_t size = 1; left > 0; size *= 2) {
            const uint32_t count = std::min(size, left);
            chunks.push_back(Chunk{t, count});
            left -= count;
        }
    }

    // back[s]: the frontier after chunks 0..s, whose points point into back[s-1]. Reserved, so
    // that frontier stays valid as back grows.
    std::vector<std::vector<Point>> back;
    back.reserve(chunks.size());
    const std::vector<Point> start{Point{}};   // before any chunk: nothing kept
    const std::vector<Point> * frontier = &start;
    for (const Chunk & c : chunks) {
        const UnitType & type = types[c.type];
        // No overflow: a chunk's bytes are at most the sum of all units' bytes.
        back.push_back(merge_chunk(*frontier, type.bytes * c.count, type.flops * c.count, room));
        frontier = &back.back();
    }

    // The best completion by the last type: most saved flops, then fewest bytes, then first point.
    std::vector<uint32_t> count(types.size(), 0);
    uint32_t at = uint32_t(frontier->size() - 1);
    if (!types.empty()) {
        const UnitType & last = types.back();
        double best_saved = -1;
        uint64_t best_bytes = 0;
        for (uint32_t i = 0; i < frontier->size(); i++) {
            const Point & p = (*frontier)[i];
            const uint64_t k = std::min(uint64_t(last.copies.size()), (room - p.bytes) / last.bytes);
            const double saved = p.saved + last.flops * double(k);
            const uint64_t bytes = p.bytes + last.bytes * k;
            if (saved > best_saved || (saved == best_saved && bytes < best_bytes)) {
                best_saved = saved;
                best_bytes = bytes;
                at = i;
                count.back() = uint32_t(k);
            }
        }
    }
    for (size_t s = chunks.size(); s-- > 0;) {
        const Point & p = back[s][at];
        if (p.took) count[chunks[s].type] += chunks[s].count;
        at = p.pred;
    }
    for (size_t t = 0; t < types.size(); t++) {
        for (uint32_t c = 0; c < count[t]; c++) {
            const auto [layer, unit] = types[t].copies[c];
            plan.mask[layer] |= 1u << unit;
        }
    }

    // Totals from the masks, so that they are the plan's own sums.
    plan.bytes = fixed_bytes;
    for (size_t l = 0; l < layers.size(); l++) {
        for (size_t i = 0; i < layers[l].size(); i++) {
            if (plan.mask[l] & (1u << i)) {
                plan.bytes += layers[l][i].bytes;
            } else {
                plan.flops += layers[l][i].flops;
            }
        }
    }
    MF_ASSERT(plan.bytes <= budget);
    return plan;
}

}  // namespace memfit
