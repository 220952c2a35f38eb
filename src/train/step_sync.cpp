// ZeRO's and data parallelism's part of the step program (train/step.h): the flat buffers' layer
// groups that ZeRO 3 gathers just before their forward and backward, and the gradient buckets
// reduced (summed, or ZeRO >= 2 reduce-scattered into the shard) as backward finishes them. Under
// pipeline parallelism each micro-batch has its own copy of these transients, so ZeRO composes
// with every schedule: a layer's gathered weights and gradient bucket live through one
// micro-batch's pass, and its gradients accumulate in the shard.
#include "train/step_sync.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/collectives.h"
#include "core/error.h"
#include "model/sparsity.h"

namespace memfit {

namespace {

// Every view of w: weights, biases, adapters (DoRA's magnitudes too), and a quantized base's
// packed projections.
template <class F>
void for_each_view(ModelWeights & w, F f) {
    for (Tensor * t : {&w.wte, &w.wpe, &w.lnfw, &w.lnfb, &w.head}) f(*t);
    for (auto & y : w.h) {
        for (Tensor * t : {&y.ln1w, &y.ln1b, &y.qkvw, &y.qkvb, &y.projw, &y.projb, &y.ln2w, &y.ln2b, &y.fcw, &y.fcb,
                           &y.fcprojw, &y.fcprojb, &y.qnw, &y.knw, &y.pn1w, &y.pn2w, &y.routerw, &y.shw1, &y.shw2, &y.shgw, &y.qkvq.packed, &y.projq.packed,
                           &y.fcq.packed, &y.fcprojq.packed})
            f(*t);
        for (auto & ad : y.adapters) {
            f(ad.a);
            f(ad.b);
            f(ad.mag);   // DoRA's (else invalid)
        }
    }
    for (auto & ad : w.embed_adapters) {
        f(ad.a);
        f(ad.b);
    }
    for (auto & ad : w.head_adapters) {
        f(ad.a);
        f(ad.b);
    }
}

// Elements [a, b) of a flat buffer moved into their own buffer `to`.
struct Range { size_t a, b; BufferId to; };

// Moves every view of w into `flat` (dtype dt) to the range's buffer that holds it, of dtype `to`.
void remap(ModelWeights & w, BufferId flat, DType dt, const std::vector<Range> & ranges, DType to) {
    const size_t es = dtype_size(dt);
    for_each_view(w, [&](Tensor & t) {
        if (!t.valid() || t.buffer != flat) return;
        const size_t e = t.offset / es;
        for (const auto & r : ranges)
            if (e >= r.a && e < r.b) {
                MF_ASSERT(e + size_t(t.numel()) <= r.b && "a weight view spans two groups");
                t.buffer = r.to;
                t.offset = (e - r.a) * dtype_size(to);
                t.dtype = to;
                return;
            }
        MF_ASSERT(false && "a weight view outside every group");
    });
}

// Elements [a, b) of a flat buffer as rank r's shard of it (`flat`, dtype dt) holds them: a view
// from the shard's start; null when the shard holds none.
Tensor shard_part(BufferId flat, DType dt, const FlatShards & sh, size_t a, size_t b, int r) {
    const size_t mine = sh.in(a, b, r), lo = sh.lo(r);
    return mine ? Tensor(flat, dt, {int64_t(mine)}, (std::max(a, lo) - lo) * dtype_size(dt)) : Tensor{};
}

}  // namespace

void TrainStep::declare_sync(const Backend * sizing, const std::string & pre) {
    const bool train = mode_ == StepMode::train;
    all_reduce_ = train && parts_.optimizer && parts_.reduce_grads && dp_.zero < 2;
    reduce_scatter_ = train && dp_.zero >= 2;
    bucket_dt_ = reduce_scatter_ ? compute_ : grad_dt_;
    // --optimizer-in-backward: a bucket per layer, its own buffer (no whole-model gradient).
    const bool own_buffers = reduce_scatter_ || in_bwd_;
    const size_t gs = dtype_size(bucket_dt_);
    // Groups (runs of one layer's parameters) and the gradient buckets over them, merged from the
    // top layer down until a bucket holds bucket_bytes.
    for (const auto & p : layout_.params) {
        // A shared block's gradients are whole after the backward of its group's lowest layer.
        const int b = param_block(p.name), l = b < 0 ? -1 : b * cfg_.share_layers;
        if (!groups_.empty() && groups_.back().layer == l) groups_.back().b += p.numel;
        else groups_.push_back(Group{l, p.offset, p.offset + p.numel, kTrainable, {}, {}, {}, {}});
    }
    for (size_t j = groups_.size(); j-- > 0;) {
        const Group & q = groups_[j];
        Bucket * cur = buckets_.empty() ? nullptr : &buckets_.back();
        if (cur && !in_bwd_ && q.layer >= 0 && cur->bottom >= 0 && cur->a == q.b &&
            (cur->b - cur->a) * gs < dp_.bucket_bytes) {
            cur->a = q.a;
            cur->bottom = q.layer;
        } else {   // a shared block's gradients start at its group's highest layer's backward
            const int top = q.layer < 0 ? -1 : std::min(q.layer + cfg_.share_layers - 1, cfg_.n_layer - 1);
            buckets_.push_back(Bucket{top, q.layer, q.a, q.b, {}});
        }
    }
    copies_ = pp_.enabled() && dp_.zero >= 2 ? pp_.micro_batches : 1;
    dws_.assign(size_t(copies_), dw_);
    auto suffix = [&](bool per_copy, int c) { return per_copy && copies_ > 1 ? fmt::format(".mb{}", c) : std::string(); };
    std::vector<std::vector<Range>> grad_ranges(static_cast<size_t>(copies_));
    for (size_t i = 0; (all_reduce_ || own_buffers) && i < buckets_.size(); ++i) {
        Bucket & k = buckets_[i];
        // Sized for the rank with the most of the bucket, so that every rank's plan is the same.
        const size_t most = most_in_shard(k.a, k.b);
        // A 16-bit sum's fp32 copies (MPI sums fp32), from the transfer's start to its wait.
        const size_t wide = step_scratch_elems(sizing, bucket_dt_, dp_.ranks, k.b - k.a);
        // Accumulating (micro-steps, or a pipeline's micro-batches into one shard): through recv.
        // 16-bit buckets into the fp32 shard: in place, into the bucket's own part (no recv).
        const bool accumulate = !widen() && (!parts_.zero_grads || (copies_ > 1 && k.top >= 0));
        for (int c = 0; c < copies_; ++c) {
            if (c > 0 && k.top < 0) {   // the rest's gradients accumulate over the step in one bucket
                k.copy.push_back(k.copy.front());
                grad_ranges[size_t(c)].push_back(Range{k.a, k.b, k.copy.front().grad});
                continue;
            }
            BucketBuffers bb;
            const std::string at = fmt::format("{}{}", i, suffix(true, c));
            if (wide) bb.scratch = program_.declare(pre + "communication.bucket" + at, Category::communication, wide * 4);
            if (own_buffers) {
                bb.grad = program_.declare(pre + "gradients.bucket" + at, Category::gradients, (k.b - k.a) * gs);
                if (accumulate && most > 0)
                    bb.recv = program_.declare(pre + "gradients.recv" + at, Category::gradients, most * gs);
                if (reduce_scatter_ && in_bwd_ && most > 0)
                    bb.part = program_.declare(pre + "gradients.part" + at, Category::gradients, most * gs);
                grad_ranges[size_t(c)].push_back(Range{k.a, k.b, bb.grad});
            }
            k.copy.push_back(bb);
        }
    }
    for (int c = 0; own_buffers && c < copies_; ++c)
        remap(dws_[size_t(c)], grads, grad_dt_, grad_ranges[size_t(c)], bucket_dt_);
    wf_.assign(size_t(copies_), w_);
    wb_ = wf_;
    if (dp_.zero < 3) return;
    if (lora_) frozen_groups();
    std::vector<std::vector<Range>> fwd(size_t(copies_) * 3), bwd(fwd.size());
    for (auto & q : groups_) {
        const Source & src = sources_[q.src];
        const size_t bytes = (q.b - q.a) * dtype_size(src.dt);
        const std::string name = q.layer < 0 ? fmt::format("{}.gathered.rest{}", src.name, q.a)
                                             : fmt::format("{}.gathered.layer{}", src.name, q.layer);
        for (int c = 0; c < copies_; ++c) {
            const bool shared = c > 0 && q.layer < 0;   // the rest's: gathered once for the step
            q.fwd.push_back(shared ? q.fwd.front()
                                   : program_.declare(name + (q.layer >= 0 ? ".fwd" : "") + suffix(true, c),
                                                      Category::parameters, bytes));
            q.bwd.push_back(shared ? q.bwd.front()
                            : q.layer >= 0 && train ? program_.declare(name + ".bwd" + suffix(true, c),
                                                                       Category::parameters, bytes)
                                                    : q.fwd.back());
            if (params_off_ && q.src == kTrainable) {   // this rank's part, read from the store first
                const size_t most = src.sh.most(q.a, q.b) * dtype_size(src.dt);
                auto staged = [&](const char * dir) {
                    const std::string at = q.layer < 0 ? fmt::format("{}.staged.rest{}", src.name, q.a)
                                                       : fmt::format("{}.staged.layer{}{}", src.name, q.layer, dir);
                    return most ? program_.declare(at + suffix(true, c), Category::parameters, most) : BufferId(-1);
                };
                q.fwd_in.push_back(shared ? q.fwd_in.front() : staged(".fwd"));
                q.bwd_in.push_back(shared ? q.bwd_in.front() : q.layer >= 0 && train ? staged(".bwd") : q.fwd_in.back());
            }
            fwd[size_t(c * 3 + q.src)].push_back(Range{q.a, q.b, q.fwd.back()});
            bwd[size_t(c * 3 + q.src)].push_back(Range{q.a, q.b, q.bwd.back()});
        }
    }
    for (int c = 0; c < copies_; ++c)
        for (int k = 0; k < 3; ++k) {
            if (sources_[k].flat < 0) continue;
            remap(wf_[size_t(c)], sources_[k].flat, sources_[k].dt, fwd[size_t(c * 3 + k)], sources_[k].dt);
            remap(wb_[size_t(c)], sources_[k].flat, sources_[k].dt, bwd[size_t(c * 3 + k)], sources_[k].dt);
        }
}

// LoRA's frozen base under ZeRO 3: its dense part's runs of one layer's weights and each layer's
// packed projections (layer-major in the QuantLayout), as groups gathered like the adapters'.
void TrainStep::frozen_groups() {
    for (const auto & p : base_layout_.params) {
        const int l = param_block(p.name);
        const Group * last = groups_.empty() ? nullptr : &groups_.back();
        if (last && last->src == kBase && last->layer == l) groups_.back().b += p.numel;
        else groups_.push_back(Group{l, p.offset, p.offset + p.numel, kBase, {}, {}, {}, {}});
    }
    const auto & e = quant_layout_.entries;
    for (size_t i = 0; i < e.size(); ++i) {
        const size_t end = i + 1 < e.size() ? e[i + 1].offset : quant_layout_.bytes;
        if (i > 0 && e[i - 1].layer == e[i].layer) groups_.back().b = end;
        else groups_.push_back(Group{e[i].layer, e[i].offset, end, kBaseQ, {}, {}, {}, {}});
    }
}

Tensor TrainStep::part_view(const Bucket & k) const {
    const size_t mine = in_shard(k.a, k.b, dp_.rank);
    return mine ? Tensor(k.copy[0].part, bucket_dt_, {int64_t(mine)}) : Tensor{};
}

Tensor TrainStep::grad_view(const Bucket & k, int copy) const {
    const int64_t n = int64_t(k.b - k.a);
    const BufferId id = k.copy.empty() ? -1 : k.copy[size_t(copy)].grad;
    return id >= 0 ? Tensor(id, bucket_dt_, {n}) : Tensor(grads, grad_dt_, {n}, k.a * dtype_size(grad_dt_));
}

TrainStep::Sync::Sync(const TrainStep & st)
    : st_(st), nb_(int(st.buckets_.size())), ng_(int(st.groups_.size())),
      started_(size_t(2 * ng_ * st.copies_), 0), waited_(started_.size(), 0), read_(started_.size(), 0) {}

// Group q holds layer l's weights: its own layer's, or (shared blocks) every layer of its group,
// gathered at the group's first use in each direction and kept until its last.
bool TrainStep::Sync::serves(const Group & q, int layer) const {
    return q.layer == layer ||
           (q.layer >= 0 && layer >= 0 && st_.cfg_.stored_block(layer) == st_.cfg_.stored_block(q.layer));
}

size_t TrainStep::Sync::flag(int j, bool backward, int copy) const {
    const Group & q = st_.groups_[size_t(j)];
    const int c = q.layer < 0 ? 0 : copy;   // the rest's groups: once for the step
    return size_t((c * 2 + (backward ? 1 : 0)) * ng_ + j);
}

Tensor TrainStep::Sync::own(int j) const {
    const Group & q = st_.groups_[size_t(j)];
    const Source & src = st_.sources_[q.src];
    return shard_part(src.flat, src.dt, src.sh, q.a, q.b, st_.dp_.rank);
}

Tensor TrainStep::Sync::staged(int j, bool backward, int copy) const {
    const Group & q = st_.groups_[size_t(j)];
    const Tensor mine = own(j);
    if (q.fwd_in.empty() || !mine.valid()) return Tensor{};
    const int c = q.layer < 0 ? 0 : copy;
    return Tensor(backward ? q.bwd_in[size_t(c)] : q.fwd_in[size_t(c)], mine.dtype, {mine.numel()});
}

void TrainStep::Sync::prefetch(Graph & g, int layer, bool backward, int copy) {
    for (int j = 0; j < ng_; ++j) {
        const Group & q = st_.groups_[size_t(j)];
        if (q.fwd_in.empty() || !serves(q, layer)) continue;
        const size_t f = flag(j, backward, copy);
        const Tensor in = staged(j, backward, copy);
        if (read_[f] || started_[f] || !in.valid()) continue;
        read_[f] = 1;
        g.offload_read(in, own(j), kParamReadSlot + int(f));
    }
}

void TrainStep::Sync::gather(Graph & g, int layer, bool backward, int copy) {
    prefetch(g, layer, backward, copy);
    for (int j = 0; j < ng_; ++j) {
        const Group & q = st_.groups_[size_t(j)];
        const size_t f = flag(j, backward, copy);
        if (!serves(q, layer) || started_[f]) continue;
        started_[f] = 1;
        const Source & src = st_.sources_[q.src];
        Tensor in = own(j);
        if (const Tensor s = staged(j, backward, copy); s.valid()) {
            g.offload_wait(kParamReadSlot + int(f), {s});
            in = s;
        }
        const int c = q.layer < 0 ? 0 : copy;
        const BufferId out = backward ? q.bwd[size_t(c)] : q.fwd[size_t(c)];
        g.all_gather_start(Tensor(out, src.dt, {int64_t(q.b - q.a)}), in, src.sh.counts(q.a, q.b), slot(j, backward));
    }
}

void TrainStep::Sync::await(Graph & g, int layer, bool backward, int copy) {
    gather(g, layer, backward, copy);
    for (int j = 0; j < ng_; ++j) {
        const Group & q = st_.groups_[size_t(j)];
        if (!serves(q, layer) || waited_[flag(j, backward, copy)]) continue;
        waited_[flag(j, backward, copy)] = 1;
        const int c = q.layer < 0 ? 0 : copy;
        // The staged part is the gather's input: live until the gather is done.
        g.comm_wait(slot(j, backward), {Tensor(backward ? q.bwd[size_t(c)] : q.fwd[size_t(c)], st_.sources_[q.src].dt, {1}),
                                        staged(j, backward, copy)});
    }
}

Tensor TrainStep::Sync::shard_piece(const Bucket & k) const {
    return shard_part(st_.grads, st_.grad_dt_, st_.shards_, k.a, k.b, st_.dp_.rank);
}

// Accumulating: received into the bucket's `recv` (every rank's program touches it, even with
// none of the bucket, so that all ranks' plans are the same), then added to the shard.
Tensor TrainStep::Sync::receive(const Bucket & k, int copy) const {
    const BufferId id = k.copy[size_t(copy)].recv;
    const DType dt = st_.bucket_dt_;
    return id >= 0 ? Tensor(id, dt, {int64_t(st_.program_.buffer(id).bytes / dtype_size(dt))}) : Tensor{};
}

Tensor TrainStep::Sync::scratch(const Bucket & k, int copy) const {
    const BufferId id = k.copy[size_t(copy)].scratch;
    return id >= 0 ? Tensor(id, DType::f32, {int64_t(st_.program_.buffer(id).bytes / 4)}) : Tensor{};
}

// 16-bit buckets (widen()): this rank's part of the bucket, where its sum lands in place.
Tensor TrainStep::Sync::own_part(const Bucket & k, int copy) const {
    const size_t mine = st_.in_shard(k.a, k.b, st_.dp_.rank);
    return mine ? st_.grad_view(k, copy).view(int64_t(std::max(k.a, st_.lo_) - k.a), {int64_t(mine)}) : Tensor{};
}

void TrainStep::Sync::start(Graph & g, int i, int copy) {
    const Bucket & k = st_.buckets_[size_t(i)];
    if (st_.all_reduce_) {
        g.all_reduce_start(st_.grad_view(k, copy), i, scratch(k, copy));
    } else if (st_.reduce_scatter_) {
        const Tensor recv = receive(k, copy);
        const Tensor out = st_.in_bwd_ ? st_.part_view(k) : st_.widen() ? own_part(k, copy) : recv.valid() ? recv
                                                                                                          : shard_piece(k);
        g.reduce_scatter_start(st_.grad_view(k, copy), out, st_.shard_counts(k.a, k.b), i, scratch(k, copy));
    }
}

void TrainStep::Sync::finish(Graph & g, int i, int copy) {
    const Bucket & k = st_.buckets_[size_t(i)];
    if (st_.all_reduce_) g.comm_wait(i, {st_.grad_view(k, copy), scratch(k, copy)});
    else if (st_.reduce_scatter_) into_shard(g, k, i, copy);
    if (on_finish) on_finish(g, i);
}

void TrainStep::Sync::into_shard(Graph & g, const Bucket & k, int i, int copy) {
    if (st_.in_bwd_) {   // summed into the part the update reads
        g.comm_wait(i, {st_.grad_view(k, copy), st_.part_view(k), scratch(k, copy)});
        return;
    }
    const Tensor mine = shard_piece(k), recv = receive(k, copy);
    g.comm_wait(i, {st_.grad_view(k, copy), recv.valid() ? recv : mine, scratch(k, copy)});
    if (!mine.valid()) return;
    const int64_t n = mine.numel();
    if (st_.widen()) g.add_columns(mine.view(0, {1, n}), own_part(k, copy).view(0, {1, n}), 0, 1.0f);   // into fp32
    else if (recv.valid()) g.residual_fwd(mine, mine, recv.view(0, {n}));
}

// ZeRO 3 before layer l's forward: its weights awaited, the next layer's gather started.
void TrainStep::Sync::forward_begin(Graph & g, int l, int copy) {
    g.phase(Phase::communication);
    await(g, l, false, copy);
    if (l + 1 < st_.cfg_.n_layer) gather(g, l + 1, false, copy);
    if (l + 2 < st_.cfg_.n_layer) prefetch(g, l + 2, false, copy);
}

// Before layer l's backward: ZeRO 3's weights awaited and the next layer's gather started (down
// to `lowest`), ZeRO >= 2's buckets opening at l zeroed.
void TrainStep::Sync::backward_begin(Graph & g, int l, int copy, int lowest) {
    if (st_.dp_.zero >= 3) {
        g.phase(Phase::communication);
        await(g, l, true, copy);
        if (l - 1 >= lowest) gather(g, l - 1, true, copy);
        if (l - 2 >= lowest) prefetch(g, l - 2, true, copy);
    }
    g.phase(Phase::backward);
    for (const auto & k : st_.buckets_)
        if ((st_.reduce_scatter_ || st_.in_bwd_) && k.top == l) g.fill_zero(st_.grad_view(k, copy));
}

// After layer l's backward (l = -1: the rest, after the embedding's): the buckets closing at l
// start reducing; the ones in flight before them finish, so that bucket i's transfer overlaps
// the next layer's backward and at most two buckets' transients are live.
void TrainStep::Sync::backward_done(Graph & g, int l, int copy) {
    g.phase(Phase::communication);
    std::vector<std::pair<int, int>> now;
    for (int i = 0; i < nb_; ++i)
        if (st_.buckets_[size_t(i)].bottom == l) {
            start(g, i, copy);
            now.push_back({i, copy});
        }
    flush(g);
    in_flight_ = now;
    if (!st_.all_reduce_ && !st_.reduce_scatter_) flush(g);   // nothing to overlap: finished at once
    g.phase(Phase::backward);
}

void TrainStep::Sync::zero_rest(Graph & g) {
    for (const auto & k : st_.buckets_)
        if ((st_.reduce_scatter_ || st_.in_bwd_) && k.top < 0) g.fill_zero(st_.grad_view(k));
}

void TrainStep::Sync::reduce_rest(Graph & g) {
    for (int i = 0; i < nb_; ++i)
        if (st_.buckets_[size_t(i)].bottom < 0) {
            start(g, i, 0);
            in_flight_.push_back({i, 0});
        }
}

void TrainStep::Sync::flush(Graph & g) {
    for (const auto & [i, c] : in_flight_) finish(g, i, c);
    in_flight_.clear();
}

}  // namespace memfit
