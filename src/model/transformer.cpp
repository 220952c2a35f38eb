#include "model/transformer.h"

#include "model/activation_offload.h"

#include <string_view>
#include <unordered_map>

#include "backend/quant_format.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace memfit {

Tensor Transformer::act(Program & program, std::string_view name, std::initializer_list<int64_t> dims, bool f32,
                        std::string_view suffix) const {
    int64_t n = 1;
    for (auto d : dims) n *= d;
    const DType dt = f32 ? DType::f32 : dt_;
    std::string full;
    full.reserve(prefix_.size() + name.size() + suffix.size());
    full.append(prefix_).append(name).append(suffix);
    BufferId id = program.declare(std::move(full), Category::activations, size_t(n) * dtype_size(dt));
    return Tensor(id, dt, dims);
}

Transformer::LayerActs Transformer::declare_layer(Program & program, const std::string & h, bool with_backward) const {
    const int layer = std::stoi(h.substr(2));
    const bool moe = cfg_.moe_layer(layer);
    const int64_t b = B_, t = T_, C = cfg_.n_embd, NH = cfg_.n_head, Q = cfg_.qkv_dim(), F = cfg_.layer_fc_dim(layer),
                  A = cfg_.layer_ffn(layer), H = cfg_.attn_dim(), QR = 3 * H;
    auto act = [&](std::string_view name, std::initializer_list<int64_t> dims, bool f32 = false) {
        return this->act(program, h, dims, f32, name);
    };
    // The residual stream's buffers: [B, T, C], or this rank's rows of it (sequence parallel).
    const int64_t n = rows_;
    auto stream = [&](std::string_view name) { return sp_ ? act(name, {n, C}) : act(name, {b, t, C}); };
    auto stats = [&](std::string_view name) { return sp_ ? act(name, {n}, true) : act(name, {b, t}, true); };
    LayerActs a;
    a.layer = layer;
    a.rc = h.ends_with("rc.");
    a.ln1 = stream("ln_1.out");
    if (layer_norm_) a.ln1_mean = stats("ln_1.mean");
    a.ln1_rstd = stats("ln_1.rstd");
    a.qkv = act("attn.qkv", {b, t, Q});
    if (cfg_.qk_norm) {   // the q and k parts of qkv before their norms, and a rstd per group
        const int64_t groups = cfg_.qk_norm_q_groups() + cfg_.qk_norm_k_groups();
        a.qk_raw = act("attn.qk_norm.in", {b, t, (NH + cfg_.kv_heads()) * cfg_.head_dim()});
        a.qk_rstd = act("attn.qk_norm.rstd", {b, t, groups}, true);
    }
    if (gqa_ && !cp_.enabled()) a.qkv_rep = act("attn.qkv_rep", {b, t, QR});
    if (cp_.enabled()) declare_cp(program, h, with_backward, a);
    if (flash_) a.lse = act("attn.lse", {b, NH, t}, true);
    else a.att = act("attn.probs", {b, NH, t, t});
    a.atty = act("attn.out", {b, t, H});
    a.attproj = act("attn.proj", {b, t, C});
    a.res2 = stream("residual_attn");
    if (cfg_.sandwich_norm) {   // Gemma 3: the norms on attention's and the MLP's outputs
        a.pn1 = stream("post_attn_norm.out");
        a.pn1_rstd = stats("post_attn_norm.rstd");
        a.pn2 = stream("post_mlp_norm.out");
        a.pn2_rstd = stats("post_mlp_norm.rstd");
    }
    if (cfg_.qk_norm && cfg_.score_scale() != 1.0f) {
        a.qn_scaled = act("attn.q_norm.scaled", {cfg_.qk_norm_width()});
        if (with_backward)   // the k norm's gradient dtype: qk_norm_bwd writes both alike
            a.dqn_scaled = Tensor(program.declare(prefix_ + h + "attn.q_norm.scaled.grad", Category::activations,
                                                  size_t(cfg_.qk_norm_width()) * dtype_size(gdt_)),
                                  gdt_, {cfg_.qk_norm_width()});
    }
    a.ln2 = stream("ln_2.out");
    if (layer_norm_) a.ln2_mean = stats("ln_2.mean");
    a.ln2_rstd = stats("ln_2.rstd");
    // TiledMLP: one chunk of rows (M) of the MLP's intermediates at a time, kept by nothing.
    const int64_t M = mlp_rows_;
    // A sparse layer's: the experts' rows, N*k of them in expert order.
    // Expert parallel: the rows this rank's experts can receive, in the capacity layout.
    const int64_t routed = moe ? moe_rows(rows_, moe_desc(layer)) : 0;
    auto mlp = [&](const std::string & name, int64_t width) {
        return moe ? act(name, {routed, width}) : M > 0 ? act(name + ".chunk", {M, width}) : act(name, {b, t, width});
    };
    const std::string actname = !cfg_.gated() ? "mlp.gelu" : cfg_.glu == Glu::gelu_tanh ? "mlp.geglu" : "mlp.swiglu";
    a.fch = mlp("mlp.fc", F);
    a.fch_gelu = mlp(actname, A);
    a.fcproj = act("mlp.proj", {b, t, C});
    a.res3 = stream("residual_mlp");
    if (sp_) {
        a.ln1g = act("ln_1.gathered", {b, t, C});
        a.ln2g = act("ln_2.gathered", {b, t, C});
        a.attproj_s = stream("attn.proj.rows");
        a.fcproj_s = stream("mlp.proj.rows");
        if (with_backward) {
            a.ln1g_b = act("ln_1.gathered.bwd", {b, t, C});
            a.ln2g_b = act("ln_2.gathered.bwd", {b, t, C});
            a.dln1_s = stream("ln_1.out.grad.rows");
            a.dln2_s = stream("ln_2.out.grad.rows");
            a.dres_g1 = act("residual.grad.gathered.mlp", {b, t, C});
            a.dres_g2 = act("residual.grad.gathered.attn", {b, t, C});
        }
    }
    a.tp_attn = tp_scratch(program, h + "attn.proj.tp_sum", b * t * C);
    a.tp_mlp = tp_scratch(program, h + "mlp.proj.tp_sum", b * t * C);
    if (with_backward) {
        a.tp_dln1 = tp_scratch(program, h + "ln_1.out.grad.tp_sum", b * t * C);
        a.tp_dln2 = tp_scratch(program, h + "ln_2.out.grad.tp_sum", b * t * C);
        a.dfch_gelu = mlp(actname + ".grad", A);
        a.dfch = mlp("mlp.fc.grad", F);
        if (M > 0) {
            a.fch_b = act("mlp.fc.chunk.bwd", {M, F});
            a.fch_gelu_b = act(actname + ".chunk.bwd", {M, A});
        }
        a.dln2 = act("ln_2.out.grad", {b, t, C});
        a.datty = act("attn.out.grad", {b, t, H});
        a.dqkv = act("attn.qkv.grad", {b, t, Q});
        if (gqa_) {
            a.qkv_rep_b = act("attn.qkv_rep.bwd", {b, t, QR});
            a.dqkv_rep = act("attn.qkv_rep.grad", {b, t, QR});
        }
        a.dln1 = act("ln_1.out.grad", {b, t, C});
        if (has_post_norm()) a.dpost = stream("post_norm.in.grad");
    }
    if (moe) declare_moe(program, h, with_backward, a);
    return a;
}

