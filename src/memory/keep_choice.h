// Keep choice for `--recompute budget`: which saved activations to keep so that backward's
// recompute FLOPs are minimal within a byte budget. Each of a chain's layers has "saved units"
// (tensors forward makes and backward needs: a norm output, the qkv projection, the MLP
// activations). Keeping a unit holds its bytes from forward to backward; dropping it costs the
// FLOPs of recomputing it once in backward. Costs are additive and independent per unit, so the
// problem is a 0/1 knapsack over all units of all layers: total kept bytes <= budget, least
// dropped FLOPs (equivalently, most FLOPs saved by keeping).
//
// Exact solver: dynamic programming on Pareto frontiers of (bytes kept, flops saved). Units with
// equal (bytes, flops) are interchangeable wherever they sit, so they are grouped into types with
// a count (identical layers give each type L copies); a plan is then, up to equal totals, a
// count kept per type. Types are merged one at a time: a frontier holds every non-dominated
// (bytes, saved) reachable by counts of the types so far within the budget; a type of c copies
// merges as chunks of 1, 2, 4, ... copies plus a remainder (every count 0..c is a sum of a
// subset), each chunk a linear merge of two sorted lists that drops sums over the budget and
// dominated points (sort by bytes, keep strictly rising saved). The last type (the smallest units)
// is not merged: each final point keeps as many of its copies as fit. Back-pointers (predecessor
// point, chunk taken) rebuild the counts; a type's kept copies go to its lowest layers first.
//
// Why exact. Take an optimum O (least flops, then fewest bytes) and its counts on the types so
// far, P. If P is not on the frontier, a frontier point Q dominates it (bytes <=, saved >=);
// giving Q the rest of O's counts stays within the budget and saves no less, so by O's choice
// it has O's exact totals. Merging enumerates every extension of every frontier point; pruning
// only drops points dominated by a kept one, and the budget cut drops points no extension brings
// back under (bytes never fall). By induction the final frontier holds a point that completes to
// O's totals, and the last type's most-that-fit completion of that point saves at least as much
// (each copy saves flops), hence exactly as much. Units that save no flops are never kept (ties
// go to fewer bytes); units of zero bytes always are. Flops are doubles: sums are exact while
// they are integers below 2^53 (FLOP counts of real models are), otherwise equal up to rounding.
//
// Size. A frontier has at most one point per distinct byte sum <= budget. Identical layers give
// few types and few distinct sums: 80 GPT-style layers of 8 units take well under a millisecond
// (tests/memory/test_keep_choice.cpp prints it). Layers of unrelated sizes make every unit its own type
// and the frontier can grow like a knapsack table, bounded by the distinct reachable sums.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace memfit {

// One saved unit: bytes held if it is kept; FLOPs to recompute it if it is dropped.
struct KeepCost {
    uint64_t bytes = 0;
    double   flops = 0;
};

// A keep set of one layer: bit i of mask set means unit i is kept; bytes sums the kept units,
// flops the dropped ones.
struct KeepSet {
    uint32_t mask  = 0;
    uint64_t bytes = 0;
    double   flops = 0;
};

// Every non-dominated keep set of one layer, sorted by bytes ascending with flops strictly
// descending: the first has 0 bytes (it keeps only free units), the last the least flops. Among
// subsets with equal (bytes, flops) the smallest mask is returned. units.size() <= 16. A layer's
// menu, for reports and checks: every layer of a min_recompute plan sits on one of its points.
std::vector<KeepSet> pareto_keep_sets(const std::vector<KeepCost> & units);

// The kept mask per layer and the totals, summed from the masks. bytes includes min_recompute's
// fixed_bytes.
struct KeepPlan {
    std::vector<uint32_t> mask;
    uint64_t bytes = 0;
    double   flops = 0;
};

// Least total recompute flops over all layers (layers[l] is layer l's units, at most 32) with
// fixed_bytes + kept bytes <= budget. fixed_bytes is what the caller holds regardless of the
// choice (for instance each layer's input, which recomputation starts from); keeping nothing
// always fits otherwise, so std::nullopt means exactly fixed_bytes > budget, and the caller
// reports fixed_bytes as the smallest need. Exact and deterministic; of plans with equal least
// flops the one with fewest bytes is returned.
std::optional<KeepPlan> min_recompute(const std::vector<std::vector<KeepCost>> & layers, uint64_t budget,
                                      uint64_t fixed_bytes = 0);

}  // namespace memfit
