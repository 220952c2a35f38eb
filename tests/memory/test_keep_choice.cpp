#include "memory/keep_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace memfit {
namespace {

using Units = std::vector<KeepCost>;
using Layers = std::vector<Units>;

constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();

// Small integer costs, zeros included, so that ties and free units occur often.
Units random_units(std::mt19937 & rng, int max_units) {
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    Units units(size_t(uniform(0, max_units)));
    for (KeepCost & u : units) {
        u.bytes = uint64_t(uniform(0, 3) == 0 ? 0 : uniform(1, 12));
        u.flops = double(uniform(0, 4) == 0 ? 0 : uniform(1, 20));
    }
    return units;
}

// (bytes kept, flops dropped) of one mask, summed directly.
std::pair<uint64_t, double> mask_cost(const Units & units, uint32_t mask) {
    uint64_t bytes = 0;
    double flops = 0;
    for (size_t i = 0; i < units.size(); i++) {
        if (mask & (1u << i)) {
            bytes += units[i].bytes;
        } else {
            flops += units[i].flops;
        }
    }
    return {bytes, flops};
}

// Totals of a plan's masks, summed directly.
std::pair<uint64_t, double> plan_cost(const Layers & layers, const KeepPlan & plan) {
    uint64_t bytes = 0;
    double flops = 0;
    for (size_t l = 0; l < layers.size(); l++) {
        auto [b, f] = mask_cost(layers[l], plan.mask[l]);
        bytes += b;
        flops += f;
    }
    return {bytes, flops};
}

TEST(KeepChoice, ParetoKeepSetsMatchBruteForce) {
    std::mt19937 rng(12345);
    for (int trial = 0; trial < 300; trial++) {
        const Units units = random_units(rng, 6);
        const uint32_t count = 1u << units.size();

        // Reference: the distinct (bytes, flops) points no other subset dominates, and for each the
        // smallest mask that reaches it.
        std::vector<std::pair<uint64_t, double>> all(count);
        for (uint32_t m = 0; m < count; m++) all[m] = mask_cost(units, m);
        std::vector<KeepSet> want;
        for (uint32_t m = 0; m < count; m++) {
            bool dominated = false, earlier_twin = false;
            for (uint32_t o = 0; o < count; o++) {
                if (all[o] == all[m]) {
                    earlier_twin |= o < m;
                } else if (all[o].first <= all[m].first && all[o].second <= all[m].second) {
                    dominated = true;
                }
            }
            if (!dominated && !earlier_twin) want.push_back(KeepSet{m, all[m].first, all[m].second});
        }
        std::sort(want.begin(), want.end(), [](const KeepSet & a, const KeepSet & b) { return a.bytes < b.bytes; });

        const std::vector<KeepSet> got = pareto_keep_sets(units);
        ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
        for (size_t i = 0; i < got.size(); i++) {
            EXPECT_EQ(got[i].mask, want[i].mask) << "trial " << trial << " set " << i;
            EXPECT_EQ(got[i].bytes, want[i].bytes) << "trial " << trial << " set " << i;
            EXPECT_EQ(got[i].flops, want[i].flops) << "trial " << trial << " set " << i;
            if (i > 0) {
                EXPECT_LT(got[i - 1].bytes, got[i].bytes);
                EXPECT_GT(got[i - 1].flops, got[i].flops);
            }
        }
        // The first set keeps only free units (0 bytes); the last has the least flops.
        ASSERT_FALSE(got.empty());
        EXPECT_EQ(got.front().bytes, 0u);
        double least = all[0].second;
        for (const auto & p : all) least = std::min(least, p.second);
        EXPECT_EQ(got.back().flops, least);
    }
}

TEST(KeepChoice, ParetoKeepSetsEdgeCases) {
    // No units: one set, nothing kept.
    const std::vector<KeepSet> none = pareto_keep_sets({});
    ASSERT_EQ(none.size(), 1u);
    EXPECT_EQ(none[0].mask, 0u);
    EXPECT_EQ(none[0].bytes, 0u);
    EXPECT_EQ(none[0].flops, 0.0);

    // A unit that costs nothing to keep is always kept; one that costs nothing to drop never is.
    const std::vector<KeepSet> s = pareto_keep_sets({{0, 5}, {7, 0}, {3, 2}});
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].mask, 0b001u);
    EXPECT_EQ(s[0].flops, 2.0);
    EXPECT_EQ(s[1].mask, 0b101u);
    EXPECT_EQ(s[1].bytes, 3u);
    EXPECT_EQ(s[1].flops, 0.0);

    // 16 units: every subset is Pareto-optimal when bytes are distinct powers of two and flops
    // equal them (each subset has its own byte sum and flops = total - bytes).
    Units big;
    for (int i = 0; i < 16; i++) big.push_back(KeepCost{uint64_t(1) << i, double(uint64_t(1) << i)});
    const std::vector<KeepSet> all = pareto_keep_sets(big);
    ASSERT_EQ(all.size(), size_t(1) << 16);
    for (size_t i = 0; i < all.size(); i++) {
        EXPECT_EQ(all[i].bytes, i);
        EXPECT_EQ(all[i].mask, uint32_t(i));
        EXPECT_EQ(all[i].flops, double(65535 - i));
    }
}