Transformer::Transformer(const ModelConfig & cfg, int B, int T, Program & program, const ModelOptions & opt)
    : cfg_(cfg), B_(B), T_(T), lb_(opt.layer_begin), le_(opt.layer_end < 0 ? cfg.n_layer : opt.layer_end),
      prefix_(opt.prefix), tp_(opt.tp), sp_(opt.tp.enabled() && opt.tp.sequence),
      rows_(sp_ ? int64_t(B) * T / opt.tp.ranks : int64_t(B) * T) {
    MF_ASSERT(!sp_ || rows_ * opt.tp.ranks == int64_t(B) * T);
    MF_ASSERT(lb_ >= 0 && lb_ < le_ && le_ <= cfg.n_layer);
    MF_ASSERT((lb_ == 0 && le_ == cfg.n_layer) || (opt.kv_capacity == 0 && !opt.keep_logits));
    const int64_t b = B, t = T, C = cfg.n_embd, V = cfg.vocab_size;
    MF_ASSERT(!tp_.enabled() || (opt.kv_capacity == 0 && !opt.keep_logits));
    llama_ = cfg.llama();
    layer_norm_ = !llama_ || cfg.layer_norm;
    gqa_ = llama_ && cfg.kv_heads() != cfg.n_head;
    cp_ = opt.cp;
    MF_ASSERT(!cp_.enabled() || (!tp_.enabled() && opt.kv_capacity == 0 && !opt.paged.enabled()));
    const int whole = std::max(T * cp_.ranks, opt.kv_capacity);   // the sequence RoPE's scaling sees
    rope_ = cfg.rope().for_sequence(whole);
    for (int l = 0; l < cfg.n_layer; ++l) layer_rope_.push_back(cfg.layer_rope(l).for_sequence(whole));
    wl_ = llama_ ? WeightLayout::out_in : WeightLayout::in_out;
    flash_ = opt.flash_attention || cp_.enabled();   // context parallel attention saves the lse too
    dt_ = opt.compute;
    gdt_ = opt.grad;
    if (opt.mlp_chunk > 0 && opt.mlp_chunk < int64_t(B) * T && opt.kv_capacity == 0) {
        MF_ASSERT(!opt.lora.enabled() && "TiledMLP: no LoRA (run/compat.cpp)");
        mlp_rows_ = opt.mlp_chunk;
    }
    if (opt.with_backward) rc_plan_ = opt.recompute;
    auto act = [&](const std::string & name, std::initializer_list<int64_t> dims, bool f32 = false) {
        return this->act(program, name, dims, f32);
    };
    auto stream = [&](const std::string & name) { return sp_ ? act(name, {rows_, C}) : act(name, {b, t, C}); };
    if (first_stage()) {
        encoded_ = stream("encoded");
        if (sp_) encoded_full_ = act("encoded.whole", {b, t, C});
        tp_encoded_ = tp_scratch(program, "encoded.tp_sum", b * t * C);
    } else {
        input_ = stream("stage.input");
    }
    if (cfg.moe.enabled()) {   // the sparse layers' routing statistics, one row each
        for (int l = 0, i = 0; l < cfg.n_layer; ++l) moe_index_.push_back(cfg.moe_layer(l) ? i++ : -1);
        const int64_t rows = cfg.moe_layers(), width = moe_stats_width(moe_desc(0));
        moe_stats_ = Tensor(program.declare(prefix_ + "moe.stats", Category::activations, size_t(rows * width) * 4, true),
                            DType::f32, {rows, width});
        if (cfg.moe.ep_ranks > 1) {   // model/expert_parallel.h
            ep_cap_ = moe_capacity_rows(rows_, cfg.moe.top_k, cfg.moe.experts, cfg.moe.capacity_factor);
            if (opt.with_backward && opt.recompute.recomputes())
                moe_stats_rc_ = Tensor(program.declare(prefix_ + "moe.stats.rc", Category::activations,
                                                       size_t(width) * 4), DType::f32, {width});
        }
    }
    for (int l = lb_; l < le_; ++l) {
        const std::string h = fmt::format("h.{}.", l);
        layers_.push_back(declare_layer(program, h, opt.with_backward));
        // The recomputed set; buffers a policy never touches have no lifetime and take no bytes.
        if (rc_plan_.recomputes()) rc_.push_back(declare_layer(program, h + "rc.", false));
    }
    // The rows the LM head computes at once: a chunk of the loss, or generation's last token.
    chunk_rows_ = opt.loss_chunk > 0 && opt.loss_chunk < b * t && !opt.keep_logits ? opt.loss_chunk : int(b * t);
    if (opt.lora.enabled()) {
        sites_ = lora_sites(cfg, opt.lora);
        lora_scale_ = opt.lora.scaling();
        lora_dropout_ = opt.with_backward ? opt.lora.dropout : 0.0f;
        lowest_trained_layer_ = cfg.n_layer;
        const int64_t r = opt.lora.rank;
        for (const auto & s : sites_) {
            const std::string n = s.module + ".lora.";
            // The head's adapter works on the head's rows (run/compat.cpp: no dropout, one stage).
            // An expert module's sites share the first expert's buffers, over the routed rows.
            if (s.expert > 0) {
                adapter_acts_.push_back({});
                continue;
            }
            const int64_t rows = s.expert == 0 ? rows_ * cfg.moe.top_k : !s.head ? b * t : opt.kv_capacity > 0 ? b : chunk_rows_;
            MF_ASSERT(!s.head || (lora_dropout_ == 0 && last_stage() && !tp_.enabled()));
            MF_ASSERT(!s.embed || (lora_dropout_ == 0 && first_stage() && !tp_.enabled()));
            AdapterActs x;
            // The embedding's are [B, T, .] (the encoder kernels read the batch's shape).
            x.u = s.embed ? act(n + "u", {b, t, r}) : act(n + "u", {rows, r});
            x.d = s.embed ? act(n + "d", {b, t, s.cols}) : act(n + "d", {rows, s.cols});
            if (rc_plan_.recomputes() && !s.head) x.d_rc = act(n + "rc.d", {s.expert == 0 ? rows : b * t, s.cols});
            if (lora_dropout_ > 0) {
                x.xd = act(n + "dropout", {b * t, s.in});
                x.xd_b = act(n + "dropout.bwd", {b * t, s.in});
                x.dxd = act(n + "dropout.grad", {b * t, s.in});
            }
            if (opt.with_backward) {
                x.dd = s.embed ? act(n + "d.grad", {b, t, s.cols}) : act(n + "d.grad", {rows, s.cols});
                x.du = s.embed ? act(n + "u.grad", {b, t, r}) : act(n + "u.grad", {rows, r});
            }
            if (opt.lora.dora) {   // block projections only (run/compat.cpp)
                MF_ASSERT(!s.head && !s.embed && lora_dropout_ == 0 && !tp_.enabled());
                x.z = act(n + "dora.z", {rows, s.cols});
                x.norm = act(n + "dora.norm", {s.cols}, true);
                const bool first = &s == &sites_.front() || (&s)[-1].layer != s.layer || (&s)[-1].proj != s.proj;
                if (opt.with_backward && first) x.dscaled = act(n + "dora.out.grad", {rows, proj_out_cols(cfg_, s.proj)});
            }
            adapter_acts_.push_back(x);
            lowest_trained_layer_ = std::min(lowest_trained_layer_, s.layer);
        }
    }
    if (opt.with_backward) dres_ = stream("residual.grad");
    if (opt.with_backward && sp_ && first_stage()) dres_embed_ = act("residual.grad.gathered.embed", {b, t, C});
    if (!last_stage()) return;
    lnf_ = act("ln_f.out", {b, t, C});
    lnf_s_ = sp_ ? stream("ln_f.out.rows") : lnf_;
    if (layer_norm_) lnf_mean_ = sp_ ? act("ln_f.mean", {rows_}, true) : act("ln_f.mean", {b, t}, true);
    lnf_rstd_ = sp_ ? act("ln_f.rstd", {rows_}, true) : act("ln_f.rstd", {b, t}, true);
    if (opt.paged.enabled()) {
        declare_paged(program, opt);
        return;
    }
    if (opt.kv_capacity > 0) {
        MF_ASSERT(B == 1 && !opt.with_backward && T <= opt.kv_capacity);
        const int64_t KV = int64_t(cfg.kv_heads()) * cfg.head_dim();
        for (int l = 0; l < cfg.n_layer; ++l) {
            const int64_t cap = opt.kv_full_capacity > 0 && cfg.layer_window(l) == 0 ? opt.kv_full_capacity : opt.kv_capacity;
            const size_t bytes = size_t(cap * KV) * dtype_size(dt_);
            kcache_.push_back(Tensor(program.declare(fmt::format("kv_cache.{}.k", l), Category::activations, bytes, true),
                                     dt_, {b, cap, KV}));
            vcache_.push_back(Tensor(program.declare(fmt::format("kv_cache.{}.v", l), Category::activations, bytes, true),
                                     dt_, {b, cap, KV}));
        }
        logits_ = Tensor(program.declare("logits", Category::activations, size_t(b * V) * 4, true), DType::f32, {b, V});
        return;
    }
    if (opt.keep_logits)
        logits_ = Tensor(program.declare("logits", Category::activations, size_t(b * t * V) * 4, true), DType::f32,
                         {b, t, V});
    else if (chunk_rows_ < b * t)
        logits_ = act("logits.chunk", {int64_t(chunk_rows_), V}, true);
    else
        logits_ = act("logits", {b, t, V}, true);
    if (opt.with_backward) {
        dlnf_ = act("ln_f.out.grad", {b, t, C});
        if (sp_) dlnf_s_ = stream("ln_f.out.grad.rows");
        tp_dlnf_ = tp_scratch(program, "ln_f.out.grad.tp_sum", b * t * C);
    }
    if (tp_.enabled()) {   // per chunk: this rank's (lse, target logit), every rank's, the whole lse
        xent_stats_ = act("loss.tp_stats", {2, int64_t(chunk_rows_)}, true);
        xent_gathered_ = act("loss.tp_gathered", {int64_t(tp_.ranks), 2, int64_t(chunk_rows_)}, true);
        xent_lse_ = act("loss.lse", {int64_t(chunk_rows_)}, true);
    }
}

