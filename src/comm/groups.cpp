// Process groups: the tp x dp x pp layout (tensor innermost) and its sub-communicators.
#include "comm/groups.h"

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

ParallelLayout derive_layout(int world, int tp, int pp) {
    MF_ASSERT(world >= 1);
    if (tp < 1 || pp < 1)
        throw ConfigError(fmt::format("--tp {} x --pp {}: both must be at least 1", tp, pp));
    const long long cell = static_cast<long long>(tp) * pp;
    if (world % cell != 0) {
        const long long below = world / cell * cell, above = below + cell;
        const std::string hint = below > 0
            ? fmt::format("run on {} or {} ranks, or choose --tp/--pp whose product divides {}", below, above, world)
            : fmt::format("run on at least {} ranks, or choose --tp/--pp whose product divides {}", cell, world);
        throw ConfigError(fmt::format("{} rank{} cannot be laid out as --tp {} x --pp {}: the world size must be "
                                      "a multiple of tp x pp = {}; {}",
                                      world, world == 1 ? "" : "s", tp, pp, cell, hint));
    }
    return ParallelLayout{tp, pp, static_cast<int>(world / cell)};
}

const char * group_kind_name(GroupKind k) {
    switch (k) {
    case GroupKind::tensor: return "tensor";
    case GroupKind::pipeline: return "pipeline";
    case GroupKind::data: return "data";
    }
    MF_UNREACHABLE();
}

RankCoords rank_coords(const ParallelLayout & l, int rank) {
    MF_ASSERT(l.tp >= 1 && l.pp >= 1 && l.dp >= 1 && rank >= 0 && rank < l.world());
    RankCoords c;
    c.tp = rank % l.tp;
    c.dp = rank / l.tp % l.dp;
    c.pp = rank / (l.tp * l.dp);
    return c;
}

int world_rank_of(const ParallelLayout & l, const RankCoords & c) {
    MF_ASSERT(c.tp >= 0 && c.tp < l.tp && c.dp >= 0 && c.dp < l.dp && c.pp >= 0 && c.pp < l.pp);
    return (c.pp * l.dp + c.dp) * l.tp + c.tp;
}

std::vector<int> group_members(const ParallelLayout & l, GroupKind k, int rank) {
    RankCoords c = rank_coords(l, rank);
    const int n = k == GroupKind::tensor ? l.tp : k == GroupKind::pipeline ? l.pp : l.dp;
    int & axis = k == GroupKind::tensor ? c.tp : k == GroupKind::pipeline ? c.pp : c.dp;
    std::vector<int> out;
    out.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        axis = i;
        out.push_back(world_rank_of(l, c));
    }
    return out;
}

std::vector<std::vector<int>> all_groups(const ParallelLayout & l, GroupKind k) {
    std::vector<std::vector<int>> out;
    std::vector<bool> seen(static_cast<size_t>(l.world()), false);
    for (int r = 0; r < l.world(); ++r) {
        if (seen[static_cast<size_t>(r)]) continue;
        out.push_back(group_members(l, k, r));
        for (int m : out.back()) seen[static_cast<size_t>(m)] = true;
    }
    return out;
}

int pipeline_prev(const ParallelLayout & l, int rank) {
    RankCoords c = rank_coords(l, rank);
    if (c.pp == 0) return -1;
    --c.pp;
    return world_rank_of(l, c);
}

int pipeline_next(const ParallelLayout & l, int rank) {
    RankCoords c = rank_coords(l, rank);
    if (c.pp == l.pp - 1) return -1;
    ++c.pp;
    return world_rank_of(l, c);
}

namespace {

// This rank's group of kind k: the color is the group's first member (equal exactly for the
// ranks of one group), the key its coordinate along the group.
std::unique_ptr<Communicator> split_group(Communicator & world, const ParallelLayout & l, GroupKind k) {
    const int rank = world.rank();
    const std::vector<int> members = group_members(l, k, rank);
    const RankCoords c = rank_coords(l, rank);
    const int key = k == GroupKind::tensor ? c.tp : k == GroupKind::pipeline ? c.pp : c.dp;
    auto g = world.split(members.front(), key);
    MF_ASSERT(g->size() == static_cast<int>(members.size()) && g->rank() == key);
    return g;
}

}  // namespace

ProcessGroups::ProcessGroups(Communicator & world, const ParallelLayout & l) : layout(l), world_rank(world.rank()) {
    if (world.size() != l.world())
        throw ConfigError(fmt::format("the layout --tp {} x --pp {} x dp {} needs {} ranks, the job has {}",
                                      l.tp, l.pp, l.dp, l.world(), world.size()));
    coords = rank_coords(l, world_rank);
    tp = split_group(world, l, GroupKind::tensor);
    dp = split_group(world, l, GroupKind::data);
    pp = split_group(world, l, GroupKind::pipeline);
    if (l.cp > 1) {
        MF_ASSERT(l.dp % l.cp == 0);
        cp = dp->split(coords.dp / l.cp, coords.dp % l.cp);
    }
    // The ends of the pipeline (their own group; the middle stages get one they never use).
    if (l.pp > 1) emb = pp->split(coords.pp == 0 || coords.pp == l.pp - 1 ? 0 : 1, coords.pp);
}

Communicator & ProcessGroups::group(GroupKind k) const {
    switch (k) {
    case GroupKind::tensor: return *tp;
    case GroupKind::pipeline: return *pp;
    case GroupKind::data: return *dp;
    }
    MF_UNREACHABLE();
}

}  // namespace memfit
