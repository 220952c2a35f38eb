// CPU layer kernels (OpenMP), llm.c-style signatures: outputs first, then saved-for-backward
// buffers, then inputs and weights, then dimensions. All row-major.
//   B = batch, T = sequence, C = channels, NH = heads, V = vocabulary, N = rows (B*T)
// Forward outputs are written with `=`; parameter gradients accumulate with `+=`.
// Activation gradients are written with `=` unless the comment says `+=`.
// Every kernel is deterministic for a fixed thread count (static schedules, no atomics).
//
// Storage types (mixed precision): S, the storage of activations and weights, is float, bf16_t
// or f16_t (core/dtype.h); G, the storage of parameter gradients, is float or S. Kernels load
// through to_f32, compute in fp32 and round once as they store (from_f32). mean/rstd, the
// attention scratch, losses and logits are always float. The float instantiations are the fp32
// kernels, bitwise. Parameter gradients in low precision receive one rounded add per element
// per call (sums over rows are accumulated in fp32 first).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/paged_kv.h"
#include "backend/preference_loss.h"
#include "backend/rope.h"
#include "backend/update_rules.h"
#include "core/dtype.h"

namespace memfit::cpu {

// Packed documents (Backend's doc_start): doc_start, where a kernel takes it, is null (one
// document per row) or i32 [B,T], the row index of the first token of each token's document.
// Row r = b*T + t of the flattened batch has position t - doc_start[r].
inline int token_position(const int32_t * doc_start, int r, int T) { return r % T - (doc_start ? doc_start[r] : 0); }

// out[b,t,:] = wte[tokens[b,t],:] + wpe[position,:]  (wpe may be null: no position embedding, out = wte rows)
// A vocabulary shard (vocab_rows >= 0): wte holds the rows of tokens vocab_lo .. vocab_lo+vocab_rows-1
// (token tok at row tok - vocab_lo), and a token outside them reads a zero row (out = wpe[t], or 0).
// vocab_rows < 0: the whole table (vocab_lo 0), every token in it.
template <class S>
void encoder_forward(S * out, const int32_t * tokens, const S * wte, const S * wpe, int B, int T, int C,
                     int64_t vocab_lo = 0, int64_t vocab_rows = -1, const int32_t * doc_start = nullptr);
// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[position,:] += dout[b,t,:]
// (dwte and dwpe each float or S, independently; either may be null: that one is skipped.)
// A vocabulary shard as above: dwte[tok - vocab_lo] receives only the tokens of the shard; dwpe
// every token.
template <class GE, class GP, class S>
void encoder_backward(GE * dwte, GP * dwpe, const S * dout, const int32_t * tokens, int B, int T, int C,
                      int64_t vocab_lo = 0, int64_t vocab_rows = -1, const int32_t * doc_start = nullptr);

// out = (inp - mean) * rstd * weight + bias, per row of C; mean/rstd saved per row.
template <class S>
void layernorm_forward(S * out, float * mean, float * rstd, const S * inp, const S * weight, const S * bias,
                       int N, int C, float eps);
// dinp += ..., dweight += ..., dbias += ...  (dinp has dout's type; null dweight and dbias: frozen)
template <class G, class S>
void layernorm_backward(S * dinp, G * dweight, G * dbias, const S * dout, const S * inp, const S * weight,
                        const float * mean, const float * rstd, int N, int C);

// Causal multi-head attention. qkv is [B,T,3C] laid out as [q | k | v], each C = NH*hs with
// head h at columns h*hs..(h+1)*hs. att[B,NH,T,T] receives the softmax probabilities (row t
// uses columns lo..t, lo = doc_start[b,t] or 0; the others are written as 0). out[B,T,C].
// Scale 1/sqrt(hs).
template <class S>
void attention_forward(S * out, S * att, const S * qkv, int B, int T, int C, int NH,
                       const int32_t * doc_start = nullptr);
// dqkv = gradient w.r.t. qkv (written, not accumulated). scratch: B*NH*T floats.
template <class S>
void attention_backward(S * dqkv, float * scratch, const S * dout, const S * qkv, const S * att, int B, int T,
                        int C, int NH, const int32_t * doc_start = nullptr);

// GELU, tanh approximation ("gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class S>
void gelu_forward(S * out, const S * inp, size_t n);
template <class S>
void gelu_backward(S * dinp, const S * dout, const S * inp, size_t n);
// GELU, exact ("gelu"): x Phi(x), Phi the standard normal CDF; to about 2e-7 relative.
template <class S>
void gelu_erf_forward(S * out, const S * inp, size_t n);
template <class S>
void gelu_erf_backward(S * dinp, const S * dout, const S * inp, size_t n);

template <class S>
void residual_forward(S * out, const S * a, const S * b, size_t n);

// In place: logits[N,V] -> softmax probs. losses[i] = logsumexp(logits_i) - logits_i[target_i],
// 0 where targets[i] == -100.
void crossentropy_forward(float * losses, float * logits_to_probs, const int32_t * targets,
                          int N, int V);
// In place: probs -> (probs - onehot(target)) * dloss; rows whose target is -100 become 0.
void crossentropy_backward(float * probs_to_dlogits, const int32_t * targets, float dloss,
                           int N, int V);
// Both in one pass over each row (training's loss chunk): losses as crossentropy_forward, the
// logits become crossentropy_backward's dlogits; the same bits as the two calls. round_bf16: each
// row's dlogits then rounded to bf16 into its own first half, as round_bf16_rows_in_place leaves
// them (the same bits as that pass after this one). row_scale: row r's factor is row_scale[r]
// instead of dloss (preference tuning's per-answer weights); losses may be null (not written).
void crossentropy_forward_backward(float * losses, float * logits_to_dlogits, const int32_t * targets,
                                   float dloss, int N, int V, bool round_bf16 = false,
                                   const float * row_scale = nullptr);
// Preference tuning (Backend::row_logps, Backend::dpo_loss; backend/preference_loss.h).
void row_logps(float * out, const float * losses, int B, int T);
void dpo_loss(float * losses, float * scale, float * logps, const float * ref, const int32_t * targets, int B, int T,
              const DpoDesc & d);

// Vocabulary-parallel cross-entropy (tensor parallelism). logits[N,Vl] are the columns vocab_lo ..
// vocab_lo+Vl-1 of a vocabulary of V entries; columns at or past V are padding, never read.
// stats[i] = log sum_j exp(logits[i,j]) over the valid columns (-inf when there are none);
// stats[N + i] = logits[i, target_i - vocab_lo] when the shard holds target_i, else 0 (also for
// ignored rows). logits are not modified.
void crossentropy_shard_stats(float * stats, const float * logits, const int32_t * targets, int N, int Vl,
                              int64_t vocab_lo, int64_t V);
// gathered[R,2,N]: every shard's stats. lse[i] = log sum_r exp(gathered[r,0,i]) (-inf terms add
// nothing); losses[i] = lse[i] - sum_r gathered[r,1,i], 0 where targets[i] == -100.
void crossentropy_shard_loss(float * losses, float * lse, const float * gathered, const int32_t * targets, int N,
                             int R);
// In place: logits -> (exp(logits - lse[i]) - onehot(target_i - vocab_lo)) * dloss; padding
// columns and rows whose target is -100 become 0.
void crossentropy_shard_backward(float * logits_to_dlogits, const int32_t * targets, const float * lse, float dloss,
                                 int N, int Vl, int64_t vocab_lo, int64_t V);

// Distillation (Backend::distill_fwd / distill_bwd): the student's logits stay; the teacher's
// become q = softmax(t / T) in place; stats [2, N] = (lse(z), lse(z / T)) per row.
void distill_forward(float * losses, float * stats, const float * logits, float * teacher_to_probs,
                     const int32_t * targets, int N, int V, float alpha, float temperature);
void distill_backward(float * logits_to_dlogits, const float * stats, const float * teacher_probs,
                      const int32_t * targets, int N, int V, float alpha, float temperature, float dloss);

// dbias[j] += sum_i dout[i, j]
template <class G, class S>
void bias_backward(G * dbias, const S * dout, int N, int OC);

// Sum of squares, accumulated in double (inf or NaN when an element is).
template <class S>
double sum_squares(const S * x, size_t n);

// The optimizers' loops (backend/optimizer.h's rows; the rules of backend/update_rules.h, whose
// UpdateConsts c carries the step's constants and c.scale the gradients' factor). W: the weights'
// storage, float (fp32, or fp32 master weights beside a compute copy P), or bf16_t rounded
// stochastically with c's draws (P = float then); P = float means no copy (param_copy null),
// else bf16_t or f16_t, written in the same pass; G: the gradients' storage (float, bf16_t,
// f16_t). c.keep_zeros: a weight that is exactly 0 stays 0 and its states become 0.
// AdamW, M the moments' storage (float, or bf16_t: read into f32, rounded to nearest even).
template <class W, class G, class P, class M>
void adamw_update(W * param, P * param_copy, const G * grad, M * m, M * v, size_t n, const UpdateConsts & c);
// SGD with momentum: buf the fp32 momentum.
template <class W, class G, class P>
void sgd_update(W * param, P * param_copy, const G * grad, float * buf, size_t n, const UpdateConsts & c);
// Adafactor over the R x C matrix (a vector: R = 1) of the view: stat holds its factored state,
// R row then C column statistics (factored_len(); a vector's or a one-row matrix's: one per element);
// m its first moment, one per element (null without --adafactor-beta1).
template <class W, class G, class P>
void adafactor_update(W * param, P * param_copy, const G * grad, float * stat, float * m, int64_t R, int64_t C,
                      const UpdateConsts & c);
// AdamW with 8-bit moments (backend/moments8.h; kernels_adamw8.cpp): m, v one code per element,
// m_scale, v_scale one per block of the n elements.
template <class G, class P, class W = float>
void adamw_update_8bit(W * param, P * param_copy, const G * grad, uint8_t * m, uint8_t * v, float * m_scale,
                       float * v_scale, size_t n, const UpdateConsts & c);

// GaLore (kernels_galore.cpp) for an R x C fp32 gradient g at rank r, s = min(R, C): the
// projector's refresh, r orthonormal rows of s (the top r singular vectors of the shorter side;
// work: 2 s^2 doubles); the projected gradient, r x C (R < C: Q g) or R x r (else: g Q^T); and
// row i of the projected-back direction dir (the shape of the projected gradient) into out[C].
void galore_projector(float * proj, const float * g, int64_t R, int64_t C, int64_t r, double * work);
void galore_project(float * low, const float * proj, const float * g, int64_t R, int64_t C, int64_t r);
void galore_project_back_row(float * out, const float * proj, const float * dir, int64_t i, int64_t R, int64_t C,
                             int64_t r);

// ---------------------------------------------------------------------------------------------
// LLaMA family (kernels_llama.cpp). Rows are parallel tasks; every reduction has a fixed order.

// RMSNorm: rstd[i] = 1 / sqrt(mean_c(inp[i,c]^2) + eps); out[i,c] = inp[i,c] * rstd[i] * weight[c].
template <class S>
void rmsnorm_forward(S * out, float * rstd, const S * inp, const S * weight, int N, int C, float eps);
// dinp += ..., dweight += ...  (null dweight: frozen; dinp has dout's type; dweight float or S, summed over rows in
// fp32 per column block, one rounded add per element like layernorm_backward)
template <class G, class S>
void rmsnorm_backward(S * dinp, G * dweight, const S * dout, const S * inp, const S * weight, const float * rstd,
                      int N, int C);

// Qwen3's q and k norms, in place on qkv [N, (NH + 2 KVH) hd]: head row h of token n (q heads
// h < NH with wq, then KVH k heads with wk) becomes RMSNorm(row) * w; v untouched. The rows before
// it are copied to raw [N, NH + KVH, hd], their rstd to rstd [N, NH + KVH].
template <class S>
void qk_norm_forward(S * qkv, S * raw, float * rstd, const S * wq, const S * wk, int N, int NH, int KVH, int hd,
                     float eps);
// Its backward, in place: dqkv's q and k heads, d(normed), become d(raw); dwq, dwk += (null:
// frozen), each column summed over its rows in fp32, one rounded add per element.
template <class G, class S>
void qk_norm_backward(S * dqkv, G * dwq, G * dwk, const S * raw, const S * wq, const S * wk, const float * rstd, int N,
                      int NH, int KVH, int hd);

// Rotary position embeddings (Hugging Face "rotate_half"), in place on the q and k heads of
// qkv[B,T,(NH+2*KVH)*hd], each row laid out [q: NH heads | k: KVH heads | v: KVH heads] of hd
// (even) elements; v is untouched. Row t has position pos = pos0 + token_position(...). For i < hd/2, with
// a = pos * rope.inv_freq(i, hd) (backend/rope.h; in double, cos/sin then used as float):
//   y[i] = x[i] cos a - x[i+hd/2] sin a;   y[i+hd/2] = x[i+hd/2] cos a + x[i] sin a.
template <class S>
void rope_forward(S * qkv, int B, int T, int NH, int KVH, int hd, const Rope & rope, int pos0,
                  const int32_t * doc_start = nullptr);
// The backward, in place on dqkv: the transpose of the rotation, i.e. the rotation by -a.
template <class S>
void rope_backward(S * dqkv, int B, int T, int NH, int KVH, int hd, const Rope & rope, int pos0,
                   const int32_t * doc_start = nullptr);

// SwiGLU: inp[N, 2I] holds per row [gate (I) | up (I)]; out[N, I] = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)).
template <class S>
void swiglu_forward(S * out, const S * inp, int N, int I);
// dinp[N, 2I] = ... (written) from dout[N, I] and inp.
template <class S>
void swiglu_backward(S * dinp, const S * dout, const S * inp, int N, int I);
// GeGLU: the same with gelu(gate), GELU's tanh form (gelu_forward's arithmetic; kernels_llama.cpp).
template <class S>
void geglu_forward(S * out, const S * inp, int N, int I);
template <class S>
void geglu_backward(S * dinp, const S * dout, const S * inp, int N, int I);

// Grouped-query attention: qkv[N,(NH+2*KVH)*hd] -> full[N,3*NH*hd] ([q | k | v], NH heads each):
// q copied; KV head j repeated for query heads j*G .. j*G+G-1, G = NH/KVH (HF repeat_kv).
template <class S>
void repeat_kv_forward(S * full, const S * qkv, int N, int NH, int KVH, int hd);
// dqkv[N,(NH+2*KVH)*hd] = ... (written): q part copied from dfull; each KV head's gradient is the
// sum over its G query heads in dfull (fp32, in head order, rounded once).
template <class S>
void repeat_kv_backward(S * dqkv, const S * dfull, int N, int NH, int KVH, int hd);

// Generation: qkv[B,Tn,(NH+2KVH)hd]'s k and v rows are appended to kcache, vcache [B,cap,KVH*hd]
// at rows pos0..pos0+Tn-1; out[B,Tn,NH*hd] = causal attention of each new query over the cache
// (query head h reads KV head h / (NH/KVH)). Scale 1/sqrt(hd).
template <class S>
void cached_attention_forward(S * out, S * kcache, S * vcache, const S * qkv, int B, int Tn, int pos0, int cap,
                              int NH, int KVH, int hd, int window = 0);
// The same over a paged cache (backend/paged_kv.h, kernel_list.h's paged_attention_fwd): qkv
// [n,(NH+2KVH)hd], kpool, vpool kv.blocks*kv.block rows of paged_row_bytes (S values, or int8
// codes and scales with kv.int8), meta the step's metadata.
template <class S>
void paged_attention_forward(S * out, void * kpool, void * vpool, const S * qkv, const int32_t * meta,
                             const PagedKv & kv, int n, int NH, int KVH, int hd, int window = 0);

// Context parallelism (kernel_list.h's cp_attention_fwd / _bwd; kernels_cp.cpp): Tl query rows
// per sequence over the sequence's T positions of kv.
template <class S>
void cp_attention_forward(S * out, float * lse, const S * qkv, const S * kv, const int32_t * meta, int B, int Tl,
                          int T, int NH, int KVH, int hd);
// The ring (kernel_list.h's cp_block_fwd / _bwd, cp_qkv_grad): a visiting block of Tl key rows
// (positions kpos[Tl]) merged into fp32 accumulators; first: they start here.
template <class S>
void cp_block_forward(float * acc, float * acc_lse, const S * qkv, const S * kv, const int32_t * kpos,
                      const int32_t * meta, int B, int Tl, int NH, int KVH, int hd, bool first);
template <class S>
void cp_block_backward(float * dq, float * dkv, float * scratch, const S * dout, const S * out, const S * qkv,
                       const S * kv, const float * lse, const int32_t * kpos, const int32_t * meta, int B, int Tl,
                       int NH, int KVH, int hd);
template <class S>
void cp_qkv_grad(S * dqkv, const float * dq, const float * dkv, int64_t rows, int NH, int KVH, int hd);
// scratch: B*Tl*NH floats. hd at most 256.
template <class S>
void cp_attention_backward(S * dqkv, S * dkv, float * scratch, const S * dout, const S * out, const S * qkv,
                           const S * kv, const float * lse, const int32_t * meta, int B, int Tl, int T, int NH,
                           int KVH, int hd);

// ---------------------------------------------------------------------------------------------
// LoRA column slices (kernels_lora.cpp). out and src have N rows of ldo / lds elements, d has N
// rows of cols elements; col0 + cols <= ldo (lds). Each pointer has its own storage type.

// out[i] = in[i] * keep_i / (1 - p), keep_i = dropout_keep(seed, i, p) (in place allowed).
template <class S>
void dropout(S * out, const S * in, size_t n, float p, uint64_t seed);
// The mask: a splitmix64 hash of (seed, i) as a uniform in [0, 1), kept when >= p.
inline bool dropout_keep(uint64_t seed, uint64_t i, float p) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return float(z >> 40) * (1.0f / 16777216.0f) >= p;
}

