// A mixture of experts' sparse MLP in the transformer (model/config.h's MoeConfig, backend/moe.h):
// the router's logits, the route (top-k, dispatch order), the dispatched rows through each
// expert's gate|up matmul, SwiGLU and down matmul, and the weighted combine; backward the same
// in reverse, the router's gradient including the load-balancing and z losses'. The N*k routed
// rows are a fixed total, so every buffer is declared here with its size: the plan is exact.
#include "model/transformer.h"

#include "core/error.h"

namespace memfit {

MoeDesc Transformer::moe_desc(int l) const {
    MoeDesc d;
    d.experts = cfg_.moe.experts;
    d.top_k = cfg_.moe.top_k;
    d.norm_topk = cfg_.moe.norm_topk;
    d.layers = cfg_.moe_layers();
    d.layer = moe_index_.empty() ? 0 : std::max(0, moe_index_[size_t(l)]);
    d.aux_scale = moe_aux_scale_;
    d.z_scale = moe_z_scale_;
    d.stat_ranks = cfg_.moe.ep_data_ranks;   // expert parallel: every data rank's statistics, summed
    d.capacity = ep_cap_;
    d.drop_probs = cfg_.moe.ep_drop_probs;
    return d;
}

void Transformer::declare_moe(Program & program, const std::string & h, bool with_backward, LayerActs & a) const {
    if (ep_cap_ > 0) return declare_ep(program, h, with_backward, a);
    const int64_t N = rows_, E = cfg_.moe.experts, k = cfg_.moe.top_k, C = cfg_.n_embd;
    const MoeDesc d = moe_desc(a.layer);
    auto act = [&](std::string_view name, std::initializer_list<int64_t> dims, bool f32 = false) {
        return this->act(program, h, dims, f32, name);
    };
    a.moe_logits = act("moe.router.logits", {N, E});
    a.moe_route = Tensor(program.declare(prefix_ + h + "moe.route", Category::activations,
                                         size_t(moe_route_elems(N, d)) * 4),
                         DType::i32, {moe_route_elems(N, d)});
    a.moe_wts = act("moe.weights", {N, k}, true);
    a.moe_xs = act("moe.dispatch", {N * k, C});
    a.moe_y = act("moe.experts.out", {N * k, C});
    declare_shared_expert(program, h, with_backward, a);
    if (!with_backward) return;
    a.moe_dys = act("moe.experts.out.grad", {N * k, C});
    a.moe_xs_b = act("moe.dispatch.bwd", {N * k, C});
    a.moe_dxs = act("moe.dispatch.grad", {N * k, C});
    a.moe_dwts = act("moe.weights.grad", {N, k}, true);
    a.moe_dlogits = act("moe.router.logits.grad", {N, E});
}

// Qwen2-MoE's shared expert's buffers (kept) and, with backward, their gradients.
void Transformer::declare_shared_expert(Program & program, const std::string & h, bool with_backward,
                                        LayerActs & a) const {
    const int64_t N = rows_, C = cfg_.n_embd, Fs = cfg_.moe.shared_ffn;
    if (Fs == 0) return;
    auto act = [&](std::string_view name, std::initializer_list<int64_t> dims) {
        return this->act(program, h, dims, false, name);
    };
    a.sh_fc = act("moe.shared.fc", {N, 2 * Fs});
    a.sh_act = act("moe.shared.swiglu", {N, Fs});
    a.sh_out = act("moe.shared.out", {N, C});
    a.sh_gate = act("moe.shared.gate", {N, 1});
    if (!with_backward) return;
    a.sh_dout = act("moe.shared.out.grad", {N, C});
    a.sh_dact = act("moe.shared.swiglu.grad", {N, Fs});
    a.sh_dfc = act("moe.shared.fc.grad", {N, 2 * Fs});
    a.sh_dgate = act("moe.shared.gate.grad", {N, 1});
}

std::vector<Transformer::ExpertAdapter> Transformer::expert_adapters(const ModelWeights::Layer & p, Proj proj) const {
    std::vector<ExpertAdapter> out;
    const int E = cfg_.moe.experts;
    for (size_t i = 0; i < p.adapters.size(); ++i) {
        const ModelWeights::Adapter & ad = p.adapters[i];
        if (ad.proj != proj || sites_[size_t(ad.site)].expert != 0) continue;
        MF_ASSERT(i + size_t(E) <= p.adapters.size());
        const ModelWeights::Adapter & next = p.adapters[E > 1 ? i + 1 : i];
        MF_ASSERT(E == 1 || (sites_[size_t(next.site)].expert == 1 && next.proj == proj));
        const int64_t stride = E > 1 ? int64_t((next.a.offset - ad.a.offset) / dtype_size(ad.a.dtype))
                                     : ad.a.numel() + ad.b.numel();
        MF_ASSERT(E == 1 || int64_t((next.b.offset - ad.b.offset) / dtype_size(ad.b.dtype)) == stride);
        out.push_back({ad.site, int(i), stride});
    }
    return out;
}

Tensor Transformer::expert_stack(Tensor first, int64_t stride) const {
    return Tensor(first.buffer, first.dtype, {(cfg_.moe.experts - 1) * stride + first.numel()}, first.offset);
}

// out[:, slice] += scale (in A_e^T) B_e^T, each routed row by its expert's adapter.
void Transformer::moe_adapters_fwd(Graph & g, Tensor out, Tensor in, const LayerActs & a,
                                   const ModelWeights::Layer & p, Proj proj, bool rc) const {
    const MoeDesc d = moe_desc(a.layer);
    for (const ExpertAdapter & ea : expert_adapters(p, proj)) {
        const ModelWeights::Adapter & ad = p.adapters[size_t(ea.index)];
        const AdapterActs & x = adapter_acts_[size_t(ea.site)];
        const Tensor dd = rc ? x.d_rc : x.d;
        g.moe_gemm(x.u, in, expert_stack(ad.a, ea.stride), a.moe_route, d, MoeGemm::fwd, ea.stride);
        g.moe_gemm(dd, x.u, expert_stack(ad.b, ea.stride), a.moe_route, d, MoeGemm::fwd, ea.stride);
        g.add_columns(out, dd, sites_[size_t(ea.site)].col0, lora_scale_);
    }
}

// dd = scale dout[:, slice]; dB_e += dd^T u, du = dd B_e; dA_e += du^T in, din += du A_e.
void Transformer::moe_adapters_bwd(Graph & g, Tensor din, Tensor dout, Tensor in, const LayerActs & a,
                                   const ModelWeights::Layer & p, const ModelWeights::Layer & dp, Proj proj) const {
    const MoeDesc d = moe_desc(a.layer);
    for (const ExpertAdapter & ea : expert_adapters(p, proj)) {
        const ModelWeights::Adapter & ad = p.adapters[size_t(ea.index)], & dad = dp.adapters[size_t(ea.index)];
        const AdapterActs & x = adapter_acts_[size_t(ea.site)];
        g.take_columns(x.dd, dout, sites_[size_t(ea.site)].col0, lora_scale_);
        g.moe_gemm(expert_stack(dad.b, ea.stride), x.dd, x.u, a.moe_route, d, MoeGemm::weight, ea.stride);
        g.moe_gemm(x.du, x.dd, expert_stack(ad.b, ea.stride), a.moe_route, d, MoeGemm::data, ea.stride);
        g.moe_gemm(expert_stack(dad.a, ea.stride), x.du, in, a.moe_route, d, MoeGemm::weight, ea.stride);
        if (din.valid()) g.moe_gemm(din, x.du, expert_stack(ad.a, ea.stride), a.moe_route, d, MoeGemm::data, ea.stride, true);
    }
}

void Transformer::moe_fc(Graph & g, Tensor fch, Tensor xs, const LayerActs & a, const ModelWeights::Layer & p,
                         Tensor x, bool rc) const {
    const MoeDesc d = moe_desc(a.layer);
    g.moe_gather(xs, x, a.moe_route, d);
    if (p.fcq.valid()) g.moe_qgemm(fch, xs, p.fcq, a.moe_route, d, MoeGemm::fwd);
    else g.moe_gemm(fch, xs, p.fcw, a.moe_route, d, MoeGemm::fwd);
    moe_adapters_fwd(g, fch, xs, a, p, Proj::fc, rc);
}

void Transformer::moe_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x,
                          bool need_output) const {
    if (ep_cap_ > 0) return ep_fwd(g, a, p, x, need_output);
    const MoeDesc d = moe_desc(a.layer);
    const int64_t width = moe_stats_width(d);
    g.matmul_fwd(a.moe_logits, x, p.routerw, Tensor{}, WeightLayout::out_in);
    // A recomputed segment routes again: the same route, the same statistics rewritten.
    g.moe_route(a.moe_route, a.moe_wts, moe_stats_.view(d.layer * width, {width}), a.moe_logits, d);
    moe_fc(g, a.fch, a.moe_xs, a, p, x, a.rc);
    act_fwd(g, a.fch_gelu, a.fch);
    if (!need_output) return;
    if (p.fcprojq.valid()) g.moe_qgemm(a.moe_y, a.fch_gelu, p.fcprojq, a.moe_route, d, MoeGemm::fwd);
    else g.moe_gemm(a.moe_y, a.fch_gelu, p.fcprojw, a.moe_route, d, MoeGemm::fwd);
    moe_adapters_fwd(g, a.moe_y, a.fch_gelu, a, p, Proj::down, a.rc);
    g.moe_combine(a.fcproj, a.moe_y, a.moe_wts, a.moe_route, d);
    shared_expert_fwd(g, a, p, x);
}