Tensor Transformer::tp_scratch(Program & program, const std::string & name, int64_t elems) const {
    if (!tp_.enabled() || dt_ == DType::f32) return Tensor{};
    return Tensor(program.declare(prefix_ + name, Category::communication, size_t(elems) * 4), DType::f32, {elems});
}

Tensor Transformer::gather_rows(Graph & g, Tensor slice, Tensor full, Phase resume) const {
    if (!sp_) return slice;
    g.phase(Phase::communication);
    g.tp_all_gather(full.view(0, {full.numel()}), slice.view(0, {slice.numel()}));
    g.phase(resume);
    return full;
}

Tensor Transformer::reduce_rows(Graph & g, Tensor partial, Tensor slice, Tensor scratch, Phase resume) const {
    if (!sp_) {
        tp_sum(g, partial, scratch, resume);
        return partial;
    }
    g.phase(Phase::communication);
    g.tp_reduce_scatter(slice.view(0, {slice.numel()}), partial.view(0, {partial.numel()}), scratch);
    g.phase(resume);
    return slice;
}

void Transformer::tp_sum(Graph & g, Tensor t, Tensor scratch, Phase resume) const {
    if (!tp_.enabled()) return;
    g.phase(Phase::communication);
    g.tp_all_reduce(t, scratch);
    g.phase(resume);
}

