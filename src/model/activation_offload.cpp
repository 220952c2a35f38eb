#include "model/activation_offload.h"

#include <algorithm>

#include "core/error.h"

namespace memfit {

namespace {

void note(std::vector<int> & at, int l, int pos) {
    if (at.size() <= size_t(l)) at.resize(size_t(l) + 1, -1);
    at[size_t(l)] = pos;
}

}  // namespace

void ActivationOffload::forward_begin(Graph & g) {
    if (!planned_) {
        fwd_begin_ = g.ops_issued();
        return;
    }
    for (const Moved & m : moved_) g.unalias(m.buf);
}

void ActivationOffload::forward_done(Graph & g, int l) {
    if (!planned_) {
        note(fwd_done_, l, g.ops_issued());
        return;
    }
    for (const Moved & m : moved_)
        if (m.write_after == l) g.offload_write(bytes_view(m.stored, m.bytes), bytes_view(m.buf, m.bytes), write_slot(l));
    // The writes of the layer before have had this layer's forward to finish; the last layer's
    // are waited for at once (the head would otherwise hold them).
    if (l > lb_) wait_writes(g, l - 1);
    if (l == le_ - 1) wait_writes(g, l);
}

void ActivationOffload::wait_writes(Graph & g, int l) const {
    std::vector<Tensor> uses;
    for (const Moved & m : moved_)
        if (m.write_after == l) uses.push_back(bytes_view(m.buf, m.bytes));
    if (!uses.empty()) g.offload_wait(write_slot(l), uses);
}

void ActivationOffload::read(Graph & g, int l) const {
    for (const Moved & m : moved_)
        if (m.read_for == l) g.offload_read(bytes_view(m.reload, m.bytes), bytes_view(m.stored, m.bytes), read_slot(l));
}

void ActivationOffload::backward_begin(Graph & g, int l) {
    if (!planned_) {
        if (top_ < 0) top_ = l;
        note(bwd_begin_, l, g.ops_issued());
        return;
    }
    if (l == top_) read(g, l);
    if (l > lb_) read(g, l - 1);   // one layer ahead
    std::vector<Tensor> uses;
    for (const Moved & m : moved_)
        if (m.read_for == l) uses.push_back(bytes_view(m.reload, m.bytes));
    if (uses.empty()) return;
    g.offload_wait(read_slot(l), uses);
    for (const Moved & m : moved_)
        if (m.read_for == l) g.alias(m.buf, m.reload);
}

void ActivationOffload::backward_done(Graph & g) {
    if (!planned_) {
        bwd_done_ = g.ops_issued();
        return;
    }
    for (const Moved & m : moved_) g.unalias(m.buf);
}

int ActivationOffload::forward_layer(int at) const {
    for (int l = lb_; l < le_; ++l)
        if (at < fwd_done_[size_t(l)]) return l;
    return -1;
}

int ActivationOffload::backward_layer(int at) const {
    int m = -1;
    for (int l = top_; l >= lb_ && size_t(l) < bwd_begin_.size() && bwd_begin_[size_t(l)] >= 0; --l)
        if (bwd_begin_[size_t(l)] <= at) m = l;
    return m;
}

void ActivationOffload::plan(const Program & probe, Program & program, int lb, int le, int slot_base) {
    MF_ASSERT(!planned_ && fwd_begin_ >= 0 && top_ >= 0 && bwd_done_ >= 0 && "the probe recorded a training step");
    MF_ASSERT(fwd_done_.size() >= size_t(le) && lb < le);
    lb_ = lb, le_ = le, slot_base_ = slot_base;
    const int fwd_end = fwd_done_[size_t(le - 1)], bwd_start = bwd_begin_[size_t(top_)];
    const auto & ops = probe.ops();
    const auto & bufs = probe.buffers();
    // Per buffer: its last use in the blocks' forward, whether the head uses it, its first use
    // in the blocks' backward.
    std::vector<int> last_fwd(bufs.size(), -1), first_bwd(bufs.size(), -1);
    std::vector<char> head(bufs.size(), 0);
    for (int i = fwd_begin_; i < bwd_done_; ++i)
        for (BufferId b : ops[size_t(i)].uses) {
            if (i < fwd_end) last_fwd[size_t(b)] = i;
            else if (i < bwd_start) head[size_t(b)] = 1;
            else if (first_bwd[size_t(b)] < 0) first_bwd[size_t(b)] = i;
        }
    const int end = layers_ > 0 ? std::min(le, lb + layers_) : le;
    for (size_t b = 0; b < bufs.size(); ++b) {
        const BufferDecl & d = bufs[b];
        if (d.persistent || d.category != Category::activations || d.bytes == 0) continue;
        if (d.first_op < fwd_begin_ || d.first_op >= fwd_end || head[b] || first_bwd[b] < 0 || d.last_op >= bwd_done_)
            continue;
        // A layer's saved activations are those its backward (or recomputation) reads first: its
        // input, made by the layer below, is its own.
        const int made = forward_layer(d.first_op), owner = backward_layer(first_bwd[b]);
        if (made < 0 || owner < lb || owner >= end) continue;
        Moved m;
        m.buf = BufferId(b);
        m.bytes = d.bytes;
        m.write_after = forward_layer(last_fwd[b]);
        m.read_for = owner;
        MF_ASSERT(m.write_after >= made);
        m.stored = program.declare("offloaded." + d.name, Category::offloaded, d.bytes, true);
        m.reload = program.declare(d.name + ".reload", Category::activations, d.bytes);
        bytes_ += d.bytes;
        moved_.push_back(m);
    }
    planned_ = true;
}

}  // namespace memfit