// out[i, col0 + j] = round(out[i, col0 + j] + scale * d[i, j])
template <class O, class D>
void add_columns(O * out, const D * d, int64_t N, int64_t ldo, int64_t cols, int64_t col0, float scale);
// d[i, j] = round(scale * src[i, col0 + j])  (written)
template <class D, class S>
void take_columns(D * d, const S * src, int64_t N, int64_t lds, int64_t cols, int64_t col0, float scale);

// DoRA (kernel_list.h). norm[j] = || W_j + scale * b[j] a || over the `in` inputs, W_j row
// col0 + j of w [out, in] (ld = in), or column col0 + j of w [in, ld] when in_out; a [r, in],
// b [cols, r] in fp32.
template <class W>
void dora_norm(float * norm, const W * w, bool in_out, int64_t ld, int64_t in, int64_t cols, int64_t col0,
               const float * a, const float * b, int64_t r, float scale);
// z[i, j] = out[i, col0 + j] - bias[j] (written), out[i, col0 + j] = g[j] * that + bias[j];
// bias and g fp32 [cols].
template <class O, class Z>
void dora_scale_fwd(O * out, Z * z, const float * bias, const float * g, int64_t N, int64_t ldo, int64_t cols,
                    int64_t col0);
// acc[j] = sum_i dout[i, col0 + j] z[i, j] (fp32, rows in order; written), then dout[i, col0 + j]
// *= g[j] in place.
template <class D, class Z>
void dora_scale_bwd(D * dout, const Z * z, const float * g, float * acc, int64_t N, int64_t ldd, int64_t cols,
                    int64_t col0);

}  // namespace memfit::cpu