void Transformer::norm_fwd(Graph & g, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b) const {
    if (!layer_norm_) g.rmsnorm_fwd(out, rstd, x, w, cfg_.ln_eps);
    else g.layernorm_fwd(out, mean, rstd, x, w, b, cfg_.ln_eps);
}

void Transformer::norm_bwd(Graph & g, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                           Tensor rstd) const {
    if (!layer_norm_) g.rmsnorm_bwd(dx, dw, dout, x, w, rstd);
    else g.layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd);
}

Tensor Transformer::sublayer_out(Graph & g, Tensor partial, Tensor slice, Tensor scratch, Tensor normed, Tensor rstd,
                                 Tensor w, Phase resume) const {
    const Tensor out = reduce_rows(g, partial, slice, scratch, resume);
    if (!has_post_norm()) return out;
    g.rmsnorm_fwd(normed, rstd, out, w, cfg_.ln_eps);
    return normed;
}

Transformer::PostNorm Transformer::post_norm(const LayerActs & a, const ModelWeights::Layer & p,
                                             const ModelWeights::Layer * dp, bool mlp) const {
    const ModelWeights::Layer none;
    const ModelWeights::Layer & d = dp ? *dp : none;
    if (cfg_.sandwich_norm) return mlp ? PostNorm{a.pn2, a.pn2_rstd, p.pn2w, d.pn2w} : PostNorm{a.pn1, a.pn1_rstd, p.pn1w, d.pn1w};
    return mlp ? PostNorm{a.ln2, a.ln2_rstd, p.ln2w, d.ln2w} : PostNorm{a.ln1, a.ln1_rstd, p.ln1w, d.ln1w};
}

Tensor Transformer::post_norm_bwd(Graph & g, Tensor dout_in, Tensor dw, Tensor in, Tensor w, Tensor rstd) const {
    g.fill_zero(dout_in);   // rmsnorm_bwd adds into its input gradient
    g.rmsnorm_bwd(dout_in, dw, dres_, in, w, rstd);
    return dout_in;
}

void Transformer::qkv_fwd(Graph & g, const LayerActs & a, Tensor ln1, const ModelWeights::Layer & p, int pos0) const {
    project(g, a.qkv, ln1, p, Proj::qkv, a.rc);
    if (cfg_.qk_norm) {
        Tensor wq = p.qnw;
        if (a.qn_scaled.valid()) {   // q scaled for query_pre_attn_scalar: its norm's weight times the factor
            g.take_columns(a.qn_scaled.view(0, {1, wq.numel()}), wq.view(0, {1, wq.numel()}), 0, cfg_.score_scale());
            wq = a.qn_scaled;
        }
        g.qk_norm_fwd(a.qkv, a.qk_raw, a.qk_rstd, wq, p.knw, cfg_.qk_norm_q_groups(), cfg_.qk_norm_k_groups(),
                      cfg_.ln_eps);
    }
    if (llama_) g.rope_fwd(a.qkv, cfg_.n_head, cfg_.kv_heads(), layer_rope_[size_t(a.layer)], pos0, docs_);
}

void Transformer::attention_fwd(Graph & g, int l, Tensor out, Tensor lse, Tensor att, const LayerActs & s,
                                Tensor qkv) const {
    const int NH = cfg_.n_head;
    if (cp_.enabled() && cp_.ring) {
        cp_ring_fwd(g, out, lse, s, qkv);
        return;
    }
    if (cp_.enabled()) {
        cp_gather(g, s.cp_kv, s.cp_all, s.cp_abs, qkv);
        g.cp_attention_fwd(out, lse, qkv, s.cp_abs, cp_meta_, NH, cfg_.kv_heads());
        return;
    }
    if (gqa_) {
        g.repeat_kv_fwd(s.qkv_rep, qkv, NH, cfg_.kv_heads());
        qkv = s.qkv_rep;
    }
    if (flash_) g.flash_attention_fwd(out, lse, qkv, NH, attention_start(l));
    else g.attention_fwd(out, att, qkv, NH, attention_start(l));
}

void Transformer::attention_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p,
                                const ModelWeights::Layer & dp) const {
    const int NH = cfg_.n_head, KVH = cfg_.kv_heads();
    Tensor qkv = a.qkv, dqkv = a.dqkv;
    if (cp_.enabled() && cp_.ring) {
        cp_ring_bwd(g, a);
    } else if (cp_.enabled()) {
        cp_attention_bwd(g, a);
    } else {
        if (gqa_) {
            g.repeat_kv_fwd(a.qkv_rep_b, a.qkv, NH, KVH);
            qkv = a.qkv_rep_b;
            dqkv = a.dqkv_rep;
        }
        if (flash_) g.flash_attention_bwd(dqkv, a.datty, a.atty, qkv, a.lse, NH, attention_start(a.layer));
        else g.attention_bwd(dqkv, a.datty, qkv, a.att, NH, attention_start(a.layer));
        if (gqa_) g.repeat_kv_bwd(a.dqkv, a.dqkv_rep, NH, KVH);
    }
    if (llama_) g.rope_bwd(a.dqkv, NH, KVH, layer_rope_[size_t(a.layer)], 0, docs_);
    if (!cfg_.qk_norm) return;
    Tensor wq = p.qnw, dwq = dp.qnw;
    const int64_t n = p.qnw.numel();
    if (a.qn_scaled.valid()) {   // the scaled weight again; its gradient times the factor into q's norm
        g.take_columns(a.qn_scaled.view(0, {1, n}), p.qnw.view(0, {1, n}), 0, cfg_.score_scale());
        wq = a.qn_scaled;
        if (dwq.valid()) {
            g.fill_zero(a.dqn_scaled);
            dwq = a.dqn_scaled;
        }
    }
    g.qk_norm_bwd(a.dqkv, dwq, dp.knw, a.qk_raw, wq, p.knw, a.qk_rstd, cfg_.qk_norm_q_groups(), cfg_.qk_norm_k_groups());
    if (a.qn_scaled.valid() && dp.qnw.valid())
        g.add_columns(dp.qnw.view(0, {1, n}), a.dqn_scaled.view(0, {1, n}), 0, cfg_.score_scale());
}

