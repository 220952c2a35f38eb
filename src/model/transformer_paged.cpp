// The Transformer's paged decode program (ModelOptions::paged, backend/paged_kv.h): token rows
// of several sequences at once, each at its own position, over pools of KV blocks.
#include <fmt/format.h>

#include "core/error.h"
#include "model/transformer.h"

namespace memfit {

void Transformer::declare_paged(Program & program, const ModelOptions & opt) {
    paged_ = opt.paged;
    MF_ASSERT(B_ == 1 && !opt.with_backward && T_ <= paged_.tokens && paged_.seqs > 0 && paged_.max_blocks > 0);
    const int64_t rows = paged_.pool_rows(), S = paged_.seqs, C = cfg_.n_embd, V = cfg_.vocab_size;
    // A row: one position's keys (or values) in the compute dtype, or int8 codes and scales.
    const DType pdt = paged_.int8 ? DType::u8 : dt_;
    const int64_t row_bytes = paged_row_bytes(paged_, cfg_.kv_heads(), cfg_.head_dim(), int64_t(dtype_size(dt_)));
    const int64_t width = row_bytes / int64_t(dtype_size(pdt));
    const size_t bytes = size_t(rows * row_bytes);
    for (int l = 0; l < cfg_.n_layer; ++l) {
        kcache_.push_back(Tensor(program.declare(fmt::format("kv_cache.{}.k", l), Category::activations, bytes, true),
                                 pdt, {rows, width}));
        vcache_.push_back(Tensor(program.declare(fmt::format("kv_cache.{}.v", l), Category::activations, bytes, true),
                                 pdt, {rows, width}));
    }
    const int64_t words = paged_.meta_words();
    meta_ = Tensor(program.declare("decode.meta", Category::activations, size_t(words) * 4, true), DType::i32, {words});
    // The embedding and RoPE read each row's position as "t - doc_start" (paged_kv.h).
    docs_ = meta_.view(paged_.doc_at(), {1, int64_t(T_)});
    last_ = act(program, "decode.last", {1, S, C});
    logits_ = Tensor(program.declare("logits", Category::activations, size_t(S * V) * 4, true), DType::f32, {S, V});
}

void Transformer::decode_paged(Graph & g, const ModelWeights & w, Tensor tokens) const {
    MF_ASSERT(paged_.enabled() && tokens.numel() == T_);
    const int64_t C = cfg_.n_embd, S = paged_.seqs;
    g.phase(Phase::forward);
    g.layer(-1);
    g.encoder_fwd(encoded_, tokens, w.wte, llama_ ? Tensor{} : w.wpe, docs_);
    embed_adapter_fwd(g, w, tokens);
    scale_embedding(g, encoded_);
    Tensor x = encoded_;
    for (int l = 0; l < cfg_.n_layer; ++l) {
        g.layer(l);
        layer_forward(g, layers_[size_t(l)], w.h[size_t(l)], x, true, l, 0);
        x = layers_[size_t(l)].res3;
    }
    g.layer(-1);
    norm_fwd(g, lnf_, lnf_mean_, lnf_rstd_, x, w.lnfw, w.lnfb);
    // The rows the head reads, gathered by the embedding lookup over the final norm's output.
    g.encoder_fwd(last_, meta_.view(paged_.logit_rows_at(), {1, S}), lnf_.view(0, {int64_t(T_), C}), Tensor{});
    head_fwd(g, w, logits_, last_.view(0, {S, C}));
}

}  // namespace memfit
