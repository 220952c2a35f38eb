// The step program: an ordered list of operations and the buffers they touch. Every buffer is
// declared up front (name, category, bytes); recording the ops fills in each buffer's first and
// last use. From this one description the engine places and executes, the planner predicts,
// and the profiler draws (docs/design.md, "One step, two runs").
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "memory/category.h"

namespace memfit {

using BufferId = int32_t;

enum class Phase : uint8_t { forward, backward, recompute, communication, optimizer, other };
const char * phase_name(Phase p);

struct BufferDecl {
    std::string name;
    Category    category   = Category::activations;
    size_t      bytes      = 0;
    bool        persistent = false;  // lives across steps (weights, grads, moments): own region
    int         first_op   = -1;     // filled by recording; -1 while unused
    int         last_op    = -1;
};

// The buffers one op touches, each once: a few inline, more on the heap. Recording a large
// model's step takes hundreds of thousands of ops, and an allocation each was a fifth of
// `memfit plan`'s search.
class BufferIds {
public:
    BufferIds() = default;
    BufferIds(std::initializer_list<BufferId> ids) {
        for (BufferId id : ids) push_back(id);
    }
    void push_back(BufferId id) {
        if (n_ < kInline) {
            inline_[n_] = id;
        } else {
            if (n_ == kInline) heap_.assign(inline_, inline_ + kInline);
            heap_.push_back(id);
        }
        ++n_;
    }
    void reserve(size_t n) {
        if (n > kInline) heap_.reserve(n);
    }
    const BufferId * begin() const { return n_ <= kInline ? inline_ : heap_.data(); }
    const BufferId * end() const { return begin() + n_; }
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    friend bool operator==(const BufferIds & a, const std::vector<BufferId> & b) {
        return std::equal(a.begin(), a.end(), b.begin(), b.end());
    }

private:
    static constexpr size_t kInline = 10;
    BufferId inline_[kInline] = {};
    size_t n_ = 0;
    std::vector<BufferId> heap_;
};

struct OpRecord {
    const char *          name  = "";    // static string: "matmul_fwd", ...
    Phase                 phase = Phase::other;
    int                   layer = -1;    // transformer block, -1 outside the blocks
    double                flops = 0;     // floating-point operations
    double                bytes = 0;     // bytes read + written (for the time model)
    BufferIds             uses;          // buffers read or written, each once
};

class Program {
public:
    BufferId declare(std::string name, Category category, size_t bytes, bool persistent = false);
    // Grows a declared buffer (used for shared scratch whose size is the max over its uses).
    void grow(BufferId id, size_t bytes);
    // Appends an op; updates first/last use of every buffer it touches. Returns its index.
    int record(OpRecord op);

    const std::vector<BufferDecl> & buffers() const { return buffers_; }
    const std::vector<OpRecord> &   ops() const { return ops_; }
    const BufferDecl & buffer(BufferId id) const { return buffers_[size_t(id)]; }
    int num_ops() const { return int(ops_.size()); }

    // Buffers whose first (last) use is op i, in declaration order. Valid after finalize().
    std::span<const BufferId> starts_at(int op) const { return starts_.row(op); }
    std::span<const BufferId> ends_at(int op) const { return ends_.row(op); }
    // Indexes start/end lists; call once recording is complete.
    void finalize();

    double total_flops() const;
    double phase_flops(Phase p) const;   // FLOPs of the ops in one phase (e.g. recompute)

private:
    std::vector<BufferDecl> buffers_;
    std::vector<OpRecord> ops_;
    // Per op, a list of buffer ids, stored as one array (rows by op) and row offsets.
    struct Rows {
        std::vector<BufferId> ids;
        std::vector<size_t> begin;   // ops + 1 offsets into ids
        std::span<const BufferId> row(int op) const {
            return {ids.data() + begin[size_t(op)], begin[size_t(op) + 1] - begin[size_t(op)]};
        }
    };
    Rows starts_, ends_;
};

}  // namespace memfit
