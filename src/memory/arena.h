// Arena planner: places buffers with known lifetimes at offsets in one region, so that buffers
// alive at the same operation never overlap. Best-fit over a sorted free list, merging
// neighbours on free, growing the region when nothing fits (as ggml's graph allocator does).
//
// Lifetimes are inclusive op ranges [first, last]. At each op, every buffer that starts there
// is placed before any buffer that ends there is freed, since both are in use during the op.
#pragma once

#include <cstddef>
#include <vector>

namespace memfit {

struct ArenaRequest {
    size_t bytes = 0;
    int    first = 0;   // first op that uses the buffer
    int    last  = 0;   // last op that uses the buffer (inclusive)
};

struct ArenaPlan {
    std::vector<size_t> offsets;   // one per request, aligned
    size_t size = 0;               // bytes the region must have
};

// Deterministic: the same requests always give the same plan. Zero-byte requests get offset 0
// and occupy nothing. alignment must be a power of two.
ArenaPlan plan_arena(const std::vector<ArenaRequest> & requests, size_t alignment = 64);

// Largest sum of (aligned) bytes alive at any op: the lower bound any placement must meet.
size_t arena_live_peak(const std::vector<ArenaRequest> & requests, size_t alignment = 64);

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

}  // namespace memfit
