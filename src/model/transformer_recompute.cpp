// Recomputation in the transformer (model/recompute.h): the units a layer's keep mask dropped,
// recomputed into its rc_ set just before its backward, for the pre-norm families and OLMo 2.
#include "model/transformer.h"

namespace memfit {

// The qkv and attention units of layer l, where its mask dropped them, into rc_[l]; `a` then
// points at them. qkv reads ln_1's output, or (post_norm) the layer's input x.
void Transformer::recompute_attention(Graph & g, int l, LayerActs & a, const ModelWeights::Layer & p, Tensor x) const {
    const LayerActs & r = rc(l);
    auto dropped = [&](Saved u) { return !rc_plan_.keeps(l, u); };
    if (dropped(Saved::qkv)) {
        qkv_fwd(g, r, cfg_.post_norm ? x : gather_rows(g, a.ln1, r.ln1g, Phase::recompute), p, 0);
        a.qkv = r.qkv, a.qk_raw = r.qk_raw, a.qk_rstd = r.qk_rstd;
    }
    // One attention forward recomputes the output and the probabilities (or lse) together; a
    // kept one of the pair is rewritten with the identical values it holds.
    const bool probs_dropped = !flash_ && dropped(Saved::attn_probs);
    if (dropped(Saved::attn_out) || probs_dropped) {
        if (dropped(Saved::attn_out)) a.atty = r.atty, a.lse = r.lse;
        if (probs_dropped) a.att = r.att;
        attention_fwd(g, l, a.atty, a.lse, a.att, r, a.qkv);
    }
}

Transformer::LayerActs Transformer::recompute_dropped(Graph & g, int l, const ModelWeights::Layer & p, Tensor x) const {
    if (cfg_.post_norm) return recompute_dropped_post(g, l, p, x);
    const LayerActs & r = rc(l);
    LayerActs a = acts(l);
    auto dropped = [&](Saved u) { return !rc_plan_.keeps(l, u); };
    if (dropped(Saved::ln1)) {
        norm_fwd(g, r.ln1, r.ln1_mean, r.ln1_rstd, x, p.ln1w, p.ln1b);
        a.ln1 = r.ln1, a.ln1_mean = r.ln1_mean, a.ln1_rstd = r.ln1_rstd;
    }
    recompute_attention(g, l, a, p, x);
    if (dropped(Saved::res2) && !cfg_.parallel_residual) {   // parallel: backward never reads res2
        project(g, r.attproj, a.atty, p, Proj::o, true);
        const PostNorm n1 = post_norm(r, p, nullptr, false);   // Gemma 3's; else the sum as it is
        g.residual_fwd(r.res2, x, sublayer_out(g, r.attproj, r.attproj_s, r.tp_attn, n1.out, n1.rstd, n1.w,
                                               Phase::recompute));
        a.res2 = r.res2;
    }
    if (dropped(Saved::ln2)) {
        norm_fwd(g, r.ln2, r.ln2_mean, r.ln2_rstd, cfg_.parallel_residual ? x : a.res2, p.ln2w, p.ln2b);
        a.ln2 = r.ln2, a.ln2_mean = r.ln2_mean, a.ln2_rstd = r.ln2_rstd;
    }
    if (dropped(Saved::fc) && cfg_.moe_layer(l)) {   // the experts' first matmul over the kept route
        if (ep_cap_ > 0) ep_fc(g, r.fch, a, p);   // (expert parallel: over the kept rows received)
        else moe_fc(g, r.fch, r.moe_xs, a, p, a.ln2, true);
        a.fch = r.fch;
    } else if (dropped(Saved::fc) && mlp_rows_ == 0) {   // TiledMLP: backward recomputes chunk by chunk
        project(g, r.fch, gather_rows(g, a.ln2, r.ln2g, Phase::recompute), p, Proj::fc, true);
        a.fch = r.fch;
    }
    if (dropped(Saved::gelu) && mlp_rows_ == 0) {
        act_fwd(g, r.fch_gelu, a.fch);
        a.fch_gelu = r.fch_gelu;
    }
    return a;
}

// post_norm (OLMo 2): backward reads each norm's input (the output projections, attproj and
// fcproj) and rstd, not its output; the ln1 and ln2 units are those, recomputed with their
// projections, and ln2's last (it reads the MLP's activation).
Transformer::LayerActs Transformer::recompute_dropped_post(Graph & g, int l, const ModelWeights::Layer & p,
                                                           Tensor x) const {
    const LayerActs & r = rc(l);
    LayerActs a = acts(l);
    auto dropped = [&](Saved u) { return !rc_plan_.keeps(l, u); };
    recompute_attention(g, l, a, p, x);
    if (dropped(Saved::ln1)) {
        project(g, r.attproj, a.atty, p, Proj::o, true);
        g.rmsnorm_fwd(r.ln1, r.ln1_rstd, r.attproj, p.ln1w, cfg_.ln_eps);
        a.attproj = r.attproj, a.ln1_rstd = r.ln1_rstd;
    }
    if (dropped(Saved::res2)) {   // the norm's output again (kept by no unit), then the add
        g.rmsnorm_fwd(r.ln1, r.ln1_rstd, a.attproj, p.ln1w, cfg_.ln_eps);
        g.residual_fwd(r.res2, x, r.ln1);
        a.res2 = r.res2;
    }
    if (dropped(Saved::fc) && mlp_rows_ == 0) {   // TiledMLP: backward recomputes chunk by chunk
        project(g, r.fch, a.res2, p, Proj::fc, true);
        a.fch = r.fch;
    }
    if (dropped(Saved::gelu) && mlp_rows_ == 0) {
        act_fwd(g, r.fch_gelu, a.fch);
        a.fch_gelu = r.fch_gelu;
    }
    if (dropped(Saved::ln2)) {
        if (mlp_rows_ > 0) mlp_tiled_fwd(g, r, p, a.res2);
        else project(g, r.fcproj, a.fch_gelu, p, Proj::down, true);
        g.rmsnorm_fwd(r.ln2, r.ln2_rstd, r.fcproj, p.ln2w, cfg_.ln_eps);
        a.fcproj = r.fcproj, a.ln2_rstd = r.ln2_rstd;
    }
    return a;
}

}  // namespace memfit
