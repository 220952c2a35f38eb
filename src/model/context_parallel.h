// Context parallelism (--cp N, Megatron-Core's --context-parallel-size): the sequence of every
// micro-batch is split over the N ranks of a context group; each rank holds T / N positions of
// each sequence and runs every per-token op on them alone. Attention needs every position's keys
// and values: each layer all-gathers the group's k | v (the all-gather variant Llama 3 trains
// with, cheap under grouped-query attention), and its backward reduce-scatters their gradients
// back to the ranks that own the positions.
//
// With --cp-comm-type p2p the keys and values travel around the group as a ring instead (below).
//
// Load balance under the causal mask: the sequence is cut into 2N chunks of T / 2N positions and
// rank r holds chunks r and 2N - 1 - r (Megatron's and torchtitan's layout), so every rank's
// queries see about the same number of keys. A rank's local row t is chunk r's position t for
// t < T / 2N, and chunk 2N - 1 - r's position t - T / 2N after.
#pragma once

#include <cstdint>

namespace memfit {

struct ContextParallel {
    int ranks = 1, rank = 0;
    // --cp-comm-type p2p (Megatron's name): the ring (Liu et al. 2023) instead of the all-gather:
    // each rank's keys and values pass around the group block by block, every block's attention
    // merged into the queries' running softmax; a rank holds two blocks at a time, not the whole
    // sequence's, and the keys' and values' gradients travel with their block back to its owner.
    bool ring = false;
    bool enabled() const { return ranks > 1; }
    // Positions per chunk, of a sequence of T (a multiple of 2 x ranks: run/compat.cpp).
    int chunk(int T) const { return T / (2 * ranks); }
    // The chunk that rank r's half h (0, 1) holds.
    int chunk_of(int r, int h) const { return h == 0 ? r : 2 * ranks - 1 - r; }
    // The position in the whole sequence of this rank's local row t (0 <= t < T / ranks).
    int position(int t, int T) const {
        const int c = chunk(T);
        return chunk_of(rank, t / c) * c + t % c;
    }
};

}  // namespace memfit
