#include "memory/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace memfit {
namespace {

constexpr int kOps = 50;

std::vector<ArenaRequest> random_requests(uint32_t seed) {
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<ArenaRequest> reqs(size_t(uniform(1, 200)));
    for (ArenaRequest & r : reqs) {
        switch (uniform(0, 4)) {
            case 0:  r.bytes = 0; break;                                  // empty
            case 1:  r.bytes = size_t(uniform(1, 63)) | 1; break;         // small, odd
            case 2:  r.bytes = size_t(uniform(1, 4096)); break;
            case 3:  r.bytes = size_t(uniform(1, 1 << 20)) | 1; break;    // large, odd
            default: r.bytes = size_t(uniform(1, 16)) * 4096; break;      // page multiples
        }
        r.first = uniform(0, kOps - 1);
        r.last = uniform(0, 3) == 0 ? r.first : uniform(r.first, kOps - 1);
    }
    return reqs;
}

// Straightforward reference for arena_live_peak: sum the aligned sizes alive at each op.
size_t brute_force_peak(const std::vector<ArenaRequest> & reqs, size_t alignment) {
    size_t peak = 0;
    for (int op = 0; op < kOps; op++) {
        size_t live = 0;
        for (const ArenaRequest & r : reqs) {
            if (r.first <= op && op <= r.last) live += align_up(r.bytes, alignment);
        }
        peak = std::max(peak, live);
    }
    return peak;
}

void check_plan(const std::vector<ArenaRequest> & reqs, const ArenaPlan & plan, size_t alignment) {
    ASSERT_EQ(plan.offsets.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); i++) {
        size_t size_i = align_up(reqs[i].bytes, alignment);
        EXPECT_EQ(plan.offsets[i] % alignment, 0u) << "request " << i;
        EXPECT_LE(plan.offsets[i] + size_i, plan.size) << "request " << i;
        if (size_i == 0) {
            EXPECT_EQ(plan.offsets[i], 0u) << "zero-byte request " << i;
            continue;
        }
        for (size_t j = i + 1; j < reqs.size(); j++) {
            size_t size_j = align_up(reqs[j].bytes, alignment);
            if (size_j == 0) continue;
            bool same_time = reqs[i].first <= reqs[j].last && reqs[j].first <= reqs[i].last;
            if (!same_time) continue;
            bool disjoint = plan.offsets[i] + size_i <= plan.offsets[j] || plan.offsets[j] + size_j <= plan.offsets[i];
            EXPECT_TRUE(disjoint) << "requests " << i << " [" << plan.offsets[i] << ", +" << size_i << ") and " << j
                                  << " [" << plan.offsets[j] << ", +" << size_j << ") are alive together";
        }
    }
    EXPECT_GE(plan.size, arena_live_peak(reqs, alignment));
}

TEST(Arena, RandomRequestsSatisfyInvariants) {
    for (size_t alignment : {size_t(16), size_t(64), size_t(256)}) {
        for (uint32_t seed = 1; seed <= 200; seed++) {
            SCOPED_TRACE(testing::Message() << "alignment " << alignment << ", seed " << seed);
            std::vector<ArenaRequest> reqs = random_requests(seed);
            ArenaPlan plan = plan_arena(reqs, alignment);
            check_plan(reqs, plan, alignment);
            EXPECT_EQ(arena_live_peak(reqs, alignment), brute_force_peak(reqs, alignment));
            if (testing::Test::HasFailure()) return;
        }
    }
}

TEST(Arena, Deterministic) {
    for (uint32_t seed = 1; seed <= 20; seed++) {
        std::vector<ArenaRequest> reqs = random_requests(seed);
        ArenaPlan a = plan_arena(reqs, 64);
        ArenaPlan b = plan_arena(reqs, 64);
        EXPECT_EQ(a.offsets, b.offsets);
        EXPECT_EQ(a.size, b.size);
    }
}

TEST(Arena, ChainOfTwoLiveBuffersNeedsTwoSlots) {
    constexpr size_t size = 1000;  // 1024 once aligned to 64
    std::vector<ArenaRequest> reqs;
    for (int i = 0; i < 20; i++) reqs.push_back({size, i, i + 1});
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.size, 2 * align_up(size, 64));
    EXPECT_EQ(plan.size, arena_live_peak(reqs, 64));
    for (size_t i = 0; i < reqs.size(); i++) EXPECT_EQ(plan.offsets[i], (i % 2) * 1024) << i;
}