// Least flops, and the fewest bytes among plans with those flops, by enumerating every
// assignment; {-1, 0} when nothing fits.
std::pair<double, uint64_t> brute_force_best(const Layers & layers, uint64_t room) {
    std::vector<uint32_t> mask(layers.size(), 0);
    double best_flops = -1;
    uint64_t best_bytes = 0;
    while (true) {
        uint64_t bytes = 0;
        double flops = 0;
        for (size_t l = 0; l < layers.size(); l++) {
            auto [b, f] = mask_cost(layers[l], mask[l]);
            bytes += b;
            flops += f;
        }
        if (bytes <= room &&
            (best_flops < 0 || flops < best_flops || (flops == best_flops && bytes < best_bytes))) {
            best_flops = flops;
            best_bytes = bytes;
        }
        size_t l = 0;
        while (l < layers.size() && ++mask[l] == (1u << layers[l].size())) mask[l++] = 0;
        if (l == layers.size()) break;
    }
    return {best_flops, best_bytes};
}

// Every byte total some assignment reaches.
std::vector<uint64_t> reachable_bytes(const Layers & layers) {
    std::vector<uint64_t> sums{0};
    for (const Units & units : layers) {
        std::vector<uint64_t> next;
        for (uint64_t s : sums) {
            for (uint32_t m = 0; m < (1u << units.size()); m++) next.push_back(s + mask_cost(units, m).first);
        }
        std::sort(next.begin(), next.end());
        next.erase(std::unique(next.begin(), next.end()), next.end());
        sums = std::move(next);
    }
    return sums;
}

TEST(KeepChoice, MinRecomputeMatchesBruteForce) {
    std::mt19937 rng(777);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    int checked = 0;
    for (int trial = 0; trial < 300; trial++) {
        Layers layers(size_t(uniform(0, 4)));
        for (Units & units : layers) units = random_units(rng, 3);
        const std::vector<uint64_t> sums = reachable_bytes(layers);
        const uint64_t fixed = uniform(0, 2) == 0 ? uint64_t(uniform(0, 10)) : 0;

        std::vector<uint64_t> budgets{0, fixed, kHuge, fixed + sums.back(), fixed + uint64_t(uniform(0, 40))};
        for (int k = 0; k < 3; k++) {
            const uint64_t s = sums[size_t(uniform(0, int(sums.size()) - 1))];
            budgets.push_back(fixed + s);   // exactly some assignment's bytes
            if (s > 0) budgets.push_back(fixed + s - 1);
            budgets.push_back(fixed + s + 1);
        }
        for (uint64_t budget : budgets) {
            const std::optional<KeepPlan> plan = min_recompute(layers, budget, fixed);
            if (budget < fixed) {
                EXPECT_FALSE(plan.has_value()) << "trial " << trial << " budget " << budget;
                continue;
            }
            ASSERT_TRUE(plan.has_value()) << "trial " << trial << " budget " << budget;
            const auto [want_flops, want_bytes] = brute_force_best(layers, budget - fixed);
            ASSERT_GE(want_flops, 0.0);
            EXPECT_EQ(plan->flops, want_flops) << "trial " << trial << " budget " << budget;
            EXPECT_EQ(plan->bytes, fixed + want_bytes) << "trial " << trial << " budget " << budget;
            EXPECT_LE(plan->bytes, budget);
            ASSERT_EQ(plan->mask.size(), layers.size());
            for (size_t l = 0; l < layers.size(); l++) EXPECT_LT(plan->mask[l], 1u << layers[l].size());
            const auto [bytes, flops] = plan_cost(layers, *plan);
            EXPECT_EQ(fixed + bytes, plan->bytes) << "trial " << trial << " budget " << budget;
            EXPECT_EQ(flops, plan->flops) << "trial " << trial << " budget " << budget;
            // No layer's choice is dominated within the layer: each is one of its Pareto points.
            for (size_t l = 0; l < layers.size(); l++) {
                const auto point = mask_cost(layers[l], plan->mask[l]);
                const std::vector<KeepSet> sets = pareto_keep_sets(layers[l]);
                EXPECT_TRUE(std::any_of(sets.begin(), sets.end(), [&](const KeepSet & s) {
                    return s.bytes == point.first && s.flops == point.second;
                })) << "trial " << trial << " budget " << budget << " layer " << l;
            }
            checked++;
        }
    }
    EXPECT_GT(checked, 2000);
}

