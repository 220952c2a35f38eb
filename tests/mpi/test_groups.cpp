// Process groups over MPI ranks (memfit_mpi_tests, mpirun -n 2 and -n 4): split() by color and
// key, and ProcessGroups for every tp x pp layout of the world size (at 4 ranks: tp4, pp4, dp4,
// tp2 x pp2, tp2 x dp2, pp2 x dp2; at 2: tp2, pp2, dp2). Every rank builds every layout in the
// same order (splitting is collective over the world).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/groups.h"
#include "core/error.h"
#include "mpi_test_env.h"

namespace memfit::test {
namespace {

std::vector<ParallelLayout> every_layout(int world) {
    std::vector<ParallelLayout> out;
    for (int tp = 1; tp <= world; ++tp)
        for (int pp = 1; tp * pp <= world; ++pp)
            if (world % (tp * pp) == 0) out.push_back(derive_layout(world, tp, pp));
    return out;
}

std::string name(const ParallelLayout & l) {
    return "tp" + std::to_string(l.tp) + " x pp" + std::to_string(l.pp) + " x dp" + std::to_string(l.dp);
}

TEST(MpiGroups, SplitByColorAndKey) {
    Communicator & w = world();
    const int R = w.size(), me = w.rank();
    // Two colors by parity, ranked in reverse (key = -rank).
    std::unique_ptr<Communicator> par = w.split(me % 2, -me);
    std::vector<int> same;   // world ranks of my parity, in the new rank order (descending)
    for (int r = R - 1; r >= 0; --r)
        if (r % 2 == me % 2) same.push_back(r);
    ASSERT_EQ(par->size(), static_cast<int>(same.size()));
    EXPECT_STREQ(par->name(), w.name());
    const std::vector<uint64_t> got = par->all_gather_u64(static_cast<uint64_t>(me));
    ASSERT_EQ(got.size(), same.size());
    for (size_t i = 0; i < same.size(); ++i) {
        EXPECT_EQ(got[i], static_cast<uint64_t>(same[i])) << i;
        if (same[i] == me) {
            EXPECT_EQ(par->rank(), static_cast<int>(i));
        }
    }
    // One color, equal keys: ties keep the parent's order, a copy of the world.
    std::unique_ptr<Communicator> all = w.split(0, 0);
    EXPECT_EQ(all->size(), R);
    EXPECT_EQ(all->rank(), me);
    // A split of a split, and collectives on one do not mix with the other's.
    std::unique_ptr<Communicator> solo = par->split(par->rank(), 0);
    EXPECT_EQ(solo->size(), 1);
    EXPECT_EQ(solo->rank(), 0);
    float x = static_cast<float>(me + 1);
    solo->all_reduce_sum(&x, 1, DType::f32);
    EXPECT_EQ(x, static_cast<float>(me + 1));
    float y = static_cast<float>(me + 1);
    par->all_reduce_sum(&y, 1, DType::f32);
    float want = 0.0f;
    for (int r : same) want += static_cast<float>(r + 1);
    EXPECT_EQ(y, want);
    // The parent may go first; the split lives on.
    all.reset();
    par->barrier();
}

TEST(MpiGroups, ErrorsOnASplitNameTheWorldRank) {
    Communicator & w = world();
    const int N = w.size();
    ASSERT_GE(N, 2) << "run under mpirun -np 2 or more";
    // The two highest world ranks, in reverse: world N-1 is rank 0 of the group, world N-2 rank 1.
    std::unique_ptr<Communicator> top = w.split(w.rank() >= N - 2 ? 1 : 0, -w.rank());
    const uint64_t eight = 42;
    if (w.rank() == N - 1) {
        top->send(&eight, 8, 1, 9);
    } else if (w.rank() == N - 2) {
        unsigned char buf[16];
        try {
            top->recv(buf, 16, 0, 9);
            ADD_FAILURE() << "a short message must throw";
        } catch (const CommError & e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(fmt::format("rank 1 of 2 (world rank {})", N - 2)), std::string::npos) << msg;
        }
    }
    w.barrier();
}

// In every group of every layout: the group has the axis's members in coordinate order, a sum
// adds exactly its members' values, and pipeline neighbours exchange activations forward and
// gradients backward, both through the pipeline group and through the world with the
// neighbours' world ranks.
TEST(MpiGroups, EveryLayoutsGroupsSumTheirMembers) {
    Communicator & w = world();
    const int me = w.rank();
    for (const ParallelLayout & l : every_layout(w.size())) {
        SCOPED_TRACE(name(l));
        const ProcessGroups g(w, l);
        EXPECT_EQ(g.world_rank, me);
        const RankCoords c = rank_coords(l, me);
        EXPECT_EQ(g.coords.tp, c.tp);
        EXPECT_EQ(g.coords.pp, c.pp);
        EXPECT_EQ(g.coords.dp, c.dp);
        EXPECT_EQ(g.tp->rank(), c.tp);
        EXPECT_EQ(g.pp->rank(), c.pp);
        EXPECT_EQ(g.dp->rank(), c.dp);
        for (GroupKind k : {GroupKind::tensor, GroupKind::pipeline, GroupKind::data}) {
            SCOPED_TRACE(group_kind_name(k));
            Communicator & comm = g.group(k);
            const std::vector<int> members = group_members(l, k, me);
            ASSERT_EQ(comm.size(), static_cast<int>(members.size()));
            std::vector<uint64_t> want_ranks(members.begin(), members.end());
            EXPECT_EQ(comm.all_gather_u64(static_cast<uint64_t>(me)), want_ranks);
            // 2^rank per rank (exact in fp32), and a second element to catch offsets.
            float v[2] = {static_cast<float>(1u << me), static_cast<float>(me)};
            comm.all_reduce_sum(v, 2, DType::f32);
            float want0 = 0.0f, want1 = 0.0f;
            for (int m : members) {
                want0 += static_cast<float>(1u << m);
                want1 += static_cast<float>(m);
            }
            EXPECT_EQ(v[0], want0);
            EXPECT_EQ(v[1], want1);
        }

        // Forward: stage s receives from s-1 and sends to s+1 (a chain, so blocking sends cannot
        // deadlock); backward the other way.
        EXPECT_EQ(g.prev_stage_world_rank(), pipeline_prev(l, me));
        EXPECT_EQ(g.next_stage_world_rank(), pipeline_next(l, me));
        EXPECT_EQ(g.first_stage(), c.pp == 0);
        EXPECT_EQ(g.last_stage(), c.pp == l.pp - 1);
        const int s = c.pp;
        auto msg = [](int from, int to, int dir) { return static_cast<uint64_t>(from * 1000 + to * 10 + dir); };
        uint64_t got = 0;
        if (!g.first_stage()) {
            g.pp->recv(&got, sizeof got, s - 1, 1);
            EXPECT_EQ(got, msg(g.prev_stage_world_rank(), me, 1));
        }
        if (!g.last_stage()) {
            const uint64_t out = msg(me, g.next_stage_world_rank(), 1);
            g.pp->send(&out, sizeof out, s + 1, 1);
        }
        // Backward, through the world communicator and world ranks.
        if (!g.last_stage()) {
            w.recv(&got, sizeof got, g.next_stage_world_rank(), 2);
            EXPECT_EQ(got, msg(g.next_stage_world_rank(), me, 2));
        }
        if (!g.first_stage()) {
            const uint64_t out = msg(me, g.prev_stage_world_rank(), 2);
            w.send(&out, sizeof out, g.prev_stage_world_rank(), 2);
        }
        w.barrier();
    }
}

TEST(MpiGroups, ALayoutOfTheWrongSizeIsAConfigErrorOnEveryRank) {
    Communicator & w = world();
    EXPECT_THROW(ProcessGroups(w, ParallelLayout{w.size() * 2, 1, 1}), ConfigError);
    EXPECT_THROW(derive_layout(w.size(), w.size() + 1, 1), ConfigError);
    w.barrier();
}

}  // namespace
}  // namespace memfit::test
