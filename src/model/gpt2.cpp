#include "model/gpt2.h"

#include "core/error.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace memfit {

Gpt2Weights gpt2_weights(const ModelConfig & cfg, const ParamLayout & layout, BufferId flat, DType dtype) {
    auto view = [&](const std::string & name) {
        const ParamInfo & p = layout.find(name);
        Tensor t(flat, dtype, {int64_t(p.numel)}, p.offset * dtype_size(dtype));
        t.ndim = int(p.shape.size());
        for (int i = 0; i < t.ndim; ++i) t.shape[i] = p.shape[size_t(i)];
        return t;
    };
    Gpt2Weights w;
    w.wte = view("wte.weight");
    w.wpe = view("wpe.weight");
    w.lnfw = view("ln_f.weight");
    w.lnfb = view("ln_f.bias");
    for (int l = 0; l < cfg.n_layer; ++l) {
        const std::string h = fmt::format("h.{}.", l);
        w.h.push_back(Gpt2Weights::Layer{
            view(h + "ln_1.weight"), view(h + "ln_1.bias"), view(h + "attn.c_attn.weight"), view(h + "attn.c_attn.bias"),
            view(h + "attn.c_proj.weight"), view(h + "attn.c_proj.bias"), view(h + "ln_2.weight"), view(h + "ln_2.bias"),
            view(h + "mlp.c_fc.weight"), view(h + "mlp.c_fc.bias"), view(h + "mlp.c_proj.weight"),
            view(h + "mlp.c_proj.bias")});
    }
    return w;
}

Tensor Gpt2::act(Program & program, const std::string & name, std::initializer_list<int64_t> dims, bool f32) const {
    int64_t n = 1;
    for (auto d : dims) n *= d;
    const DType dt = f32 ? DType::f32 : dt_;
    BufferId id = program.declare(name, Category::activations, size_t(n) * dtype_size(dt));
    return Tensor(id, dt, dims);
}

Gpt2::LayerActs Gpt2::declare_layer(Program & program, const std::string & h, bool with_backward) const {
    const int64_t b = B_, t = T_, C = cfg_.n_embd, NH = cfg_.n_head;
    auto act = [&](const std::string & name, std::initializer_list<int64_t> dims, bool f32 = false) {
        return this->act(program, h + name, dims, f32);
    };
    LayerActs a;
    a.ln1 = act("ln_1.out", {b, t, C});
    a.ln1_mean = act("ln_1.mean", {b, t}, true);
    a.ln1_rstd = act("ln_1.rstd", {b, t}, true);
    a.qkv = act("attn.qkv", {b, t, 3 * C});
    if (flash_) a.lse = act("attn.lse", {b, NH, t}, true);
    else a.att = act("attn.probs", {b, NH, t, t});
    a.atty = act("attn.out", {b, t, C});
    a.attproj = act("attn.proj", {b, t, C});
    a.res2 = act("residual_attn", {b, t, C});
    a.ln2 = act("ln_2.out", {b, t, C});
    a.ln2_mean = act("ln_2.mean", {b, t}, true);
    a.ln2_rstd = act("ln_2.rstd", {b, t}, true);
    a.fch = act("mlp.fc", {b, t, 4 * C});
    a.fch_gelu = act("mlp.gelu", {b, t, 4 * C});
    a.fcproj = act("mlp.proj", {b, t, C});
    a.res3 = act("residual_mlp", {b, t, C});
    if (with_backward) {
        a.dfch_gelu = act("mlp.gelu.grad", {b, t, 4 * C});
        a.dfch = act("mlp.fc.grad", {b, t, 4 * C});
        a.dln2 = act("ln_2.out.grad", {b, t, C});
        a.datty = act("attn.out.grad", {b, t, C});
        a.dqkv = act("attn.qkv.grad", {b, t, 3 * C});
        a.dln1 = act("ln_1.out.grad", {b, t, C});
    }
    return a;
}

Gpt2::Gpt2(const ModelConfig & cfg, int B, int T, Program & program, const Gpt2Options & opt)
    : cfg_(cfg), B_(B), T_(T) {
    const int64_t b = B, t = T, C = cfg.n_embd, V = cfg.vocab_size;
    flash_ = opt.flash_attention;
    dt_ = opt.compute;
    if (opt.with_backward) rc_plan_ = opt.recompute;
    auto act = [&](const std::string & name, std::initializer_list<int64_t> dims, bool f32 = false) {
        return this->act(program, name, dims, f32);
    };
    encoded_ = act("encoded", {b, t, C});
    for (int l = 0; l < cfg.n_layer; ++l) {
        const std::string h = fmt::format("h.{}.", l);
        layers_.push_back(declare_layer(program, h, opt.with_backward));
        // The recomputed set; buffers a policy never touches have no lifetime and take no bytes.
        if (rc_plan_.recomputes()) rc_.push_back(declare_layer(program, h + "rc.", false));
    }
    lnf_ = act("ln_f.out", {b, t, C});
    lnf_mean_ = act("ln_f.mean", {b, t}, true);
    lnf_rstd_ = act("ln_f.rstd", {b, t}, true);
    chunk_rows_ = opt.loss_chunk > 0 && opt.loss_chunk < b * t && !opt.keep_logits ? opt.loss_chunk : int(b * t);
    if (opt.keep_logits)
        logits_ = Tensor(program.declare("logits", Category::activations, size_t(b * t * V) * 4, true), DType::f32,
                         {b, t, V});
    else if (chunk_rows_ < b * t)
        logits_ = act("logits.chunk", {int64_t(chunk_rows_), V}, true);
    else
        logits_ = act("logits", {b, t, V}, true);
    if (opt.with_backward) {
        dlnf_ = act("ln_f.out.grad", {b, t, C});
        dres_ = act("residual.grad", {b, t, C});
    }
}

