// Placement and execution-time accounting of a recorded Program.
//
// plan_memory() is the planner's half: a pure function of the program that places every buffer
// (one arena region per category; persistent buffers live for the whole program) and predicts
// the peak of live bytes and the reserved bytes per category. It allocates nothing.
//
// StepMemory is the engine's half: it obtains each category's region from an allocator
// (counting reserved bytes in the ledger as it does), hands out base pointers, and during
// execution acquires a buffer in the ledger at its first op and releases it after its last,
// so the ledger *measures* live bytes from what the executing loop actually does.
//
// In checking mode every non-persistent buffer instead gets its own allocation at first use,
// which is poisoned (NaN bytes) after its declared last use and freed at the end of the step:
// a kernel that reads a buffer after its declared lifetime reads NaN (and ASan builds catch the
// free). Results must then equal normal mode bit for bit.
#pragma once

#include <cstddef>
#include <vector>

#include "memory/category.h"
#include "memory/ledger.h"
#include "memory/offload_store.h"
#include "memory/program.h"

namespace memfit {

// Each category has up to two regions: one for persistent buffers (laid end to end) and one
// arena for the step's transient buffers (placed by lifetime).
struct MemoryPlan {
    std::vector<size_t> offsets;  // per buffer: offset in its region
    CategoryBytes persistent;     // persistent region size per category
    CategoryBytes transient;      // transient arena size per category
    CategoryBytes reserved;       // persistent + transient: what will be obtained
    CategoryBytes peak_live;      // max over ops of live bytes per category
    CategoryBytes persistent_live;// bytes of the persistent buffers (live throughout)
    uint64_t peak_live_total = 0; // max over ops of the sum of all categories
    int      peak_op = -1;        // op at which the total peaks
    size_t   alignment = 64;
    bool     placed = true;       // false: the live bytes only (no offsets, transient or reserved)
};

// Places every buffer and sums the live bytes per op. place = false computes the live bytes only
// (what `memfit plan` needs of the engine's programs; the placement is most of the cost).
MemoryPlan plan_memory(const Program & program, size_t alignment = 64, bool place = true);

// Programs that run on a primary program's persistent buffers (bound by name, as StepMemory's
// `share` does) and inside its transient arenas where they fit: what all of them obtain
// together, and their peak live bytes (the shared persistent bytes plus each one's transients).
CategoryBytes shared_reserved(const MemoryPlan & primary, const std::vector<const MemoryPlan *> & others);
CategoryBytes shared_peak_live(const MemoryPlan & primary, const std::vector<const MemoryPlan *> & others);

// Obtains and returns regions. The host allocator is the default; the CUDA backend brings its
// own (one cudaMalloc per region).
class RegionAllocator {
public:
    virtual ~RegionAllocator() = default;
    virtual void * allocate(size_t bytes) = 0;   // throws memfit::Error when it cannot
    virtual void   release(void * p, size_t bytes) = 0;
    // Checking mode: fills bytes with 0xff (NaN in every float type) so a read outside a
    // buffer's lifetime shows.
    virtual void   poison(void * p, size_t bytes);
};
RegionAllocator & host_allocator();

class StepMemory {
public:
    // Obtains the regions of `plan` for `program`. If `share` is given, persistent buffers that
    // `share` also holds are bound to its (by name), and the transient arenas reuse `share`'s
    // when they are large enough (an evaluation program running in the training one's memory).
    // The `offloaded` category's persistent buffers are placed in `store` (opened here with the
    // plan's region size; a sharer's store when bound by name) instead of a region: they have
    // no address, only an offset in the store.
    StepMemory(const Program & program, const MemoryPlan & plan, Ledger & ledger,
               RegionAllocator & alloc, bool checking = false, const StepMemory * share = nullptr,
               OffloadStore * store = nullptr);
    ~StepMemory();
    StepMemory(const StepMemory &) = delete;
    StepMemory & operator=(const StepMemory &) = delete;

    // Execution hooks, called by the graph around op `i`.
    void begin_op(int i);
    void end_op(int i);
    // Base address of a buffer (valid between its begin and end in checking mode).
    void * base(BufferId id) const { return base_[size_t(id)]; }
    // The persistent buffer of this name, or null.
    void * persistent_base(const std::string & name) const;
    // An offloaded buffer's byte offset in store().
    uint64_t offloaded_at(BufferId id) const { return offloaded_at_[size_t(id)]; }
    OffloadStore * store() const { return store_; }

    const Program & program() const { return program_; }
    const Ledger & ledger() const { return ledger_; }
    const MemoryPlan & plan() const { return plan_; }

private:
    const Program & program_;
    const MemoryPlan & plan_;
    Ledger & ledger_;
    RegionAllocator & alloc_;
    bool checking_;
    struct Region { void * ptr; size_t bytes; Category category; };
    std::vector<void *> base_;
    std::vector<uint64_t> offloaded_at_;
    OffloadStore * store_ = nullptr;
    uint64_t store_reserved_ = 0;                        // what this memory opened store_ with
    int persistent_index(const std::string & name) const;   // -1: none of that name
    std::vector<Region> owned_;                          // obtained here, released in the destructor
    std::vector<std::pair<Category, size_t>> acquired_;  // persistent live bytes we hold
    std::vector<std::pair<void *, size_t>> quarantine_;  // checking mode: poisoned, freed at end
    void * transient_region_[kCategoryCount] = {};
    void * obtain(Category c, size_t bytes);
};

// Fault injection for tests of run-time re-planning: the `after`-th transient buffer acquired
// from now on (0: the next) fails with OutOfMemory, as an allocation would. -1 disarms.
void inject_acquire_failure(long after);

}  // namespace memfit
