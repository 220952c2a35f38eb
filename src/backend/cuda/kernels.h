// The CUDA kernels' launchers: each enqueues its kernels on stream `s` and returns at once.
// Contracts (shapes, dtypes, `=` versus `+=`) are Backend's (backend/backend.h); every tensor's
// data is device memory. Kernels compute in fp32 whatever the storage dtype.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace memfit::cuda {

// doc_start (i32 [B,T] device memory, or invalid): packed documents, as Backend's
// (backend/backend.h): positions restart at each document (encoder, RoPE) and attention is
// block-diagonal causal (naive and flash). An invalid one computes exactly what the kernels
// computed before documents existed.

// kernels_basic.cu
void copy(cudaStream_t s, Tensor dst, Tensor src);
void encoder_fwd(cudaStream_t s, Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start);
void encoder_bwd(cudaStream_t s, Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start);
void vocab_encoder_fwd(cudaStream_t s, Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo);
void vocab_encoder_bwd(cudaStream_t s, Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo);
void gelu_fwd(cudaStream_t s, Tensor out, Tensor inp, Gelu kind);
void gelu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp, Gelu kind);
void residual_fwd(cudaStream_t s, Tensor out, Tensor a, Tensor b);
void dropout(cudaStream_t s, Tensor out, Tensor in, float p, uint64_t seed);
void add_columns(cudaStream_t s, Tensor out, Tensor d, int64_t col0, float scale);
void take_columns(cudaStream_t s, Tensor d, Tensor src, int64_t col0, float scale);

// kernels_dora.cu
void dora_norm(cudaStream_t s, Tensor norm, Tensor w, bool w_in_out, int64_t col0, Tensor a, Tensor b, float scale);
void dora_scale_fwd(cudaStream_t s, Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0);
void dora_scale_bwd(cudaStream_t s, Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0);

// kernels_norm.cu (bias_grad shares its column-sum kernel)
void bias_grad(cudaStream_t s, Tensor dbias, Tensor dout);
void layernorm_fwd(cudaStream_t s, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps);
void layernorm_bwd(cudaStream_t s, Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                   Tensor rstd);
void rmsnorm_fwd(cudaStream_t s, Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps);
void rmsnorm_bwd(cudaStream_t s, Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd);

// kernels_llama.cu
void qk_norm_fwd(cudaStream_t s, Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps);
void qk_norm_bwd(cudaStream_t s, Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd,
                 int NH, int KVH);
void rope_fwd(cudaStream_t s, Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start);
void rope_bwd(cudaStream_t s, Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start);
void swiglu_fwd(cudaStream_t s, Tensor out, Tensor inp);
void swiglu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp);
void geglu_fwd(cudaStream_t s, Tensor out, Tensor inp);
void geglu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp);
void repeat_kv_fwd(cudaStream_t s, Tensor full, Tensor qkv, int NH, int KVH);
void repeat_kv_bwd(cudaStream_t s, Tensor dqkv, Tensor dfull, int NH, int KVH);

// kernels_xent.cu
void xent_fwd(cudaStream_t s, Tensor losses, Tensor logits, Tensor targets);
void xent_bwd(cudaStream_t s, Tensor probs, Tensor targets, float dloss);
void xent_shard_stats(cudaStream_t s, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab);
void xent_shard_loss(cudaStream_t s, Tensor losses, Tensor lse, Tensor gathered, Tensor targets);
void xent_shard_bwd(cudaStream_t s, Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab,
                    float dloss);
void distill_fwd(cudaStream_t s, Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                 float temperature);
void distill_bwd(cudaStream_t s, Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha,
                 float temperature, float dloss);
void row_logps(cudaStream_t s, Tensor out, Tensor losses);
void dpo_loss(cudaStream_t s, Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d);
void xent_grad_rows(cudaStream_t s, Tensor logits, Tensor targets, Tensor scale);

// kernels_optim.cu
void sum_squares(cudaStream_t s, Tensor out, Tensor x);
// One step of backend/optimizer.h's row o (Backend::optimizer_step), through this file's table.
void optimizer_step(cudaStream_t s, Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states,
                    Tensor norm_sq, Tensor param_copy, const OptimHyper & h);

// kernels_quant.cu: rows row0 .. row0 + w.numel() / q.in of W' [q.out, q.in] (dtype of `w`: f32,
// bf16 or f16), written, from the packed bytes of backend/quant_format.h (device memory). For
// nf4 and sparse24 the tile starts and ends on a multiple of 8 elements.
void dequantize(cudaStream_t s, const QuantDesc & q, Tensor w, Tensor packed, int64_t row0 = 0);

// kernels_attention.cu: the naive (T x T probabilities saved) causal attention (within
// documents: the probabilities are 0 outside), and attention over a KV cache.
void attention_fwd(cudaStream_t s, Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start);
void attention_bwd(cudaStream_t s, Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH,
                   Tensor doc_start);
void cached_attention_fwd(cudaStream_t s, Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH,
                          int KVH, int window);
void paged_attention_fwd(cudaStream_t s, Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta,
                         const PagedKv & kv, int NH, int KVH, int window);
// kernels_cp.cu: context parallelism's attention (kernel_list.h).
void cp_attention_fwd(cudaStream_t s, Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH);
void cp_attention_bwd(cudaStream_t s, Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv,
                      Tensor kv, Tensor lse, Tensor meta, int NH, int KVH);
void cp_block_fwd(cudaStream_t s, Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH,
                  int KVH, bool first);
void cp_block_bwd(cudaStream_t s, Tensor dq, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor kv,
                  Tensor lse, Tensor kpos, Tensor meta, int NH, int KVH);
void cp_qkv_grad(cudaStream_t s, Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH);
// kernels_moe.cu: the mixture of experts' routing (kernel_list.h; the route: backend/moe.h).
void moe_route(cudaStream_t s, Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d);
void moe_route_bwd(cudaStream_t s, Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts,
                   Tensor stats_all, const MoeDesc & d);
void moe_gather(cudaStream_t s, Tensor out, Tensor x, Tensor route, const MoeDesc & d);
void moe_scatter(cudaStream_t s, Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate);
void moe_combine(cudaStream_t s, Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d);
void moe_weight_bwd(cudaStream_t s, Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route,
                    const MoeDesc & d);
void moe_counts(cudaStream_t s, Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d);
void sigmoid_gate_fwd(cudaStream_t s, Tensor out, Tensor y, Tensor logit);
void sigmoid_gate_bwd(cudaStream_t s, Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit);

// kernels_flash.cu: tiled causal attention that never stores T x T (with documents, tile pairs
// wholly outside them are skipped).
void flash_attention_fwd(cudaStream_t s, Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start);
void flash_attention_bwd(cudaStream_t s, Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv,
                         Tensor lse, int NH, Tensor doc_start);
// Its scratch bytes: cuda_flash_attention_workspace (backend/cuda_sizing.h).

}  // namespace memfit::cuda
