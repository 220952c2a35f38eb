#include "memory/program.h"

#include <algorithm>

#include "core/error.h"

namespace memfit {

const char * phase_name(Phase p) {
    switch (p) {
        case Phase::forward: return "forward";
        case Phase::backward: return "backward";
        case Phase::recompute: return "recompute";
        case Phase::communication: return "communication";
        case Phase::optimizer: return "optimizer";
        case Phase::other: return "other";
    }
    return "?";
}

BufferId Program::declare(std::string name, Category category, size_t bytes, bool persistent) {
    buffers_.push_back(BufferDecl{std::move(name), category, bytes, persistent, -1, -1});
    return BufferId(buffers_.size() - 1);
}

void Program::grow(BufferId id, size_t bytes) {
    auto & b = buffers_[size_t(id)];
    b.bytes = std::max(b.bytes, bytes);
}

int Program::record(OpRecord op) {
    const int index = int(ops_.size());
    for (BufferId id : op.uses) {
        MF_ASSERT(id >= 0 && size_t(id) < buffers_.size());
        auto & b = buffers_[size_t(id)];
        if (b.first_op < 0) b.first_op = index;
        b.last_op = index;
    }
    ops_.push_back(std::move(op));
    return index;
}

void Program::finalize() {
    // Counting sort of the buffers by first and by last op: ids stay in declaration order.
    auto index = [&](Rows & rows, auto op_of) {
        rows.begin.assign(ops_.size() + 1, 0);
        for (const auto & b : buffers_)
            if (b.first_op >= 0) ++rows.begin[size_t(op_of(b)) + 1];
        for (size_t i = 0; i < ops_.size(); ++i) rows.begin[i + 1] += rows.begin[i];
        rows.ids.resize(rows.begin.back());
        std::vector<size_t> at(rows.begin.begin(), rows.begin.end() - 1);
        for (size_t i = 0; i < buffers_.size(); ++i)
            if (buffers_[i].first_op >= 0) rows.ids[at[size_t(op_of(buffers_[i]))]++] = BufferId(i);
    };
    index(starts_, [](const BufferDecl & b) { return b.first_op; });
    index(ends_, [](const BufferDecl & b) { return b.last_op; });
}

double Program::total_flops() const {
    double f = 0;
    for (const auto & op : ops_) f += op.flops;
    return f;
}

double Program::phase_flops(Phase p) const {
    double f = 0;
    for (const auto & op : ops_)
        if (op.phase == p) f += op.flops;
    return f;
}

}  // namespace memfit
