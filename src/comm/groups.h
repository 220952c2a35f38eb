// Process groups for tensor, pipeline and data parallelism (issue 10): `--tp T --pp P` on N
// ranks, the data-parallel size D following from the world size, N = T * P * D.
//
// Layout: tensor parallel innermost, then data parallel, then pipeline (Megatron-LM's order):
//
//     world rank = (pp_rank * dp + dp_rank) * tp + tp_rank
//
// A tensor group's ranks are consecutive, so with the usual launch (consecutive ranks on one
// node, tp <= ranks per node) one node holds whole tensor groups: tensor parallelism, which
// communicates inside every layer, stays on the node's fastest links. A data group's ranks are
// tp apart (one gradient all-reduce per step); a pipeline group's ranks are tp * dp apart (one
// activation send/recv per micro-batch and stage boundary).
//
// Example, 8 ranks as --tp 2 --pp 2 (dp 2): tensor groups {0,1} {2,3} {4,5} {6,7}; data groups
// {0,2} {1,3} {4,6} {5,7}; pipeline groups {0,4} {1,5} {2,6} {3,7}. Stage 0 is ranks 0-3.
//
// The pure functions (layout, coordinates, members) need no communicator; ProcessGroups splits
// a world communicator into this rank's three groups. Within a group, ranks are ordered by
// their coordinate along it: a tensor group's rank i is tp_rank i, a pipeline group's rank s is
// stage s.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace memfit {

struct ParallelLayout {
    int tp = 1, pp = 1, dp = 1;
    // Context parallel (model/context_parallel.h): the data axis's innermost cp ranks share their
    // sequences, each holding 1/cp of every one (Megatron's order: tp, cp, dp, pp). dp counts
    // them: the data group (gradients, ZeRO shards) spans dp ranks, the sequences dp / cp.
    int cp = 1;
    int world() const { return tp * pp * dp; }
};

// The layout of `world` ranks as tp x pp x dp: dp = world / (tp * pp). Throws ConfigError when
// tp or pp is below 1 or world is not a multiple of tp * pp.
ParallelLayout derive_layout(int world, int tp, int pp);

// A rank's position along each axis.
struct RankCoords {
    int tp = 0, pp = 0, dp = 0;
};

enum class GroupKind { tensor, pipeline, data };
const char * group_kind_name(GroupKind k);   // "tensor" | "pipeline" | "data"

// Rank <-> coordinates under the order above (MF_ASSERT on out-of-range arguments).
RankCoords rank_coords(const ParallelLayout & l, int rank);
int world_rank_of(const ParallelLayout & l, const RankCoords & c);

// The world ranks of `rank`'s group of kind k, in the group's rank order (ascending).
std::vector<int> group_members(const ParallelLayout & l, GroupKind k, int rank);
// Every group of kind k, each in its rank order, ordered by their first member (each rank is
// in exactly one).
std::vector<std::vector<int>> all_groups(const ParallelLayout & l, GroupKind k);
// The world rank of the previous / next pipeline stage of `rank` (same tp and dp coordinates),
// or -1 at the first / last stage.
int pipeline_prev(const ParallelLayout & l, int rank);
int pipeline_next(const ParallelLayout & l, int rank);

// This rank's three groups: sub-communicators of the world one (split(), so building them is
// collective over the world: every rank constructs ProcessGroups in the same order). A group of
// size 1 is still a communicator (every collective is the identity).
struct ProcessGroups {
    ParallelLayout layout;
    int world_rank = 0;
    RankCoords coords;
    std::unique_ptr<Communicator> tp, pp, dp;
    // With layout.cp > 1: this rank's context group (the cp consecutive data ranks sharing its
    // sequences; its rank is coords.dp % cp); null otherwise.
    std::unique_ptr<Communicator> cp;
    // With pp > 1: the first and the last stage of this rank's pipeline (a tied embedding's two
    // copies sum their gradients over it); null otherwise.
    std::unique_ptr<Communicator> emb;

    // Throws ConfigError when world.size() != layout.world().
    ProcessGroups(Communicator & world, const ParallelLayout & l);

    Communicator & group(GroupKind k) const;
    // World ranks of the previous / next pipeline stage, or -1; the same stages' ranks within
    // the pipeline group are coords.pp - 1 and coords.pp + 1.
    int prev_stage_world_rank() const { return pipeline_prev(layout, world_rank); }
    int next_stage_world_rank() const { return pipeline_next(layout, world_rank); }
    bool first_stage() const { return coords.pp == 0; }
    bool last_stage() const { return coords.pp == layout.pp - 1; }
};

}  // namespace memfit