void Gpt2::layer_forward(Graph & g, const LayerActs & a, const Gpt2Weights::Layer & p, Tensor x, bool need_output) const {
    const int NH = cfg_.n_head;
    const float eps = cfg_.ln_eps;
    g.layernorm_fwd(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, eps);
    g.matmul_fwd(a.qkv, a.ln1, p.qkvw, p.qkvb, WeightLayout::in_out);
    if (flash_) g.flash_attention_fwd(a.atty, a.lse, a.qkv, NH);
    else g.attention_fwd(a.atty, a.att, a.qkv, NH);
    g.matmul_fwd(a.attproj, a.atty, p.projw, p.projb, WeightLayout::in_out);
    g.residual_fwd(a.res2, x, a.attproj);
    g.layernorm_fwd(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, eps);
    g.matmul_fwd(a.fch, a.ln2, p.fcw, p.fcb, WeightLayout::in_out);
    g.gelu_fwd(a.fch_gelu, a.fch);
    if (!need_output) return;
    g.matmul_fwd(a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, WeightLayout::in_out);
    g.residual_fwd(a.res3, a.res2, a.fcproj);
}

void Gpt2::forward(Graph & g, const Gpt2Weights & w, Tensor tokens) const {
    g.phase(Phase::forward);
    g.layer(-1);
    // wpe holds max_seq rows; the step uses the first T.
    g.encoder_fwd(encoded_, tokens, w.wte, w.wpe);
    Tensor x = encoded_;
    for (int l = 0; l < cfg_.n_layer; ++l) {
        g.layer(l);
        layer_forward(g, layers_[size_t(l)], w.h[size_t(l)], x, true);
        x = layers_[size_t(l)].res3;
    }
    g.layer(-1);
    g.layernorm_fwd(lnf_, lnf_mean_, lnf_rstd_, x, w.lnfw, w.lnfb, cfg_.ln_eps);
}

void Gpt2::head_logits(Graph & g, const Gpt2Weights & w) const {
    MF_ASSERT(chunk_rows_ == B_ * T_);
    g.phase(Phase::forward);
    g.layer(-1);
    g.matmul_fwd(logits_, lnf_, w.wte, Tensor{}, WeightLayout::out_in);
}

void Gpt2::head_loss(Graph & g, const Gpt2Weights & w, const Gpt2Weights * dw, Tensor targets, Tensor losses,
                     float dloss) const {
    const int64_t N = int64_t(B_) * T_, C = cfg_.n_embd, V = cfg_.vocab_size;
    g.layer(-1);
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows_) {
        const int64_t n = std::min<int64_t>(chunk_rows_, N - r0);
        const Tensor x = lnf_.view(r0 * C, {n, C});
        const Tensor logits = logits_.view(0, {n, V});
        const Tensor tgt = targets.view(r0, {n});
        g.phase(Phase::forward);
        g.matmul_fwd(logits, x, w.wte, Tensor{}, WeightLayout::out_in);
        g.xent_fwd(losses.view(r0, {n}), logits, tgt);
        if (!dw) continue;
        g.phase(Phase::backward);
        g.xent_bwd(logits, tgt, dloss);
        g.matmul_bwd(dlnf_.view(r0 * C, {n, C}), dw->wte, Tensor{}, logits, x, w.wte, WeightLayout::out_in);
    }
}

