// Process groups without MPI: the layout, the coordinates, group membership and the single
// communicator's split. The MPI side is tests/mpi/test_groups.cpp (mpirun -n 2 and -n 4).
#include "comm/groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace memfit {
namespace {

std::string config_error(int world, int tp, int pp) {
    try {
        derive_layout(world, tp, pp);
    } catch (const ConfigError & e) {
        return e.what();
    }
    return "";
}

TEST(Groups, LayoutDerivesDataParallelFromTheWorldSize) {
    const ParallelLayout a = derive_layout(8, 2, 2);
    EXPECT_EQ(a.tp, 2);
    EXPECT_EQ(a.pp, 2);
    EXPECT_EQ(a.dp, 2);
    EXPECT_EQ(a.world(), 8);
    const ParallelLayout b = derive_layout(1, 1, 1);
    EXPECT_EQ(b.dp, 1);
    EXPECT_EQ(derive_layout(12, 3, 1).dp, 4);
    EXPECT_EQ(derive_layout(12, 1, 4).dp, 3);
    EXPECT_EQ(derive_layout(4, 4, 1).dp, 1);
    EXPECT_EQ(derive_layout(4, 1, 1).dp, 4);
}

TEST(Groups, LayoutErrorsNameTheNumbersAndAHint) {
    const std::string e = config_error(4, 3, 1);
    EXPECT_NE(e.find("4 ranks cannot be laid out as --tp 3 x --pp 1: the world size must be a multiple of "
                     "tp x pp = 3"), std::string::npos) << e;
    EXPECT_NE(e.find("run on 3 or 6 ranks"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;

    const std::string small = config_error(2, 2, 2);
    EXPECT_NE(small.find("2 ranks cannot be laid out as --tp 2 x --pp 2"), std::string::npos) << small;
    EXPECT_NE(small.find("at least 4 ranks"), std::string::npos) << small;

    const std::string one = config_error(1, 1, 2);
    EXPECT_NE(one.find("1 rank cannot"), std::string::npos) << one;

    EXPECT_NE(config_error(4, 0, 1).find("--tp 0 x --pp 1: both must be at least 1"), std::string::npos);
    EXPECT_NE(config_error(4, 1, -1).find("at least 1"), std::string::npos);
}

// 8 ranks as tp2 x pp2 x dp2: rank = (pp * dp + dp_rank) * tp + tp_rank.
TEST(Groups, CoordinatesPutTensorParallelInnermost) {
    const ParallelLayout l = derive_layout(8, 2, 2);
    struct Want { int tp, dp, pp; };
    const Want want[8] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
                          {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
    for (int r = 0; r < 8; ++r) {
        const RankCoords c = rank_coords(l, r);
        EXPECT_EQ(c.tp, want[r].tp) << r;
        EXPECT_EQ(c.dp, want[r].dp) << r;
        EXPECT_EQ(c.pp, want[r].pp) << r;
        EXPECT_EQ(world_rank_of(l, c), r);
    }
    EXPECT_EQ(group_members(l, GroupKind::tensor, 5), (std::vector<int>{4, 5}));
    EXPECT_EQ(group_members(l, GroupKind::data, 5), (std::vector<int>{5, 7}));
    EXPECT_EQ(group_members(l, GroupKind::pipeline, 5), (std::vector<int>{1, 5}));
    EXPECT_EQ(all_groups(l, GroupKind::tensor), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(all_groups(l, GroupKind::data), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
    EXPECT_EQ(all_groups(l, GroupKind::pipeline), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(Groups, PipelineNeighboursShareTensorAndDataCoordinates) {
    const ParallelLayout l = derive_layout(12, 2, 3);   // dp 2; a stage is 4 ranks
    EXPECT_EQ(pipeline_prev(l, 1), -1);
    EXPECT_EQ(pipeline_next(l, 1), 5);
    EXPECT_EQ(pipeline_prev(l, 6), 2);
    EXPECT_EQ(pipeline_next(l, 6), 10);
    EXPECT_EQ(pipeline_prev(l, 11), 7);
    EXPECT_EQ(pipeline_next(l, 11), -1);
    for (int r = 0; r < 12; ++r) {
        const RankCoords c = rank_coords(l, r);
        for (int n : {pipeline_prev(l, r), pipeline_next(l, r)}) {
            if (n < 0) continue;
            const RankCoords d = rank_coords(l, n);
            EXPECT_EQ(d.tp, c.tp);
            EXPECT_EQ(d.dp, c.dp);
            EXPECT_EQ(std::abs(d.pp - c.pp), 1);
        }
    }
    const ParallelLayout flat = derive_layout(4, 1, 1);
    for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(pipeline_prev(flat, r), -1);
        EXPECT_EQ(pipeline_next(flat, r), -1);
    }
}

// Every rank is in exactly one group of each kind, the groups have the axis's size, and a
// rank's group seen from any of its members is the same list.
TEST(Groups, EveryRankIsInExactlyOneGroupOfEachKind) {
    for (int world : {1, 2, 4, 6, 8, 12, 16, 24}) {
        for (int tp = 1; tp <= world; ++tp) {
            for (int pp = 1; tp * pp <= world; ++pp) {
                if (world % (tp * pp) != 0) continue;
                const ParallelLayout l = derive_layout(world, tp, pp);
                for (GroupKind k : {GroupKind::tensor, GroupKind::pipeline, GroupKind::data}) {
                    const int n = k == GroupKind::tensor ? tp : k == GroupKind::pipeline ? pp : l.dp;
                    const auto groups = all_groups(l, k);
                    ASSERT_EQ(static_cast<int>(groups.size()), world / n) << group_kind_name(k);
                    std::vector<int> count(static_cast<size_t>(world), 0);
                    for (const auto & g : groups) {
                        ASSERT_EQ(static_cast<int>(g.size()), n);
                        EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
                        for (int m : g) {
                            ++count[static_cast<size_t>(m)];
                            EXPECT_EQ(group_members(l, k, m), g);
                        }
                    }
                    for (int r = 0; r < world; ++r)
                        EXPECT_EQ(count[static_cast<size_t>(r)], 1)
                            << "world " << world << " tp " << tp << " pp " << pp << " " << group_kind_name(k)
                            << " rank " << r;
                }
                // A tensor group's ranks are consecutive.
                for (const auto & g : all_groups(l, GroupKind::tensor))
                    EXPECT_EQ(g.back() - g.front(), tp - 1);
            }
        }
    }
}

TEST(Groups, SingleCommunicatorSplitsIntoAnotherSingle) {
    std::unique_ptr<Communicator> world = make_single_communicator();
    std::unique_ptr<Communicator> sub = world->split(3, 7);
    ASSERT_NE(sub, nullptr);
    EXPECT_NE(sub.get(), world.get());
    EXPECT_STREQ(sub->name(), "single");
    EXPECT_EQ(sub->rank(), 0);
    EXPECT_EQ(sub->size(), 1);
    // Its own mailbox: a message sent on the parent is not received on the split.
    const int v = 42;
    world->send(&v, sizeof v, 0, 1);
    int got = 0;
    EXPECT_THROW(sub->recv(&got, sizeof got, 0, 1), CommError);
    world->recv(&got, sizeof got, 0, 1);
    EXPECT_EQ(got, 42);
    // It outlives its parent.
    world.reset();
    float x = 1.5f;
    sub->all_reduce_sum(&x, 1, DType::f32);
    EXPECT_EQ(x, 1.5f);
}

TEST(Groups, ProcessGroupsOnOneProcess) {
    std::unique_ptr<Communicator> world = make_single_communicator();
    const ProcessGroups g(*world, derive_layout(1, 1, 1));
    EXPECT_EQ(g.world_rank, 0);
    for (GroupKind k : {GroupKind::tensor, GroupKind::pipeline, GroupKind::data}) {
        EXPECT_EQ(g.group(k).size(), 1);
        EXPECT_EQ(g.group(k).rank(), 0);
    }
    EXPECT_EQ(g.prev_stage_world_rank(), -1);
    EXPECT_EQ(g.next_stage_world_rank(), -1);
    EXPECT_TRUE(g.first_stage());
    EXPECT_TRUE(g.last_stage());
    try {
        ProcessGroups bad(*world, ParallelLayout{2, 1, 1});
        ADD_FAILURE() << "a 2-rank layout on 1 rank was accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("needs 2 ranks, the job has 1"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace memfit
