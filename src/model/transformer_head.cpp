// The transformer's ends outside the blocks: the LM head (whole, in loss chunks, sharded over
// tensor ranks) with its loss, and the LoRA adapters on the head and the token embedding.
#include "model/transformer.h"

#include <algorithm>

#include "core/error.h"

namespace memfit {

void Transformer::embed_adapter_fwd(Graph & g, const ModelWeights & w, Tensor tokens) const {
    for (const auto & ad : w.embed_adapters) {   // encoded += scale A^T[token] B^T
        const AdapterActs & a = adapter_acts_[size_t(ad.site)];
        const int64_t n = a.d.rows(), C = a.d.cols();
        g.encoder_fwd(a.u, tokens, ad.a, Tensor{}, Tensor{});
        g.matmul_fwd(a.d, a.u, ad.b, Tensor{}, WeightLayout::out_in);
        g.add_columns(encoded_.view(0, {n, C}), a.d.view(0, {n, C}), 0, lora_scale_);
    }
}

void Transformer::embed_adapter_bwd(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor tokens) const {
    for (size_t i = 0; i < w.embed_adapters.size(); ++i) {
        const auto & ad = w.embed_adapters[i];
        const auto & dad = dw.embed_adapters[i];
        const AdapterActs & a = adapter_acts_[size_t(ad.site)];
        // dd = scale d(encoded);  du = dd B, dB += dd^T u;  dA^T[token] += du
        const int64_t n = a.dd.rows(), C = a.dd.cols();
        g.take_columns(a.dd.view(0, {n, C}), dres_.view(0, {n, C}), 0, lora_scale_);
        g.matmul_bwd(a.du, dad.b, Tensor{}, a.dd, a.u, ad.b, WeightLayout::out_in);
        g.encoder_bwd(dad.a, Tensor{}, a.du, tokens, Tensor{});
    }
}

void Transformer::head_fwd(Graph & g, const ModelWeights & w, Tensor logits, Tensor x) const {
    g.matmul_fwd(logits, x, w.head, Tensor{}, WeightLayout::out_in);
    const int64_t n = x.rows();
    for (const auto & ad : w.head_adapters) {   // logits += scale (x A^T) B^T
        const AdapterActs & a = adapter_acts_[size_t(ad.site)];
        const Tensor u = a.u.view(0, {n, a.u.dim(1)}), d = a.d.view(0, {n, a.d.dim(1)});
        g.matmul_fwd(u, x.view(0, {n, x.cols()}), ad.a, Tensor{}, WeightLayout::out_in);
        g.matmul_fwd(d, u, ad.b, Tensor{}, WeightLayout::out_in);
        g.add_columns(logits.view(0, {n, logits.cols()}), d, 0, lora_scale_);
    }
}

void Transformer::head_bwd(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor dx, Tensor dlogits,
                           Tensor x, Graph::DoutBf16 dout_bf16) const {
    // dd = scale dlogits;  du = dd B, dB += dd^T u (before the head's backward, which may round
    // dlogits to bf16 in place: round_logit_grads);  dx = dlogits W + du A, dA += du^T x
    const int64_t n = x.rows();
    MF_ASSERT(dout_bf16 != Graph::DoutBf16::rounded || w.head_adapters.empty());   // the adapters read dlogits in fp32 first
    for (size_t i = 0; i < w.head_adapters.size(); ++i) {
        const auto & ad = w.head_adapters[i];
        const AdapterActs & a = adapter_acts_[size_t(ad.site)];
        const Tensor u = a.u.view(0, {n, a.u.dim(1)}), du = a.du.view(0, {n, a.du.dim(1)});
        const Tensor dd = a.dd.view(0, {n, a.dd.dim(1)});
        g.take_columns(dd, dlogits.view(0, {n, dlogits.cols()}), 0, lora_scale_);
        g.matmul_bwd(du, dw.head_adapters[i].b, Tensor{}, dd, u, ad.b, WeightLayout::out_in);
    }
    g.matmul_bwd(dx, dw.head, Tensor{}, dlogits, x, w.head, WeightLayout::out_in, false, dout_bf16);
    for (size_t i = 0; i < w.head_adapters.size(); ++i) {
        const auto & ad = w.head_adapters[i];
        const Tensor du = adapter_acts_[size_t(ad.site)].du.view(0, {n, ad.a.dim(0)});
        g.matmul_bwd(dx, dw.head_adapters[i].a, Tensor{}, du, x, ad.a, WeightLayout::out_in, true);
    }
}

void Transformer::head_logits(Graph & g, const ModelWeights & w) const {
    MF_ASSERT(chunk_rows_ == B_ * T_);
    g.phase(Phase::forward);
    g.layer(-1);
    head_fwd(g, w, logits_, lnf_);
}

Tensor Transformer::head_chunk(Graph & g, const ModelWeights & w, int64_t r0, int64_t n) const {
    const int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
    MF_ASSERT(!tp_.enabled() && n <= chunk_rows_ && r0 + n <= int64_t(B_) * T_);
    const Tensor logits = logits_.view(0, {n, V});
    g.phase(Phase::forward);
    g.layer(-1);
    head_fwd(g, w, logits, lnf_.view(r0 * C, {n, C}));
    return logits;
}

void Transformer::head_loss(Graph & g, const ModelWeights & w, const ModelWeights * dw, Tensor targets, Tensor losses,
                            float dloss, const DistillHead * distill) const {
    const int64_t N = int64_t(B_) * T_, C = cfg_.n_embd, V = cfg_.vocab_size;
    MF_ASSERT(!distill || !tp_.enabled());
    g.layer(-1);
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows_) {
        const int64_t n = std::min<int64_t>(chunk_rows_, N - r0);
        if (tp_.enabled()) {
            head_loss_tp(g, w, dw, targets, losses, dloss, r0, n);
            continue;
        }
        const Tensor x = lnf_.view(r0 * C, {n, C});
        const Tensor logits = logits_.view(0, {n, V});
        const Tensor tgt = targets.view(r0, {n});
        const Tensor teacher = distill ? distill->teacher->head_chunk(g, *distill->weights, r0, n) : Tensor{};
        const Tensor stats = distill ? distill->stats.view(0, {2, n}) : Tensor{};
        const Tensor dx = dw ? dlnf_.view(r0 * C, {n, C}) : Tensor{};   // none without a backward
        // The loss op rounds the gradients for the head's native bf16 gemms while each row is in
        // cache, where the head's backward would round them next (no adapter reads them first).
        const bool pre_round = dw && !distill && w.head_adapters.empty() && round_logit_grads(w) &&
                               g.rounds_dout(dx, dw->head, logits, x, w.head, WeightLayout::out_in);
        g.phase(Phase::forward);
        head_fwd(g, w, logits, x);
        if (distill) g.distill_fwd(losses.view(r0, {n}), stats, logits, teacher, tgt, distill->alpha, distill->temperature);
        else if (dw) g.xent_fwd_bwd(losses.view(r0, {n}), logits, tgt, dloss, pre_round);   // the loss and its gradient
        else g.xent_fwd(losses.view(r0, {n}), logits, tgt);
        if (!dw) continue;
        g.phase(Phase::backward);
        if (distill) g.distill_bwd(logits, stats, teacher, tgt, distill->alpha, distill->temperature, dloss);
        head_bwd(g, w, *dw, dx, logits, x, pre_round ? Graph::DoutBf16::rounded : logit_grads_bf16(w));
    }
}

