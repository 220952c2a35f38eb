#include "memory/step_memory.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "memory/arena.h"
#include "memory/budget.h"

#include <fmt/format.h>

namespace memfit {

namespace {

class HostAllocator final : public RegionAllocator {
public:
    void * allocate(size_t bytes) override {
        if (bytes == 0) return nullptr;
        void * p = std::aligned_alloc(4096, align_up(bytes, 4096));
        if (!p) throw Error("out of host memory: could not obtain " + format_bytes(bytes) +
                            "; lower --micro-batch or --seq, or pass --memory-budget to check the plan first");
        return p;
    }
    void release(void * p, size_t) override { std::free(p); }
};

}  // namespace

void RegionAllocator::poison(void * p, size_t bytes) { std::memset(p, 0xff, bytes); }

RegionAllocator & host_allocator() {
    static HostAllocator a;
    return a;
}

MemoryPlan plan_memory(const Program & program, size_t alignment, bool place) {
    MemoryPlan plan;
    plan.alignment = alignment;
    plan.placed = place;
    const auto & bufs = program.buffers();
    const int n_ops = program.num_ops();
    if (place) plan.offsets.assign(bufs.size(), 0);

    for (int c = 0; place && c < kCategoryCount; ++c) {
        std::vector<ArenaRequest> reqs;
        std::vector<size_t> ids;
        size_t end = 0;
        for (size_t i = 0; i < bufs.size(); ++i) {
            const auto & b = bufs[i];
            if (int(b.category) != c) continue;
            if (b.persistent) {                       // persistent: end to end
                plan.offsets[i] = end;
                end += align_up(b.bytes, alignment);
            } else if (b.first_op >= 0) {             // transient: by lifetime
                reqs.push_back(ArenaRequest{b.bytes, b.first_op, b.last_op});
                ids.push_back(i);
            }
        }
        plan.persistent.v[size_t(c)] = end;
        if (!reqs.empty()) {
            ArenaPlan ap = plan_arena(reqs, alignment);
            for (size_t k = 0; k < ids.size(); ++k) plan.offsets[ids[k]] = ap.offsets[k];
            plan.transient.v[size_t(c)] = ap.size;
        }
        plan.reserved.v[size_t(c)] = plan.persistent.v[size_t(c)] + plan.transient.v[size_t(c)];
    }

    // Live bytes per op: persistent buffers always, the others over [first, last]. Only the ops
    // where a buffer starts or ends change them, so the sweep visits those, found by a counting
    // sort of the buffers by first and by last op (4 bytes per op, not a CategoryBytes: a program
    // of many ops, such as the offloaded update's units, stays cheap to plan).
    CategoryBytes live;
    std::vector<uint32_t> first(size_t(n_ops) + 1, 0), last(size_t(n_ops) + 1, 0);
    for (const auto & b : bufs) {
        if (b.persistent) live[b.category] += b.bytes;
        else if (b.first_op >= 0) ++first[size_t(b.first_op) + 1], ++last[size_t(b.last_op) + 1];
    }
    for (size_t i = 0; i < size_t(n_ops); ++i) first[i + 1] += first[i], last[i + 1] += last[i];
    std::vector<uint32_t> by_first(first.back()), by_last(last.back());
    {
        std::vector<uint32_t> f(first.begin(), first.end() - 1), l(last.begin(), last.end() - 1);
        for (size_t i = 0; i < bufs.size(); ++i)
            if (!bufs[i].persistent && bufs[i].first_op >= 0) {
                by_first[f[size_t(bufs[i].first_op)]++] = uint32_t(i);
                by_last[l[size_t(bufs[i].last_op)]++] = uint32_t(i);
            }
    }
    plan.peak_live = live;
    plan.persistent_live = live;
    plan.peak_live_total = live.total();
    plan.peak_op = n_ops > 0 ? 0 : -1;
    for (size_t i = 0; i < size_t(n_ops); ++i) {
        if (first[i] == first[i + 1] && last[i] == last[i + 1]) continue;
        for (uint32_t k = first[i]; k < first[i + 1]; ++k) live[bufs[by_first[k]].category] += bufs[by_first[k]].bytes;
        for (size_t c = 0; c < kCategoryCount; ++c) plan.peak_live.v[c] = std::max(plan.peak_live.v[c], live.v[c]);
        if (live.total() > plan.peak_live_total) {
            plan.peak_live_total = live.total();
            plan.peak_op = int(i);
        }
        for (uint32_t k = last[i]; k < last[i + 1]; ++k) live[bufs[by_last[k]].category] -= bufs[by_last[k]].bytes;
    }
    return plan;
}

void * StepMemory::obtain(Category c, size_t bytes) {
    void * p = alloc_.allocate(bytes);
    owned_.push_back(Region{p, bytes, c});
    ledger_.reserve(c, bytes);
    return p;
}

StepMemory::StepMemory(const Program & program, const MemoryPlan & plan, Ledger & ledger,
                       RegionAllocator & alloc, bool checking, const StepMemory * share, OffloadStore * store)
    : program_(program), plan_(plan), ledger_(ledger), alloc_(alloc), checking_(checking), store_(store) {
    const auto & bufs = program.buffers();
    MF_ASSERT(plan.offsets.size() == bufs.size());
    base_.assign(bufs.size(), nullptr);
    offloaded_at_.assign(bufs.size(), 0);
    const size_t off = size_t(Category::offloaded);

    try {
        // Persistent buffers: bound by name to the sharer's when it has them; the rest are laid
        // end to end in regions of our own (exactly the plan's layout when nothing is shared).
        auto bound = [&](const BufferDecl & b) { return share && share->persistent_index(b.name) >= 0; };
        size_t own[kCategoryCount] = {};
        std::vector<size_t> own_offset(bufs.size(), 0);
        for (size_t i = 0; i < bufs.size(); ++i) {
            const auto & b = bufs[i];
            if (!b.persistent || bound(b)) continue;
            own_offset[i] = share ? own[size_t(b.category)] : plan.offsets[i];
            own[size_t(b.category)] += align_up(b.bytes, plan.alignment);
        }
        void * persistent_region[kCategoryCount] = {};
        for (size_t c = 0; c < kCategoryCount; ++c) {
            const Category cat = Category(c);
            if (c == off && own[c] > 0) {   // offloaded: the store, not a region
                if (share && share->store_) store_ = share->store_;
                if (!store_) throw Error("offloaded optimizer states need a store (--offload-dir, or a device's host memory)");
                store_reserved_ = store_->open(own[c]);
                ledger_.reserve(cat, store_reserved_);
            } else if (own[c] > 0) {
                persistent_region[c] = obtain(cat, own[c]);
            }
            if (c == off) continue;
            const size_t need = plan.transient.v[c];
            if (need == 0 || checking_) continue;   // checking mode: one block per buffer instead
            if (share && share->plan_.transient.v[c] >= need && share->transient_region_[c])
                transient_region_[c] = share->transient_region_[c];   // run inside the sharer's arena
            else
                transient_region_[c] = obtain(cat, need);
        }
        for (size_t i = 0; i < bufs.size(); ++i) {
            const auto & b = bufs[i];
            const size_t c = size_t(b.category);
            if (b.persistent && bound(b)) {
                const int j = share->persistent_index(b.name);
                base_[i] = share->base_[size_t(j)];
                offloaded_at_[i] = share->offloaded_at_[size_t(j)];
                if (c == off) store_ = share->store_;
            } else if (b.persistent && c == off) {
                offloaded_at_[i] = own_offset[i];
                ledger_.acquire(b.category, b.bytes);
                acquired_.push_back({b.category, b.bytes});
            } else if (b.persistent) {
                base_[i] = static_cast<char *>(persistent_region[c]) + own_offset[i];
                ledger_.acquire(b.category, b.bytes);
                acquired_.push_back({b.category, b.bytes});
            } else if (transient_region_[c]) {
                base_[i] = static_cast<char *>(transient_region_[c]) + plan.offsets[i];
            }
        }
    } catch (...) {
        for (auto & r : owned_) { alloc_.release(r.ptr, r.bytes); ledger_.unreserve(r.category, r.bytes); }
        for (auto & a : acquired_) ledger_.release(a.first, a.second);
        if (store_reserved_) ledger_.unreserve(Category::offloaded, store_reserved_);
        throw;
    }
}

StepMemory::~StepMemory() {
    for (auto & q : quarantine_) alloc_.release(q.first, q.second);
    for (auto & a : acquired_) ledger_.release(a.first, a.second);
    for (auto & r : owned_) {
        alloc_.release(r.ptr, r.bytes);
        ledger_.unreserve(r.category, r.bytes);
    }
    if (store_reserved_) ledger_.unreserve(Category::offloaded, store_reserved_);
}

int StepMemory::persistent_index(const std::string & name) const {
    const auto & bufs = program_.buffers();
    for (size_t i = 0; i < bufs.size(); ++i)
        if (bufs[i].persistent && bufs[i].name == name) return int(i);
    return -1;
}

void * StepMemory::persistent_base(const std::string & name) const {
    const int i = persistent_index(name);
    return i < 0 ? nullptr : base_[size_t(i)];
}

namespace {
std::atomic<long> g_fail_after{-1};
}  // namespace

void inject_acquire_failure(long after) { g_fail_after = after; }

void StepMemory::begin_op(int i) {
    for (BufferId id : program_.starts_at(i)) {
        const auto & b = program_.buffer(id);
        if (b.persistent) continue;
        if (g_fail_after >= 0 && g_fail_after-- == 0)
            throw OutOfMemory(fmt::format("allocation of {} ({}) failed (injected)", b.name, format_bytes(b.bytes)));
        if (checking_ && b.bytes) {
            // A block of its own, filled with NaN bytes so a read before the first write shows.
            void * p = alloc_.allocate(b.bytes);
            alloc_.poison(p, b.bytes);
            base_[size_t(id)] = p;
        }
        ledger_.acquire(b.category, b.bytes);
    }
}

void StepMemory::end_op(int i) {
    for (BufferId id : program_.ends_at(i)) {
        const auto & b = program_.buffer(id);
        if (b.persistent) continue;
        ledger_.release(b.category, b.bytes);
        if (checking_ && base_[size_t(id)]) {
            alloc_.poison(base_[size_t(id)], b.bytes);   // poison: later reads give NaN
            quarantine_.push_back({base_[size_t(id)], b.bytes});
            base_[size_t(id)] = nullptr;
        }
    }
    if (checking_ && i == program_.num_ops() - 1) {
        for (auto & q : quarantine_) alloc_.release(q.first, q.second);
        quarantine_.clear();
    }
}

CategoryBytes shared_reserved(const MemoryPlan & primary, const std::vector<const MemoryPlan *> & others) {
    MF_ASSERT(primary.placed);
    CategoryBytes r = primary.reserved;
    for (const MemoryPlan * p : others)
        for (size_t c = 0; c < kCategoryCount; ++c)
            if (p->transient.v[c] > primary.transient.v[c]) r.v[c] += p->transient.v[c];
    return r;
}

CategoryBytes shared_peak_live(const MemoryPlan & primary, const std::vector<const MemoryPlan *> & others) {
    CategoryBytes r = primary.peak_live;
    for (const MemoryPlan * p : others)
        for (size_t c = 0; c < kCategoryCount; ++c)
            r.v[c] = std::max(r.v[c], p->peak_live.v[c] - p->persistent_live.v[c] + primary.persistent_live.v[c]);
    return r;
}

}  // namespace memfit