void Transformer::act_fwd(Graph & g, Tensor out, Tensor fc) const {
    if (!cfg_.gated()) g.gelu_fwd(out, fc, cfg_.gelu);
    else if (cfg_.glu == Glu::gelu_tanh) g.geglu_fwd(out, fc);
    else g.swiglu_fwd(out, fc);
}

void Transformer::act_bwd(Graph & g, Tensor dfc, Tensor dout, Tensor fc) const {
    if (!cfg_.gated()) g.gelu_bwd(dfc, dout, fc, cfg_.gelu);
    else if (cfg_.glu == Glu::gelu_tanh) g.geglu_bwd(dfc, dout, fc);
    else g.swiglu_bwd(dfc, dout, fc);
}

// x: ln_2's output, every row of the micro-batch (sequence parallel: gathered); a.fcproj gets the
// MLP's output (tensor parallel: this rank's part of the sum).
void Transformer::mlp_tiled_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x) const {
    const int64_t C = cfg_.n_embd, F = cfg_.fc_dim(), A = cfg_.ffn_dim(), N = int64_t(B_) * T_;
    for (int64_t r0 = 0; r0 < N; r0 += mlp_rows_) {
        const int64_t n = std::min<int64_t>(mlp_rows_, N - r0);
        const Tensor fc = a.fch.view(0, {n, F}), h = a.fch_gelu.view(0, {n, A});
        project(g, fc, x.view(r0 * C, {n, C}), p, Proj::fc, a.rc);
        act_fwd(g, h, fc);
        project(g, a.fcproj.view(r0 * C, {n, C}), h, p, Proj::down, a.rc);
    }
}

// in: ln_2's output and dout: the MLP output's gradient, every row (sequence parallel: gathered);
// a.dln2 gets ln_2's gradient (tensor parallel: this rank's part of the sum).
void Transformer::mlp_tiled_bwd(Graph & g, const LayerActs & a, const LayerActs & own, const ModelWeights::Layer & p,
                                const ModelWeights::Layer & dp, Tensor in, Tensor dout) const {
    const int64_t C = cfg_.n_embd, F = cfg_.fc_dim(), A = cfg_.ffn_dim(), N = int64_t(B_) * T_;
    for (int64_t r0 = 0; r0 < N; r0 += mlp_rows_) {
        const int64_t n = std::min<int64_t>(mlp_rows_, N - r0);
        const Tensor x = in.view(r0 * C, {n, C});
        const Tensor fc = own.fch_b.view(0, {n, F}), h = own.fch_gelu_b.view(0, {n, A});
        g.phase(Phase::recompute);
        project(g, fc, x, p, Proj::fc, true);
        act_fwd(g, h, fc);
        g.phase(Phase::backward);
        const Tensor dh = own.dfch_gelu.view(0, {n, A}), dfc = own.dfch.view(0, {n, F});
        project_bwd(g, dh, dout.view(r0 * C, {n, C}), h, p, dp, Proj::down);
        act_bwd(g, dfc, dh, fc);
        project_bwd(g, a.dln2.view(r0 * C, {n, C}), dfc, x, p, dp, Proj::fc);
    }
}

namespace {
struct ProjWeights {
    Tensor w, b;
    const QWeight * q;
};
ProjWeights proj_weights(const ModelWeights::Layer & p, Proj proj) {
    switch (proj) {
        case Proj::qkv: return {p.qkvw, p.qkvb, &p.qkvq};
        case Proj::o: return {p.projw, p.projb, &p.projq};
        case Proj::fc: return {p.fcw, p.fcb, &p.fcq};
        case Proj::down: return {p.fcprojw, p.fcprojb, &p.fcprojq};
    }
    return {};
}
}  // namespace

void Transformer::project(Graph & g, Tensor out, Tensor inp, const ModelWeights::Layer & p, Proj proj, bool rc) const {
    const ProjWeights pw = proj_weights(p, proj);
    // A row-parallel projection's outputs are partial sums: its bias is added by one rank.
    const bool row_parallel = proj == Proj::o || proj == Proj::down;
    const Tensor bias = tp_.enabled() && row_parallel && tp_.rank != 0 ? Tensor{} : pw.b;
    if (tap_ && !rc) tap_(g, g.current_layer(), proj, inp);
    if (pw.q->valid()) g.qmatmul_fwd(out, inp, *pw.q, bias);
    else g.matmul_fwd(out, inp, pw.w, bias, wl_);
    const int64_t rows = inp.rows();
    const Tensor out2 = out.view(0, {rows, out.cols()});
    for (const auto & ad : p.adapters) {
        if (ad.proj != proj) continue;
        const LoraSite & s = sites_[size_t(ad.site)];
        const AdapterActs & x = adapter_acts_[size_t(ad.site)];
        // out[:, slice] += scale * (dropout(inp) A^T) B^T
        Tensor src = inp.view(0, {rows, inp.cols()});
        if (lora_dropout_ > 0) {
            const Tensor xd = rc ? x.xd_b : x.xd;
            g.dropout(xd, src, lora_dropout_, uint64_t(ad.site));
            src = xd;
        }
        g.matmul_fwd(x.u, src, ad.a, Tensor{}, WeightLayout::out_in);
        const Tensor d = rc ? x.d_rc : x.d;
        g.matmul_fwd(d, x.u, ad.b, Tensor{}, WeightLayout::out_in);
        g.add_columns(out2, d, s.col0, lora_scale_);
        if (!ad.mag.valid()) continue;
        // DoRA: out[:, slice] = m / ||W + s B A|| (out[:, slice] - bias) + bias; the norms stay from
        // forward to backward, so recomputation reuses them.
        if (!rc && pw.q->valid()) g.dora_norm_packed(x.norm, *pw.q, s.col0, ad.a, ad.b, lora_scale_);
        else if (!rc) g.dora_norm(x.norm, pw.w, wl_, s.col0, ad.a, ad.b, lora_scale_);
        g.dora_scale_fwd(out2, x.z, bias, ad.mag, x.norm, s.col0);
    }
}