Gpt2::LayerActs Gpt2::recompute_dropped(Graph & g, int l, const Gpt2Weights::Layer & p, Tensor x) const {
    const LayerActs & r = rc_[size_t(l)];
    LayerActs a = layers_[size_t(l)];
    auto dropped = [&](Saved u) { return !rc_plan_.keeps(l, u); };
    const float eps = cfg_.ln_eps;
    if (dropped(Saved::ln1)) {
        g.layernorm_fwd(r.ln1, r.ln1_mean, r.ln1_rstd, x, p.ln1w, p.ln1b, eps);
        a.ln1 = r.ln1, a.ln1_mean = r.ln1_mean, a.ln1_rstd = r.ln1_rstd;
    }
    if (dropped(Saved::qkv)) {
        g.matmul_fwd(r.qkv, a.ln1, p.qkvw, p.qkvb, WeightLayout::in_out);
        a.qkv = r.qkv;
    }
    // One attention forward recomputes the output and the probabilities (or lse) together; a
    // kept one of the pair is rewritten with the identical values it holds.
    const bool probs_dropped = !flash_ && dropped(Saved::attn_probs);
    if (dropped(Saved::attn_out) || probs_dropped) {
        if (dropped(Saved::attn_out)) a.atty = r.atty, a.lse = r.lse;
        if (probs_dropped) a.att = r.att;
        if (flash_) g.flash_attention_fwd(a.atty, a.lse, a.qkv, cfg_.n_head);
        else g.attention_fwd(a.atty, a.att, a.qkv, cfg_.n_head);
    }
    if (dropped(Saved::res2)) {
        g.matmul_fwd(r.attproj, a.atty, p.projw, p.projb, WeightLayout::in_out);
        g.residual_fwd(r.res2, x, r.attproj);
        a.res2 = r.res2;
    }
    if (dropped(Saved::ln2)) {
        g.layernorm_fwd(r.ln2, r.ln2_mean, r.ln2_rstd, a.res2, p.ln2w, p.ln2b, eps);
        a.ln2 = r.ln2, a.ln2_mean = r.ln2_mean, a.ln2_rstd = r.ln2_rstd;
    }
    if (dropped(Saved::fc)) {
        g.matmul_fwd(r.fch, a.ln2, p.fcw, p.fcb, WeightLayout::in_out);
        a.fch = r.fch;
    }
    if (dropped(Saved::gelu)) {
        g.gelu_fwd(r.fch_gelu, a.fch);
        a.fch_gelu = r.fch_gelu;
    }
    return a;
}

void Gpt2::backward(Graph & g, const Gpt2Weights & w, const Gpt2Weights & dw, Tensor tokens) const {
    const int NH = cfg_.n_head, L = cfg_.n_layer, K = rc_plan_.segment;
    // The input of layer l as forward saved it.
    auto saved_input = [&](int l) { return l > 0 ? layers_[size_t(l) - 1].res3 : encoded_; };
    g.phase(Phase::backward);
    g.layer(-1);
    // head_loss left d(ln_f output) in dlnf_.
    g.fill_zero(dres_);
    g.layernorm_bwd(dres_, dw.lnfw, dw.lnfb, dlnf_, saved_input(L), w.lnfw, lnf_mean_, lnf_rstd_);
    for (int l = L - 1; l >= 0; --l) {
        const auto & p = w.h[size_t(l)];
        const auto & dp = dw.h[size_t(l)];
        Tensor x = saved_input(l);
        LayerActs a;
        if (K >= 2) {
            const int seg = l - l % K;   // first layer of l's segment: its input is the checkpoint
            if (l == std::min(seg + K, L) - 1) {
                // Recompute the segment's forward, from the checkpoint, into the rc buffers.
                g.phase(Phase::recompute);
                Tensor in = saved_input(seg);
                for (int r = seg; r <= l; ++r) {
                    g.layer(r);
                    layer_forward(g, rc_[size_t(r)], w.h[size_t(r)], in, r < l);
                    in = rc_[size_t(r)].res3;
                }
                g.phase(Phase::backward);
            }
            if (l > seg) x = rc_[size_t(l) - 1].res3;
            a = rc_[size_t(l)];
            // The gradient buffers are the layer's own.
            const LayerActs & f = layers_[size_t(l)];
            a.dfch_gelu = f.dfch_gelu, a.dfch = f.dfch, a.dln2 = f.dln2, a.datty = f.datty, a.dqkv = f.dqkv;
            a.dln1 = f.dln1;
        } else {
            g.layer(l);
            g.phase(Phase::recompute);
            a = rc_plan_.kept(l) == kKeepAll ? layers_[size_t(l)] : recompute_dropped(g, l, p, x);
            g.phase(Phase::backward);
        }
        g.layer(l);
        // dres holds d(residual_mlp); the MLP branch's output gradient is the same tensor.
        g.matmul_bwd(a.dfch_gelu, dp.fcprojw, dp.fcprojb, dres_, a.fch_gelu, p.fcprojw, WeightLayout::in_out);
        g.gelu_bwd(a.dfch, a.dfch_gelu, a.fch);
        g.matmul_bwd(a.dln2, dp.fcw, dp.fcb, a.dfch, a.ln2, p.fcw, WeightLayout::in_out);
        g.layernorm_bwd(dres_, dp.ln2w, dp.ln2b, a.dln2, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd);
        g.matmul_bwd(a.datty, dp.projw, dp.projb, dres_, a.atty, p.projw, WeightLayout::in_out);
        if (flash_) g.flash_attention_bwd(a.dqkv, a.datty, a.atty, a.qkv, a.lse, NH);
        else g.attention_bwd(a.dqkv, a.datty, a.qkv, a.att, NH);
        g.matmul_bwd(a.dln1, dp.qkvw, dp.qkvb, a.dqkv, a.ln1, p.qkvw, WeightLayout::in_out);
        g.layernorm_bwd(dres_, dp.ln1w, dp.ln1b, a.dln1, x, p.ln1w, a.ln1_mean, a.ln1_rstd);
    }
    g.layer(-1);
    g.encoder_bwd(dw.wte, dw.wpe, dres_, tokens);
}

}  // namespace memfit
