// The null backend: every op does nothing and no query needs scratch. Plans and
// dry runs record programs against it; backends that only answer sizing queries derive from it.
#pragma once

#include "backend/backend.h"

namespace memfit {

class NullBackend : public Backend {
public:
    const char * name() const override { return "null"; }
    void fill_zero(Tensor t) override {}
    void copy(Tensor dst, Tensor src) override {}
    void gemm(const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace) override {}
    void bias_grad(Tensor dbias, Tensor dout) override {}
    void encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start = {}) override {}
    void encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start = {}) override {}
    void vocab_encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo) override {}
    void vocab_encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo) override {}
    void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) override {}
    void layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean, Tensor rstd) override {}
    void attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start = {}) override {}
    void attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH, Tensor doc_start = {}) override {}
    void flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start = {}) override {}
    void flash_attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse, int NH, Tensor doc_start = {}) override {}
    size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH) const override { return 0; }
    void gelu_fwd(Tensor out, Tensor inp) override {}
    void gelu_bwd(Tensor dinp, Tensor dout, Tensor inp) override {}
    void residual_fwd(Tensor out, Tensor a, Tensor b) override {}
    void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) override {}
    void rmsnorm_bwd(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) override {}
    void qk_norm_fwd(Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps) override {}
    void qk_norm_bwd(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd, int NH,
                     int KVH) override {}
    void rope_fwd(Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {}) override {}
    void rope_bwd(Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {}) override {}
    void swiglu_fwd(Tensor out, Tensor inp) override {}
    void swiglu_bwd(Tensor dinp, Tensor dout, Tensor inp) override {}
    void repeat_kv_fwd(Tensor full, Tensor qkv, int NH, int KVH) override {}
    void repeat_kv_bwd(Tensor dqkv, Tensor dfull, int NH, int KVH) override {}
    void cached_attention_fwd(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH, int KVH,
                              int window = 0) override {}
    void dropout(Tensor out, Tensor in, float p, uint64_t seed) override {}
    void add_columns(Tensor out, Tensor d, int64_t col0, float scale) override {}
    void take_columns(Tensor d, Tensor src, int64_t col0, float scale) override {}
    void xent_fwd(Tensor losses, Tensor logits, Tensor targets) override {}
    void xent_bwd(Tensor probs, Tensor targets, float dloss) override {}
    void xent_shard_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab) override {}
    void xent_shard_loss(Tensor losses, Tensor lse, Tensor gathered, Tensor targets) override {}
    void xent_shard_bwd(Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab, float dloss) override {}
    void distill_fwd(Tensor, Tensor, Tensor, Tensor, Tensor, float, float) override {}
    void distill_bwd(Tensor, Tensor, Tensor, Tensor, float, float, float) override {}
    void sum_squares(Tensor out, Tensor x) override {}
    void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor norm_sq, Tensor param_copy, const AdamWHyper & h) override {}
    void sgd(Tensor, Tensor, Tensor, Tensor, Tensor, const AdamWHyper &) override {}
};

}  // namespace memfit