void Transformer::project_bwd(Graph & g, Tensor dinp, Tensor dout, Tensor inp, const ModelWeights::Layer & p,
                              const ModelWeights::Layer & dp, Proj proj) const {
    const ProjWeights pw = proj_weights(p, proj), dpw = proj_weights(dp, proj);
    const int64_t rows = inp.rows();
    const Tensor in2 = inp.view(0, {rows, inp.cols()}), dinp2 = dinp.view(0, {rows, dinp.cols()});
    Tensor dout2 = dout.view(0, {rows, dout.cols()});
    // DoRA: the slices' gradients times m / norm (their magnitudes' gradients taken first), in a
    // copy: dout may be the residual stream's gradient.
    for (size_t i = 0; i < p.adapters.size(); ++i) {
        const auto & ad = p.adapters[i];
        const Tensor dsc = adapter_acts_[size_t(ad.site)].dscaled;
        if (ad.proj != proj || !dsc.valid()) continue;
        g.copy(dsc, dout2);
        for (size_t k = i; k < p.adapters.size() && p.adapters[k].proj == proj; ++k) {
            const AdapterActs & x = adapter_acts_[size_t(p.adapters[k].site)];
            g.dora_scale_bwd(dsc, dp.adapters[k].mag, x.z, p.adapters[k].mag, x.norm, sites_[size_t(p.adapters[k].site)].col0);
        }
        dout2 = dsc;
        break;
    }
    if (pw.q->valid()) g.qmatmul_bwd(dinp, dout2, *pw.q);
    else g.matmul_bwd(dinp, dpw.w, dpw.b, dout2, inp, pw.w, wl_);
    for (size_t i = 0; i < p.adapters.size(); ++i) {
        const auto & ad = p.adapters[i];
        if (ad.proj != proj) continue;
        const auto & dad = dp.adapters[i];
        MF_ASSERT(dad.site == ad.site);
        const LoraSite & s = sites_[size_t(ad.site)];
        const AdapterActs & x = adapter_acts_[size_t(ad.site)];
        // dd = scale * dout[:, slice];  du = dd B, dB += dd^T u;  dinp += du A, dA += du^T inp
        g.take_columns(x.dd, dout2, s.col0, lora_scale_);
        g.matmul_bwd(x.du, dad.b, Tensor{}, x.dd, x.u, ad.b, WeightLayout::out_in);
        if (lora_dropout_ > 0) {
            // The same mask again: dA from the dropped input, and the input gradient through the mask.
            g.dropout(x.xd_b, in2, lora_dropout_, uint64_t(ad.site));
            g.matmul_bwd(x.dxd, dad.a, Tensor{}, x.du, x.xd_b, ad.a, WeightLayout::out_in);
            g.dropout(x.dxd, x.dxd, lora_dropout_, uint64_t(ad.site));
            g.residual_fwd(dinp2, dinp2, x.dxd);
        } else {
            g.matmul_bwd(dinp2, dad.a, Tensor{}, x.du, in2, ad.a, WeightLayout::out_in, true);
        }
    }
}

void Transformer::layer_forward(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x,
                                bool need_output, int cache, int pos0) const {
    const Phase phase = a.rc ? Phase::recompute : Phase::forward;
    // OLMo 2 (post_norm): attention and the MLP read the stream itself, their norms follow them;
    // Gemma 3 (sandwich_norm) has both.
    const bool pre = !cfg_.post_norm;
    const PostNorm n1 = post_norm(a, p, nullptr, false), n2 = post_norm(a, p, nullptr, true);
    if (pre) norm_fwd(g, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b);
    qkv_fwd(g, a, gather_rows(g, pre ? a.ln1 : x, a.ln1g, phase), p, pos0);
    if (cache >= 0 && paged_.enabled())
        g.paged_attention_fwd(a.atty, a.qkv, kcache_[size_t(cache)], vcache_[size_t(cache)], meta_, paged_, cfg_.n_head,
                              cfg_.kv_heads(), cfg_.layer_window(cache));
    else if (cache >= 0)
        g.cached_attention_fwd(a.atty, a.qkv, kcache_[size_t(cache)], vcache_[size_t(cache)], pos0, cfg_.n_head,
                               cfg_.kv_heads(), cfg_.layer_window(cache));
    else
        attention_fwd(g, a.layer, a.atty, a.lse, a.att, a, a.qkv);
    project(g, a.attproj, a.atty, p, Proj::o, a.rc);
    g.residual_fwd(a.res2, x, sublayer_out(g, a.attproj, a.attproj_s, a.tp_attn, n1.out, n1.rstd, n1.w, phase));
    // GPT-NeoX's parallel residual: the MLP's norm reads the layer's input, as attention's does.
    if (pre) norm_fwd(g, a.ln2, a.ln2_mean, a.ln2_rstd, cfg_.parallel_residual ? x : a.res2, p.ln2w, p.ln2b);
    const Tensor mlp_in = pre ? a.ln2 : a.res2;
    if (mlp_rows_ > 0) {   // TiledMLP (the last layer of a recomputed segment needs none of it)
        if (!need_output) return;
        mlp_tiled_fwd(g, a, p, gather_rows(g, mlp_in, a.ln2g, phase));
        g.residual_fwd(a.res3, a.res2, sublayer_out(g, a.fcproj, a.fcproj_s, a.tp_mlp, n2.out, n2.rstd, n2.w, phase));
        return;
    }
    if (cfg_.moe_layer(a.layer)) {
        moe_fwd(g, a, p, mlp_in, need_output);
        if (need_output) g.residual_fwd(a.res3, a.res2, sublayer_out(g, a.fcproj, a.fcproj_s, a.tp_mlp, n2.out, n2.rstd, n2.w, phase));
        return;
    }
    project(g, a.fch, gather_rows(g, mlp_in, a.ln2g, phase), p, Proj::fc, a.rc);
    act_fwd(g, a.fch_gelu, a.fch);
    if (!need_output) return;
    project(g, a.fcproj, a.fch_gelu, p, Proj::down, a.rc);
    g.residual_fwd(a.res3, a.res2, sublayer_out(g, a.fcproj, a.fcproj_s, a.tp_mlp, n2.out, n2.rstd, n2.w, phase));
}

