#include "memory/arena.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace memfit {

namespace {

bool is_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

// Rounds up a request's size, aborting rather than wrapping for sizes near SIZE_MAX.
size_t aligned_size(size_t bytes, size_t alignment) {
    MF_ASSERT(bytes <= SIZE_MAX - (alignment - 1));
    return align_up(bytes, alignment);
}

// Free list over one growing region. Blocks are kept sorted by offset and never touch each
// other (freeing merges neighbours), so every gap between blocks is in use.
class FreeList {
public:
    size_t allocate(size_t size) {
        // Best fit: the smallest block that holds size; the first such block on a tie, which
        // is the lowest offset since the list is sorted.
        size_t best = blocks_.size();
        for (size_t i = 0; i < blocks_.size(); i++) {
            if (blocks_[i].size >= size && (best == blocks_.size() || blocks_[i].size < blocks_[best].size)) {
                best = i;
            }
        }
        if (best != blocks_.size()) {
            Block & b = blocks_[best];
            size_t offset = b.offset;
            b.offset += size;
            b.size -= size;
            if (b.size == 0) blocks_.erase(blocks_.begin() + std::ptrdiff_t(best));
            return offset;
        }
        // Nothing fits: grow the region. A free block at the current end is the start of the
        // new space, so the region grows only by what that block lacks.
        size_t offset = end_;
        if (!blocks_.empty() && blocks_.back().offset + blocks_.back().size == end_) {
            offset = blocks_.back().offset;
            blocks_.pop_back();
        }
        MF_ASSERT(size <= SIZE_MAX - offset);
        end_ = offset + size;
        return offset;
    }

    void release(size_t offset, size_t size) {
        auto it = std::lower_bound(blocks_.begin(), blocks_.end(), offset,
                                   [](const Block & b, size_t off) { return b.offset < off; });
        MF_ASSERT(it == blocks_.end() || it->offset >= offset + size);          // no double free
        MF_ASSERT(it == blocks_.begin() || std::prev(it)->offset + std::prev(it)->size <= offset);
        bool merge_prev = it != blocks_.begin() && std::prev(it)->offset + std::prev(it)->size == offset;
        bool merge_next = it != blocks_.end() && it->offset == offset + size;
        if (merge_prev && merge_next) {
            std::prev(it)->size += size + it->size;
            blocks_.erase(it);
        } else if (merge_prev) {
            std::prev(it)->size += size;
        } else if (merge_next) {
            it->offset = offset;
            it->size += size;
        } else {
            blocks_.insert(it, Block{offset, size});
        }
    }

    size_t end() const { return end_; }

private:
    struct Block { size_t offset, size; };
    std::vector<Block> blocks_;
    size_t end_ = 0;
};

// Request indices ordered by key (first or last op), request index breaking ties.
template <class Key>
std::vector<size_t> order_by(const std::vector<ArenaRequest> & requests, Key key) {
    std::vector<size_t> order(requests.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key(requests[a]) < key(requests[b]); });
    return order;
}

}  // namespace

ArenaPlan plan_arena(const std::vector<ArenaRequest> & requests, size_t alignment) {
    MF_ASSERT(is_pow2(alignment));
    for (const ArenaRequest & r : requests) MF_ASSERT(r.first <= r.last);

    ArenaPlan plan;
    plan.offsets.assign(requests.size(), 0);

    // Walk the ops that start or end a buffer, in increasing order. At each op place every
    // buffer starting there, then free every buffer ending there: both are in use during it.
    std::vector<size_t> starts = order_by(requests, [](const ArenaRequest & r) { return r.first; });
    std::vector<size_t> ends   = order_by(requests, [](const ArenaRequest & r) { return r.last; });
    FreeList free_list;
    size_t s = 0, e = 0;
    while (e < ends.size()) {
        // first <= last for every request, so the next start is never after the next end
        // of the request that owns it; the op to process is the smaller of the two.
        int op = requests[ends[e]].last;
        if (s < starts.size()) op = std::min(op, requests[starts[s]].first);
        for (; s < starts.size() && requests[starts[s]].first == op; s++) {
            size_t i = starts[s];
            if (requests[i].bytes == 0) continue;
            plan.offsets[i] = free_list.allocate(aligned_size(requests[i].bytes, alignment));
        }
        for (; e < ends.size() && requests[ends[e]].last == op; e++) {
            size_t i = ends[e];
            if (requests[i].bytes == 0) continue;
            free_list.release(plan.offsets[i], aligned_size(requests[i].bytes, alignment));
        }
    }
    plan.size = free_list.end();
    return plan;
}

size_t arena_live_peak(const std::vector<ArenaRequest> & requests, size_t alignment) {
    MF_ASSERT(is_pow2(alignment));
    // +bytes at first, -bytes just after last; ops widened so last + 1 cannot overflow.
    std::vector<std::pair<int64_t, size_t>> adds, subs;
    for (const ArenaRequest & r : requests) {
        MF_ASSERT(r.first <= r.last);
        if (r.bytes == 0) continue;
        size_t bytes = aligned_size(r.bytes, alignment);
        adds.emplace_back(int64_t(r.first), bytes);
        subs.emplace_back(int64_t(r.last) + 1, bytes);
    }
    std::sort(adds.begin(), adds.end());
    std::sort(subs.begin(), subs.end());
    // At each op t, the live set is {first <= t} minus {last + 1 <= t}; it only grows at a
    // start, so the peak is found right after applying every event at a start op.
    size_t live = 0, peak = 0, j = 0;
    for (size_t i = 0; i < adds.size();) {
        int64_t t = adds[i].first;
        for (; j < subs.size() && subs[j].first <= t; j++) live -= subs[j].second;
        for (; i < adds.size() && adds[i].first == t; i++) live += adds[i].second;
        peak = std::max(peak, live);
    }
    return peak;
}

}  // namespace memfit
