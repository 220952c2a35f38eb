// Expert parallelism in the transformer (model/expert_parallel.h): a sparse layer whose experts
// are split over the expert group. Each rank routes its own N tokens over all E experts; its rows
// for expert e (at most cap of them, the capacity layout of backend/moe.h) go to the rank holding
// e by one all-to-all of [E * cap, C] (and one of the E counts), run through that rank's experts
// by grouped matmuls over the counts received, and come back by a second all-to-all to be
// combined. Backward mirrors it: d(output) times the weights out, d(input) back. Every buffer has
// its size before the step (E * cap rows), so the plan stays exact per rank.
#include "model/transformer.h"

#include "core/error.h"

namespace memfit {

MoeDesc Transformer::ep_local_desc() const {
    MoeDesc d;
    d.experts = cfg_.moe.local_experts();
    d.top_k = cfg_.moe.top_k;
    d.capacity = ep_cap_;
    d.reps = cfg_.moe.ep_ranks;   // the received rows: a block per source rank, E / R experts each
    return d;
}

void Transformer::declare_ep(Program & program, const std::string & h, bool with_backward, LayerActs & a) const {
    const int64_t N = rows_, E = cfg_.moe.experts, k = cfg_.moe.top_k, C = cfg_.n_embd, R = E * ep_cap_;
    const MoeDesc d = moe_desc(a.layer);
    auto act = [&](std::string_view name, std::initializer_list<int64_t> dims, bool f32 = false) {
        return this->act(program, h, dims, f32, name);
    };
    auto ints = [&](const std::string & name, int64_t n) {
        return Tensor(program.declare(prefix_ + h + name, Category::activations, size_t(n) * 4), DType::i32, {n});
    };
    a.moe_logits = act("moe.router.logits", {N, E});
    a.moe_route = ints("moe.route", moe_route_elems(N, d));
    a.moe_wts = act("moe.weights", {N, k}, true);
    a.ep_cnt = ints("moe.counts", E);
    a.ep_cnt_recv = ints("moe.counts.recv", E);
    a.moe_xs = act("moe.dispatch", {R, C});
    a.ep_recv = act("moe.dispatch.recv", {R, C});
    a.ep_out = act("moe.experts.out.local", {R, C});
    a.moe_y = act("moe.experts.out", {R, C});
    declare_shared_expert(program, h, with_backward, a);
    if (!with_backward) return;
    a.moe_dys = act("moe.experts.out.grad", {R, C});
    a.ep_dys = act("moe.experts.out.grad.recv", {R, C});
    a.moe_dxs = act("moe.dispatch.grad", {R, C});
    a.ep_dxs = act("moe.dispatch.grad.recv", {R, C});
    a.moe_dwts = act("moe.weights.grad", {N, k}, true);
    a.moe_dlogits = act("moe.router.logits.grad", {N, E});
}

// The experts' first matmul over the rows this rank received (kept: recomputation starts here).
void Transformer::ep_fc(Graph & g, Tensor fch, const LayerActs & a, const ModelWeights::Layer & p) const {
    g.moe_gemm(fch, a.ep_recv, p.fcw, a.ep_cnt_recv, ep_local_desc(), MoeGemm::fwd);
}

void Transformer::ep_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x,
                         bool need_output) const {
    const MoeDesc d = moe_desc(a.layer);
    const int64_t width = moe_stats_width(d);
    // A recomputed segment routes again (the same route) into a row of its own: the step's
    // statistics were summed over the group after the forward.
    const Tensor stats = a.rc ? moe_stats_rc_ : moe_stats_.view(d.layer * width, {width});
    g.matmul_fwd(a.moe_logits, x, p.routerw, Tensor{}, WeightLayout::out_in);
    g.moe_route(a.moe_route, a.moe_wts, stats, a.moe_logits, d);
    g.moe_counts(a.ep_cnt, stats, a.moe_route, a.moe_wts, d);
    g.moe_gather(a.moe_xs, x, a.moe_route, d);
    g.ep_all_to_all(a.ep_cnt_recv, a.ep_cnt);
    g.ep_all_to_all(a.ep_recv, a.moe_xs);
    ep_fc(g, a.fch, a, p);
    act_fwd(g, a.fch_gelu, a.fch);
    if (!need_output) return;
    g.moe_gemm(a.ep_out, a.fch_gelu, p.fcprojw, a.ep_cnt_recv, ep_local_desc(), MoeGemm::fwd);
    g.ep_all_to_all(a.moe_y, a.ep_out);
    g.moe_combine(a.fcproj, a.moe_y, a.moe_wts, a.moe_route, d);
    shared_expert_fwd(g, a, p, x);
}

// d(output) of each kept choice, and the weights' gradient d(output) . y, on this rank; times the
// weights, to the experts' ranks; their matmuls' backward there; d(input) rows back, summed.
void Transformer::ep_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, const ModelWeights::Layer & dp,
                         Tensor x, Tensor dout) const {
    const MoeDesc d = moe_desc(a.layer), dl = ep_local_desc();
    g.moe_gather(a.moe_dys, dout, a.moe_route, d);
    g.moe_weight_bwd(a.moe_dwts, a.moe_dys, Tensor{}, a.moe_y, a.moe_wts, a.moe_route, d);
    g.ep_all_to_all(a.ep_dys, a.moe_dys);
    g.moe_gemm(a.dfch_gelu, a.ep_dys, p.fcprojw, a.ep_cnt_recv, dl, MoeGemm::data);
    if (dp.fcprojw.valid()) g.moe_gemm(dp.fcprojw, a.ep_dys, a.fch_gelu, a.ep_cnt_recv, dl, MoeGemm::weight);
    act_bwd(g, a.dfch, a.dfch_gelu, a.fch);
    if (dp.fcw.valid()) g.moe_gemm(dp.fcw, a.dfch, a.ep_recv, a.ep_cnt_recv, dl, MoeGemm::weight);
    g.moe_gemm(a.moe_dxs, a.dfch, p.fcw, a.ep_cnt_recv, dl, MoeGemm::data);
    g.ep_all_to_all(a.ep_dxs, a.moe_dxs);
    g.moe_scatter(a.dln2, a.ep_dxs, a.moe_route, d, false);
    g.moe_route_bwd(a.moe_dlogits, a.moe_dwts, a.moe_logits, a.moe_route, a.moe_wts, moe_stats_, d);
    g.matmul_bwd(a.dln2, dp.routerw, Tensor{}, a.moe_dlogits, x, p.routerw, WeightLayout::out_in, true);
    shared_expert_bwd(g, a, p, dp, x, dout);
}

}  // namespace memfit
