// The sums a step's gradients need once backward is done, beyond the data-parallel reduction
// (train/step.h): the tensor group's (a KV head held by several ranks, each rank's part of a
// replicated gradient: the sequence-parallel norms', LoRA's replicated adapter matrices') and a
// tied embedding's two pipeline ends; and the global gradient norm over the ranges each rank
// counts once.
#include "train/step.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/collectives.h"
#include "model/expert_parallel.h"
#include "model/pipeline.h"
#include "model/tensor_parallel.h"

namespace memfit {

void TrainStep::declare_fixups(const ModelConfig & cfg, const ModelOptions & model, const Backend * sizing,
                               const std::string & pre) {
    const DataParallel & dp = dp_;
    const PipelineParallel & pp = pp_;
    const StepParts parts = parts_;
    const size_t P = layout_.total, gs = dtype_size(grad_dt_);
    // Skipped: the replicated parameters (tensor ranks but the first), a tied embedding's
    // second copy (the last pipeline stage).
    std::vector<TpRange> skip;
    if (model.tp.enabled() && model.tp.rank != 0) skip = tp_replicated(layout_, model.tp.ranks);
    // Expert parallel: the dense parameters, alike on every rank of the expert group, by its first.
    if (model.ep.enabled() && model.ep.rank != 0)
        for (const auto & r : ep_dense_ranges(layout_)) skip.push_back(r);
    // KV heads held by several tensor ranks: counted by the first of them.
    const int reps = model.tp.enabled() ? tp_kv_replicas(cfg, model.tp.ranks) : 1;
    if (reps > 1 && model.tp.rank % reps != 0)
        for (const auto & r : tp_kv_ranges(layout_)) skip.push_back(r);
    const ParamInfo * table = layout_.try_find(cfg_.llama() ? "model.embed_tokens.weight" : "wte.weight");
    const bool tied = pp.enabled() && cfg_.tied_head && table;
    if (tied && holds_tied_copy(cfg_, pp.first(), pp.last())) skip.push_back({table->offset, table->offset + table->numel});
    std::sort(skip.begin(), skip.end(), [](const TpRange & x, const TpRange & y) { return x.a < y.a; });
    std::vector<TpRange> counted;
    size_t at = 0;
    for (const auto & r : skip) {
        if (r.a > at) counted.push_back({at, r.a});
        at = std::max(at, r.b);
    }
    if (at < P) counted.push_back({at, P});
    if (tied) {
        tied_grad_ = Tensor(grads, grad_dt_, {int64_t(table->numel)}, table->offset * gs);
        for (const auto & k : buckets_)   // ZeRO >= 2: summed in the rest's bucket, before its reduce-scatter
            if (reduce_scatter_ && table->offset >= k.a && table->offset < k.b)
                tied_grad_ = grad_view(k).view(int64_t(table->offset - k.a), {int64_t(table->numel)});
        if (const size_t wide = step_scratch_elems(sizing, tied_grad_.dtype, 2, table->numel))
            tied_scratch_ = Tensor(program_.declare("communication.tied_embedding", Category::communication,
                                                    wide * 4),
                                   DType::f32, {int64_t(wide)});
    }
    const size_t glo = dp.zero >= 2 ? lo_ : 0, ghi = dp.zero >= 2 ? hi_ : P;
    for (const auto & r : counted) {
        const size_t a = std::max(r.a, glo), b = std::min(r.b, ghi);
        if (a < b) norm_ranges_.push_back({a - glo, b - glo});
    }
    tp_ = model.tp;
    if (reps > 1 && parts.optimizer) {   // a padded buffer: every KV head's slot, this rank's filled
        const std::vector<TpRange> kv = tp_kv_ranges(layout_);
        kv_parts_ = grad_parts(kv);
        kv_slot_ = model.tp.rank / reps;
        const size_t len = kv.front().b - kv.front().a, all = len * size_t(cfg.kv_heads());
        kv_buf_ = Tensor(program_.declare("gradients.kv_replicas", Category::gradients, all * gs), grad_dt_,
                         {int64_t(all)});
        if (const size_t wide = step_scratch_elems(sizing, grad_dt_, tp_.ranks, all))
            kv_scratch_ = Tensor(program_.declare("communication.kv_replicas", Category::communication, wide * 4),
                                 DType::f32, {int64_t(wide)});
    }
    if (tp_.enabled() && parts.optimizer) {   // each tensor rank's share of a replicated gradient
        std::vector<TpRange> partial = tp_.sequence ? sp_partial(layout_) : std::vector<TpRange>{};
        if (lora_) partial = tp_lora_partial(layout_);   // (the norms are the frozen base's)
        partial_parts_ = grad_parts(partial);
        size_t widest = 0;
        for (const auto & r : partial_parts_)
            widest = std::max(widest, step_scratch_elems(sizing, grad_dt_, tp_.ranks, r.n));
        if (widest)
            partial_scratch_ = Tensor(program_.declare(pre + "communication.tensor_partial", Category::communication,
                                                       widest * 4), DType::f32, {int64_t(widest)});
    }
    ep_ = model.ep;
    if (ep_.enabled() && parts.optimizer) {
        ep_parts_ = grad_parts(ep_dense_ranges(layout_));
        size_t widest = 0;
        for (const auto & r : ep_parts_) widest = std::max(widest, step_scratch_elems(sizing, grad_dt_, ep_.ranks, r.n));
        if (widest)
            ep_scratch_ = Tensor(program_.declare(pre + "communication.expert_dense", Category::communication,
                                                  widest * 4), DType::f32, {int64_t(widest)});
    }
    if (tp_.enabled() || pp.enabled() || in_bwd_ || ep_.enabled())
        norm_part_ = program_.declare("grad_norm_part", Category::activations, 4);
}

void TrainStep::tensor_fixups(Graph & g) const {
    const size_t gs = dtype_size(grad_dt_);
    for (const auto & r : kv_parts_) {   // a replicated KV head's gradient: each replica's query heads' share
        const int64_t n = int64_t(r.n);
        const Tensor mine(grads, grad_dt_, {n}, r.at * gs), slot = kv_buf_.view(int64_t(kv_slot_ * r.len + r.skip), {n});
        g.fill_zero(kv_buf_);
        g.residual_fwd(slot, slot, mine);
        g.tp_all_reduce(kv_buf_, kv_scratch_);
        g.fill_zero(mine);
        g.residual_fwd(mine, mine, slot);
    }
    for (const auto & r : partial_parts_)   // the norms' (sequence parallel), LoRA's replicated matrices'
        g.tp_all_reduce(Tensor(grads, grad_dt_, {int64_t(r.n)}, r.at * gs),
                        partial_scratch_.valid() ? partial_scratch_.view(0, {int64_t(r.n)}) : Tensor{});
    for (const auto & r : ep_parts_)   // expert parallel: every rank's tokens' share of the dense gradients
        g.ep_all_reduce(Tensor(grads, grad_dt_, {int64_t(r.n)}, r.at * gs),
                        ep_scratch_.valid() ? ep_scratch_.view(0, {int64_t(r.n)}) : Tensor{});
}

std::vector<TrainStep::GradPart> TrainStep::grad_parts(const std::vector<TpRange> & ranges) const {
    const bool sharded = dp_.zero >= 2;
    std::vector<GradPart> out;
    for (const auto & r : ranges) {
        const size_t a = sharded ? std::max(r.a, lo_) : r.a, b = sharded ? std::min(r.b, hi_) : r.b;
        if (a < b) out.push_back(GradPart{a - (sharded ? lo_ : 0), b - a, a - r.a, r.b - r.a});
    }
    return out;
}

void TrainStep::grad_norm(Graph & g, Tensor norm_sq) const {
    const size_t gs = dtype_size(grad_dt_);
    auto view = [&](const TpRange & r) { return Tensor(grads, grad_dt_, {int64_t(r.b - r.a)}, r.a * gs); };
    if (norm_ranges_.size() == 1 && !tp_.enabled() && !pp_.enabled() && !ep_.enabled()) {
        g.sum_squares(norm_sq, view(norm_ranges_[0]));
        return;
    }
    g.fill_zero(norm_sq);
    const Tensor part(norm_part_, DType::f32, {1});
    for (const auto & r : norm_ranges_) {
        g.sum_squares(part, view(r));
        g.residual_fwd(norm_sq, norm_sq, part);
    }
    g.phase(Phase::communication);
    if (tp_.enabled()) g.tp_all_reduce(norm_sq);
    if (pp_.enabled()) g.pp_all_reduce(norm_sq);
    if (ep_.enabled()) g.ep_all_reduce(norm_sq);
    g.phase(Phase::optimizer);
}

}  // namespace memfit