TEST(Arena, BuffersDisjointInTimeReuseOffsetZero) {
    std::vector<ArenaRequest> reqs = {{4096, 0, 0}, {100, 1, 2}, {4096, 3, 3}, {8000, 4, 4}};
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 0, 0, 0}));
    // The last one is larger than anything freed: the free block at the end is extended.
    EXPECT_EQ(plan.size, align_up(8000, 64));
}

TEST(Arena, BestFitPicksSmallestFittingHole) {
    std::vector<ArenaRequest> reqs = {
        {512, 0, 0},  // 0: hole A [0, 512) after op 0
        {64, 0, 3},   // 1: separator at 512
        {256, 0, 0},  // 2: hole B [576, 832) after op 0
        {64, 0, 3},   // 3: separator at 832
        {200, 1, 3},  // 4: fits both holes; B is the smaller
        {448, 1, 3},  // 5: fits only A
    };
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 512, 576, 832, 576, 0}));
    EXPECT_EQ(plan.size, 896u);
}

TEST(Arena, EqualHolesTieToLowestOffset) {
    std::vector<ArenaRequest> reqs = {
        {256, 0, 0}, {64, 0, 2}, {256, 0, 0}, {64, 0, 2},
        {256, 1, 2},  // both holes fit exactly: the lower one wins
    };
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets[4], 0u);
    EXPECT_EQ(plan.size, 640u);
}

TEST(Arena, GrowsFromFreeBlockTouchingTheEnd) {
    std::vector<ArenaRequest> reqs = {
        {128, 0, 0},  // [0, 128), freed after op 0
        {64, 0, 5},   // [128, 192)
        {128, 0, 0},  // [192, 320), freed after op 0: touches the end
        {256, 1, 5},  // fits no hole: starts at 192 and extends the region to 448
    };
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 128, 192, 192}));
    EXPECT_EQ(plan.size, 448u);
}

TEST(Arena, FreeMergesNeighbours) {
    std::vector<ArenaRequest> reqs = {
        {64, 0, 0}, {64, 0, 0}, {64, 0, 0},  // three adjacent blocks, freed together
        {64, 0, 2},                          // keeps the region end busy
        {192, 1, 2},                         // needs all three merged
    };
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets[4], 0u);
    EXPECT_EQ(plan.size, 256u);
}

TEST(Arena, StartsArePlacedBeforeEndsAreFreed) {
    // Buffer 1 starts at the op where buffer 0 ends: both are in use there, so no sharing.
    std::vector<ArenaRequest> reqs = {{64, 0, 1}, {64, 1, 2}};
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 64}));
    EXPECT_EQ(plan.size, 128u);
}

TEST(Arena, ZeroByteRequestsOccupyNothing) {
    std::vector<ArenaRequest> reqs = {{0, 0, 3}, {100, 1, 2}, {0, 2, 2}};
    ArenaPlan plan = plan_arena(reqs, 64);
    EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 0, 0}));
    EXPECT_EQ(plan.size, 128u);
    EXPECT_EQ(arena_live_peak(reqs, 64), 128u);

    EXPECT_EQ(plan_arena({{0, 0, 0}}).size, 0u);
    EXPECT_EQ(plan_arena({}).size, 0u);
    EXPECT_EQ(arena_live_peak({}), 0u);
}

TEST(Arena, SizesRoundUpToAlignment) {
    ArenaPlan plan = plan_arena({{1, 0, 0}, {1, 0, 0}}, 256);
    EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 256}));
    EXPECT_EQ(plan.size, 512u);
}

TEST(Arena, LivePeak) {
    std::vector<ArenaRequest> reqs = {{64, 0, 2}, {128, 1, 1}, {256, 2, 4}, {64, 3, 3}};
    // op 0: 64, op 1: 192, op 2: 320, op 3: 320, op 4: 256
    EXPECT_EQ(arena_live_peak(reqs, 64), 320u);
}

TEST(ArenaDeathTest, FirstAfterLastAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(plan_arena({{64, 3, 1}}), "assertion failed: r.first");
    EXPECT_DEATH(arena_live_peak({{64, 3, 1}}), "assertion failed: r.first");
}

}  // namespace
}  // namespace memfit