TEST(KeepChoice, MinRecomputeEdgeCases) {
    const Layers layers(3, Units{{4, 10}, {2, 1}});
    EXPECT_FALSE(min_recompute(layers, 99, 100).has_value());
    EXPECT_FALSE(min_recompute({}, 0, 1).has_value());

    // Budget exactly the fixed bytes: everything is dropped.
    const std::optional<KeepPlan> tight = min_recompute(layers, 100, 100);
    ASSERT_TRUE(tight.has_value());
    EXPECT_EQ(tight->mask, std::vector<uint32_t>(3, 0));
    EXPECT_EQ(tight->bytes, 100u);
    EXPECT_EQ(tight->flops, 33.0);

    // No layers: nothing to choose.
    const std::optional<KeepPlan> empty = min_recompute({}, 5, 2);
    ASSERT_TRUE(empty.has_value());
    EXPECT_TRUE(empty->mask.empty());
    EXPECT_EQ(empty->bytes, 2u);
    EXPECT_EQ(empty->flops, 0.0);

    // Equal least flops two ways, 2 = 4 - 2 by keeping the 3-byte unit or 4 - 1 - 1 by keeping both
    // 2-byte ones: the fewer bytes win.
    const std::optional<KeepPlan> tie = min_recompute(Layers{{{3, 2}}, {{2, 1}}, {{2, 1}}}, 4);
    ASSERT_TRUE(tie.has_value());
    EXPECT_EQ(tie->mask, (std::vector<uint32_t>{1, 0, 0}));
    EXPECT_EQ(tie->bytes, 3u);
    EXPECT_EQ(tie->flops, 2.0);

    // Keeping is worthless when no unit saves flops: the fewest bytes win the tie.
    const std::optional<KeepPlan> free = min_recompute(Layers(2, Units{{5, 0}, {0, 3}}), kHuge);
    ASSERT_TRUE(free.has_value());
    EXPECT_EQ(free->mask, std::vector<uint32_t>(2, 0b10));
    EXPECT_EQ(free->bytes, 0u);
    EXPECT_EQ(free->flops, 0.0);
}

// Independent reference for many layers: a knapsack over exact byte totals, trying every subset
// of every layer. table[b] is the least flops with exactly b bytes kept (infinity if none).
std::vector<double> knapsack_table(const Layers & layers, uint64_t max_room) {
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> best(size_t(max_room) + 1, inf);
    best[0] = 0;
    for (const Units & units : layers) {
        std::vector<double> next(best.size(), inf);
        for (uint32_t m = 0; m < (1u << units.size()); m++) {
            const auto [b, f] = mask_cost(units, m);
            for (uint64_t s = 0; s + b <= max_room; s++) {
                if (best[s] != inf) next[s + b] = std::min(next[s + b], best[s] + f);
            }
        }
        best = std::move(next);
    }
    return best;
}

// The least flops within room and the fewest bytes that reach them.
std::pair<double, uint64_t> knapsack_best(const std::vector<double> & table, uint64_t room) {
    const auto it = std::min_element(table.begin(), table.begin() + std::ptrdiff_t(room) + 1);   // first: fewest bytes
    return {*it, uint64_t(it - table.begin())};
}

TEST(KeepChoice, ManyLayersMatchKnapsack) {
    std::mt19937 rng(4242);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    for (int trial = 0; trial < 20; trial++) {
        // Half the trials have identical layers (the real shape), half have each layer different.
        const bool identical = trial % 2 == 0;
        const Units shared = random_units(rng, 8);
        Layers layers(size_t(uniform(10, 40)));
        uint64_t total = 0;
        for (Units & units : layers) {
            units = identical ? shared : random_units(rng, 8);
            for (const KeepCost & u : units) total += u.bytes;
        }
        const std::vector<double> table = knapsack_table(layers, total + 5);
        for (int k = 0; k < 5; k++) {
            const uint64_t room = uint64_t(uniform(0, int(total) + 5));
            const std::optional<KeepPlan> plan = min_recompute(layers, room);
            ASSERT_TRUE(plan.has_value());
            const auto [want_flops, want_bytes] = knapsack_best(table, room);
            EXPECT_EQ(plan->flops, want_flops) << "trial " << trial << " room " << room;
            EXPECT_EQ(plan->bytes, want_bytes) << "trial " << trial << " room " << room;
            const auto [bytes, flops] = plan_cost(layers, *plan);
            EXPECT_EQ(bytes, plan->bytes);
            EXPECT_EQ(flops, plan->flops);
        }
    }
}