void Transformer::forward(Graph & g, const ModelWeights & w, Tensor tokens, const LayerHook & layer_begin) const {
    g.phase(Phase::forward);
    g.layer(-1);
    if (offload_) offload_->forward_begin(g);
    // wpe (GPT-2) holds max_seq rows; the step uses the first T. LLaMA has none.
    if (!first_stage()) {
        // a later pipeline stage: the input arrived in input_
    } else if (tp_.enabled()) {   // each rank's vocabulary rows (and one rank's positions), summed
        const Tensor whole = sp_ ? encoded_full_ : encoded_;
        g.vocab_encoder_fwd(whole, tokens, w.wte, tp_.rank == 0 ? w.wpe : Tensor{}, tp_.vocab_lo(cfg_));
        reduce_rows(g, whole, encoded_, tp_encoded_, Phase::forward);
    } else {
        g.encoder_fwd(encoded_, tokens, w.wte, w.wpe, docs_);
        embed_adapter_fwd(g, w, tokens);
    }
    if (first_stage()) scale_embedding(g, encoded_);
    Tensor x = first_stage() ? encoded_ : input_;
    for (int l = lb_; l < le_; ++l) {
        g.layer(l);
        if (layer_begin) {
            layer_begin(g, l);
            g.phase(Phase::forward);
            g.layer(l);
        }
        layer_forward(g, acts(l), w.h[size_t(l)], x, true);
        if (offload_) offload_->forward_done(g, l);
        x = acts(l).res3;
    }
    g.layer(-1);
    if (!last_stage()) return;
    norm_fwd(g, lnf_s_, lnf_mean_, lnf_rstd_, x, w.lnfw, w.lnfb);
    gather_rows(g, lnf_s_, lnf_, Phase::forward);   // the head reads every row
}

void Transformer::decode(Graph & g, const ModelWeights & w, Tensor tokens, int pos0) const {
    const int64_t C = cfg_.n_embd;
    // A sliding window's rolling cache takes T new rows beside the window's W - 1 older ones.
    MF_ASSERT(!kcache_.empty() && pos0 >= 0 && pos0 + T_ <= cfg_.max_seq);
    for (int l = 0; l < cfg_.n_layer; ++l) {
        const int64_t rows = kcache_[size_t(l)].dim(1), W = cfg_.layer_window(l);
        MF_ASSERT(pos0 + T_ <= rows || (W > 0 && T_ + W - 1 <= rows));
    }
    g.phase(Phase::forward);
    g.layer(-1);
    g.encoder_fwd(encoded_, tokens, w.wte, llama_ ? Tensor{} : w.wpe.view(pos0 * C, {int64_t(T_), C}));
    embed_adapter_fwd(g, w, tokens);
    scale_embedding(g, encoded_);
    Tensor x = encoded_;
    for (int l = 0; l < cfg_.n_layer; ++l) {
        g.layer(l);
        layer_forward(g, layers_[size_t(l)], w.h[size_t(l)], x, true, l, pos0);
        x = layers_[size_t(l)].res3;
    }
    g.layer(-1);
    norm_fwd(g, lnf_, lnf_mean_, lnf_rstd_, x, w.lnfw, w.lnfb);
    head_fwd(g, w, logits_, lnf_.view((T_ - 1) * C, {1, C}));
}

Transformer::LayerActs Transformer::with_own_grads(LayerActs r, const LayerActs & own) {
    r.dfch_gelu = own.dfch_gelu, r.dfch = own.dfch, r.dln2 = own.dln2, r.datty = own.datty, r.dqkv = own.dqkv;
    r.dln1 = own.dln1, r.qkv_rep_b = own.qkv_rep_b, r.dqkv_rep = own.dqkv_rep, r.dpost = own.dpost;
    r.dqn_scaled = own.dqn_scaled;
    r.cp_kv_b = own.cp_kv_b, r.cp_all_b = own.cp_all_b, r.cp_abs_b = own.cp_abs_b, r.cp_dabs = own.cp_dabs;
    r.cp_dall = own.cp_dall, r.cp_dkv = own.cp_dkv, r.cp_scratch = own.cp_scratch;
    r.cp_kv_b_next = own.cp_kv_b_next, r.cp_dq = own.cp_dq, r.cp_dkv_acc = own.cp_dkv_acc;
    r.cp_dkv_next = own.cp_dkv_next, r.cp_dkv_home = own.cp_dkv_home;
    r.moe_dys = own.moe_dys, r.moe_xs_b = own.moe_xs_b, r.moe_dxs = own.moe_dxs, r.moe_dwts = own.moe_dwts;
    r.moe_dlogits = own.moe_dlogits;
    r.sh_dout = own.sh_dout, r.sh_dact = own.sh_dact, r.sh_dfc = own.sh_dfc, r.sh_dgate = own.sh_dgate;
    return r;
}