void Transformer::head_grad_rows(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor targets,
                                 Tensor scale) const {
    const int64_t N = int64_t(B_) * T_, C = cfg_.n_embd, V = cfg_.vocab_size;
    MF_ASSERT(!tp_.enabled());
    g.layer(-1);
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows_) {
        const int64_t n = std::min<int64_t>(chunk_rows_, N - r0);
        const Tensor x = lnf_.view(r0 * C, {n, C});
        const Tensor logits = logits_.view(0, {n, V});
        g.phase(Phase::forward);
        head_fwd(g, w, logits, x);
        g.phase(Phase::backward);
        g.xent_grad_rows(logits, targets.view(r0, {n}), scale.view(r0, {n}));
        head_bwd(g, w, dw, dlnf_.view(r0 * C, {n, C}), logits, x, logit_grads_bf16(w));
    }
}

void Transformer::head_loss_tp(Graph & g, const ModelWeights & w, const ModelWeights * dw, Tensor targets,
                               Tensor losses, float dloss, int64_t r0, int64_t n) const {
    const int64_t C = cfg_.n_embd, V = cfg_.vocab_size, R = tp_.ranks, lo = tp_.vocab_lo(cfg_);
    const Tensor x = lnf_.view(r0 * C, {n, C});
    const Tensor logits = logits_.view(0, {n, V});
    const Tensor tgt = targets.view(r0, {n});
    const Tensor stats = xent_stats_.view(0, {2, n}), gathered = xent_gathered_.view(0, {R, 2, n});
    const Tensor lse = xent_lse_.view(0, {n});
    g.phase(Phase::forward);
    g.matmul_fwd(logits, x, w.head, Tensor{}, WeightLayout::out_in);
    g.xent_shard_stats(stats, logits, tgt, lo, tp_.vocab);
    g.phase(Phase::communication);
    g.tp_all_gather(gathered, stats);
    g.phase(Phase::forward);
    g.xent_shard_loss(losses.view(r0, {n}), lse, gathered, tgt);
    if (!dw) return;
    g.phase(Phase::backward);
    g.xent_shard_bwd(logits, tgt, lse, lo, tp_.vocab, dloss);
    // This rank's vocabulary rows' share of d(final norm output); summed over the group in backward().
    g.matmul_bwd(dlnf_.view(r0 * C, {n, C}), dw->head, Tensor{}, logits, x, w.head, WeightLayout::out_in, false,
                 logit_grads_bf16(w));
}

}  // namespace memfit