// The shape `--recompute budget` solves: 80 identical transformer layers with 8 saved units each,
// bytes multiples of B*T*C (bf16) plus small fp32 statistics, flops the forward cost of each unit.
Units transformer_units(uint64_t B, uint64_t T, uint64_t C) {
    const uint64_t BT = B * T, BTC = BT * C;
    return {
        {BTC * 2, double(8 * BTC)},               // ln1 output
        {2 * BT * 4, double(5 * BTC)},            // ln1 mean and rstd
        {3 * BTC * 2, double(2 * BTC * 3 * C)},   // qkv projection
        {BTC * 2, double(4 * B * T * T * C)},     // attention output
        {BTC * 2, double(8 * BTC)},               // ln2 output
        {2 * BT * 4, double(5 * BTC)},            // ln2 mean and rstd
        {4 * BTC * 2, double(2 * BTC * 4 * C)},   // fc output (GELU input)
        {4 * BTC * 2, double(8 * 4 * BTC)},       // GELU output
    };
}

TEST(KeepChoice, EightyTransformerLayers) {
    const Units units = transformer_units(8, 2048, 8192);
    const Layers layers(80, units);
    uint64_t layer_bytes = 0;
    double layer_flops = 0;
    for (const KeepCost & u : units) {
        layer_bytes += u.bytes;
        layer_flops += u.flops;
    }

    const std::optional<KeepPlan> all = min_recompute(layers, kHuge);
    ASSERT_TRUE(all.has_value());
    EXPECT_EQ(all->mask, std::vector<uint32_t>(80, 0xff));
    EXPECT_EQ(all->bytes, 80 * layer_bytes);
    EXPECT_EQ(all->flops, 0.0);

    const std::optional<KeepPlan> none = min_recompute(layers, 0);
    ASSERT_TRUE(none.has_value());
    EXPECT_EQ(none->mask, std::vector<uint32_t>(80, 0));
    EXPECT_EQ(none->bytes, 0u);
    EXPECT_EQ(none->flops, 80 * layer_flops);

    // Budgets across the range: flops never rise with more budget, each plan is consistent, and
    // the slowest solve is printed. It takes a few milliseconds; the bound only catches a solver
    // that lost the grouping of identical layers (a per-layer frontier takes seconds). The
    // thread's CPU time, not wall time: a loaded machine's preemption is not the solver's.
    auto cpu_ms = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
    };
    double prev = 80 * layer_flops, slowest_ms = 0;
    for (int k = 0; k <= 20; k++) {
        const uint64_t budget = 80 * layer_bytes / 20 * uint64_t(k);
        const double start = cpu_ms();
        const std::optional<KeepPlan> plan = min_recompute(layers, budget);
        const double ms = cpu_ms() - start;
        slowest_ms = std::max(slowest_ms, ms);
        ASSERT_TRUE(plan.has_value());
        EXPECT_LE(plan->bytes, budget);
        EXPECT_LE(plan->flops, prev);
        prev = plan->flops;
        const auto [bytes, flops] = plan_cost(layers, *plan);
        EXPECT_EQ(bytes, plan->bytes);
        EXPECT_EQ(flops, plan->flops);
    }
    EXPECT_EQ(prev, 0.0);
    EXPECT_LT(slowest_ms, 100.0);
    std::printf("[ timing   ] 80 layers x 8 units: slowest solve %.2f ms\n", slowest_ms);
}

TEST(KeepChoice, EightySmallTransformerLayersMatchKnapsack) {
    // The same shape at B=1, T=4, C=8 with bytes in units of 32 (2, 1, 6, 2, 2, 1, 8, 8 per layer),
    // small enough for the byte-exact knapsack at every budget.
    Units units = transformer_units(1, 4, 8);
    for (KeepCost & u : units) {
        ASSERT_EQ(u.bytes % 32, 0u);
        u.bytes /= 32;
    }
    const Layers layers(80, units);
    const std::vector<double> table = knapsack_table(layers, 80 * 30);
    for (uint64_t room = 0; room <= 80 * 30; room++) {
        const std::optional<KeepPlan> plan = min_recompute(layers, room);
        ASSERT_TRUE(plan.has_value());
        const auto [want_flops, want_bytes] = knapsack_best(table, room);
        EXPECT_EQ(plan->flops, want_flops) << "room " << room;
        EXPECT_EQ(plan->bytes, want_bytes) << "room " << room;
    }
}

}  // namespace
}  // namespace memfit