// Qwen2-MoE's shared expert over every token, gated by sigmoid(x . g), added into a.fcproj.
void Transformer::shared_expert_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x) const {
    if (!p.shw1.valid()) return;
    g.matmul_fwd(a.sh_fc, x, p.shw1, Tensor{}, WeightLayout::out_in);
    act_fwd(g, a.sh_act, a.sh_fc);
    g.matmul_fwd(a.sh_out, a.sh_act, p.shw2, Tensor{}, WeightLayout::out_in);
    g.matmul_fwd(a.sh_gate, x, p.shgw, Tensor{}, WeightLayout::out_in);
    g.sigmoid_gate_fwd(a.fcproj, a.sh_out, a.sh_gate);
}

// d(output) dispatched (dys); g = dys . W_down per expert; the weights' gradient g . act, then g
// and dys times the weights (d(act) and d(expert output)); the down and gate|up weight
// gradients; d(x) through the experts (scattered back) and through the router.
void Transformer::moe_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p,
                          const ModelWeights::Layer & dp, Tensor x, Tensor dout) const {
    if (ep_cap_ > 0) return ep_bwd(g, a, p, dp, x, dout);
    const MoeDesc d = moe_desc(a.layer);
    g.moe_gather(a.moe_dys, dout, a.moe_route, d);
    if (p.fcprojq.valid()) g.moe_qgemm(a.dfch_gelu, a.moe_dys, p.fcprojq, a.moe_route, d, MoeGemm::data);
    else g.moe_gemm(a.dfch_gelu, a.moe_dys, p.fcprojw, a.moe_route, d, MoeGemm::data);
    // The down adapters' share of g (unweighted): g += scale (dys B_e) A_e, so that g . act is
    // d(output) . y whole (the weights' gradient) and the weighting below covers both.
    const std::vector<ExpertAdapter> down = expert_adapters(p, Proj::down), fc = expert_adapters(p, Proj::fc);
    for (const ExpertAdapter & ea : down) {
        const ModelWeights::Adapter & ad = p.adapters[size_t(ea.index)];
        const Tensor du = adapter_acts_[size_t(ea.site)].du;
        g.moe_gemm(du, a.moe_dys, expert_stack(ad.b, ea.stride), a.moe_route, d, MoeGemm::data, ea.stride);
        g.scale(du, lora_scale_);
        g.moe_gemm(a.dfch_gelu, du, expert_stack(ad.a, ea.stride), a.moe_route, d, MoeGemm::data, ea.stride, true);
    }
    g.moe_weight_bwd(a.moe_dwts, a.dfch_gelu, a.moe_dys, a.fch_gelu, a.moe_wts, a.moe_route, d);
    if (dp.fcprojw.valid()) g.moe_gemm(dp.fcprojw, a.moe_dys, a.fch_gelu, a.moe_route, d, MoeGemm::weight);
    moe_adapters_bwd(g, Tensor{}, a.moe_dys, a.fch_gelu, a, p, dp, Proj::down);
    act_bwd(g, a.dfch, a.dfch_gelu, a.fch);
    if (dp.fcw.valid() || !fc.empty()) g.moe_gather(a.moe_xs_b, x, a.moe_route, d);
    if (dp.fcw.valid()) g.moe_gemm(dp.fcw, a.dfch, a.moe_xs_b, a.moe_route, d, MoeGemm::weight);
    if (p.fcq.valid()) g.moe_qgemm(a.moe_dxs, a.dfch, p.fcq, a.moe_route, d, MoeGemm::data);
    else g.moe_gemm(a.moe_dxs, a.dfch, p.fcw, a.moe_route, d, MoeGemm::data);
    moe_adapters_bwd(g, a.moe_dxs, a.dfch, a.moe_xs_b, a, p, dp, Proj::fc);
    g.moe_scatter(a.dln2, a.moe_dxs, a.moe_route, d, false);
    g.moe_route_bwd(a.moe_dlogits, a.moe_dwts, a.moe_logits, a.moe_route, a.moe_wts, moe_stats_, d);
    g.matmul_bwd(a.dln2, dp.routerw, Tensor{}, a.moe_dlogits, x, p.routerw, WeightLayout::out_in, true);
    shared_expert_bwd(g, a, p, dp, x, dout);
}

void Transformer::shared_expert_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p,
                                    const ModelWeights::Layer & dp, Tensor x, Tensor dout) const {
    if (!p.shw1.valid()) return;
    g.sigmoid_gate_bwd(a.sh_dout, a.sh_dgate, dout, a.sh_out, a.sh_gate);
    g.matmul_bwd(a.sh_dact, dp.shw2, Tensor{}, a.sh_dout, a.sh_act, p.shw2, WeightLayout::out_in);
    act_bwd(g, a.sh_dfc, a.sh_dact, a.sh_fc);
    g.matmul_bwd(a.dln2, dp.shw1, Tensor{}, a.sh_dfc, x, p.shw1, WeightLayout::out_in, true);
    g.matmul_bwd(a.dln2, dp.shgw, Tensor{}, a.sh_dgate, x, p.shgw, WeightLayout::out_in, true);
}

}  // namespace memfit