// One layer's backward: dres_ holds d(its output) and gets d(its input). `a` holds what forward
// saved (or its recomputation), `own` the layer's own gradient and gather buffers.
void Transformer::layer_backward(Graph & g, const LayerActs & a, const LayerActs & own, const ModelWeights::Layer & p,
                                 const ModelWeights::Layer & dp, Tensor x) const {
    // A norm on a branch's output (OLMo 2, Gemma 3) has its backward first; without one on its
    // input (OLMo 2) the branch reads the stream itself, so its input gradient adds into dres_.
    const bool pre = !cfg_.post_norm, post = has_post_norm();
    const PostNorm n1 = post_norm(a, p, &dp, false), n2 = post_norm(a, p, &dp, true);
    const Tensor dmlp = post ? post_norm_bwd(g, own.dpost, n2.dw, a.fcproj, n2.w, n2.rstd)
                             : gather_rows(g, dres_, own.dres_g1, Phase::backward);
    const Tensor mlp_in = pre ? a.ln2 : a.res2;
    if (cfg_.moe_layer(a.layer)) {
        moe_bwd(g, a, p, dp, mlp_in, dmlp);
    } else if (mlp_rows_ > 0) {
        mlp_tiled_bwd(g, a, own, p, dp, gather_rows(g, mlp_in, own.ln2g_b, Phase::backward), dmlp);
    } else {
        project_bwd(g, a.dfch_gelu, dmlp, a.fch_gelu, p, dp, Proj::down);
        act_bwd(g, a.dfch, a.dfch_gelu, a.fch);
        project_bwd(g, a.dln2, a.dfch, gather_rows(g, mlp_in, own.ln2g_b, Phase::backward), p, dp, Proj::fc);
    }
    const Tensor dln2 = reduce_rows(g, a.dln2, own.dln2_s, own.tp_dln2, Phase::backward);
    // Parallel residual: the MLP's norm read the input x, so its gradient joins d(x) below, after
    // attention's branch has read d(res2) = dres_.
    const bool parallel = cfg_.parallel_residual;
    if (pre && !parallel) norm_bwd(g, dres_, dp.ln2w, dp.ln2b, dln2, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd);
    else if (!pre) g.residual_fwd(dres_, dres_, dln2);
    const Tensor dattn = post ? post_norm_bwd(g, own.dpost, n1.dw, a.attproj, n1.w, n1.rstd)
                              : gather_rows(g, dres_, own.dres_g2, Phase::backward);
    project_bwd(g, a.datty, dattn, a.atty, p, dp, Proj::o);
    attention_bwd(g, a, p, dp);
    project_bwd(g, a.dln1, a.dqkv, gather_rows(g, pre ? a.ln1 : x, own.ln1g_b, Phase::backward), p, dp, Proj::qkv);
    const Tensor dln1 = reduce_rows(g, a.dln1, own.dln1_s, own.tp_dln1, Phase::backward);
    if (pre) norm_bwd(g, dres_, dp.ln1w, dp.ln1b, dln1, x, p.ln1w, a.ln1_mean, a.ln1_rstd);
    else g.residual_fwd(dres_, dres_, dln1);
    if (parallel) norm_bwd(g, dres_, dp.ln2w, dp.ln2b, dln2, x, p.ln2w, a.ln2_mean, a.ln2_rstd);
}

void Transformer::backward(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor tokens,
                           const LayerHook & layer_done, const LayerHook & layer_begin) const {
    const int K = rc_plan_.segment;
    // The input of layer l as forward saved it.
    auto saved_input = [&](int l) { return l > lb_ ? acts(l - 1).res3 : first_stage() ? encoded_ : input_; };
    if (ep_cap_ > 0) {   // the load-balancing loss over every rank's tokens (model/expert_parallel.h)
        g.phase(Phase::communication);
        g.layer(-1);
        g.data_all_reduce(moe_stats_);
    }
    g.phase(Phase::backward);
    g.layer(-1);
    if (last_stage()) {   // head_loss left d(final norm output) in dlnf_; else dres_ arrived
        g.fill_zero(dres_);
        const Tensor dlnf = reduce_rows(g, dlnf_, dlnf_s_, tp_dlnf_, Phase::backward);
        norm_bwd(g, dres_, dw.lnfw, dw.lnfb, dlnf, saved_input(le_), w.lnfw, lnf_mean_, lnf_rstd_);
    }
    // Below the lowest layer with trainable weights (LoRA on a frozen base) nothing needs a gradient.
    for (int l = le_ - 1; l >= std::max(lb_, lowest_trained_layer_); --l) {
        const auto & p = w.h[size_t(l)];
        const auto & dp = dw.h[size_t(l)];
        Tensor x = saved_input(l);
        if (offload_) {
            g.layer(l);
            g.phase(Phase::backward);
            offload_->backward_begin(g, l);
        }
        if (layer_begin) {
            g.layer(l);
            layer_begin(g, l);
            g.phase(Phase::backward);
        }
        LayerActs a;
        if (K >= 2) {
            const int seg = l - (l - lb_) % K;   // first layer of l's segment: its input is the checkpoint
            if (l == std::min(seg + K, le_) - 1) {
                // Recompute the segment's forward, from the checkpoint, into the rc buffers.
                g.phase(Phase::recompute);
                Tensor in = saved_input(seg);
                for (int r = seg; r <= l; ++r) {
                    g.layer(r);
                    // post_norm's backward reads the MLP output (ln2's input): the last layer's too.
                    layer_forward(g, rc(r), w.h[size_t(r)], in, r < l || has_post_norm());
                    in = rc(r).res3;
                }
                g.phase(Phase::backward);
            }
            if (l > seg) x = rc(l - 1).res3;
            a = with_own_grads(rc(l), acts(l));   // the gradient buffers are the layer's own
        } else {
            g.layer(l);
            g.phase(Phase::recompute);
            a = rc_plan_.kept(l) == kKeepAll ? acts(l) : recompute_dropped(g, l, p, x);
            g.phase(Phase::backward);
        }
        g.layer(l);
        // dres holds d(residual_mlp); the MLP branch's output gradient is the same tensor.
        layer_backward(g, a, acts(l), p, dp, x);
        if (layer_done) layer_done(g, l);
    }
    // Layers below the lowest trained one have no gradients to hand over.
    for (int l = std::min(lowest_trained_layer_, le_) - 1; l >= lb_ && layer_done; --l) layer_done(g, l);
    // A later pipeline stage ends with d(its input) in dres_; the first embeds (else a frozen embedding).
    if (first_stage()) {
        g.layer(-1);
        scale_embedding(g, dres_);
        embed_adapter_bwd(g, w, dw, tokens);
    }
    if (first_stage() && dw.wte.valid()) {
        g.layer(-1);
        if (tp_.enabled())
            g.vocab_encoder_bwd(dw.wte, dw.wpe, gather_rows(g, dres_, dres_embed_, Phase::backward), tokens,
                                tp_.vocab_lo(cfg_));
        else g.encoder_bwd(dw.wte, dw.wpe, dres_, tokens, docs_);
    }
    if (offload_) offload_->backward_done(g);
    if (layer_done) layer_done(g, -1);
}

}  // namespace memfit
