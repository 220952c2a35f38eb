// CPU kernels: memory-efficient (FlashAttention-style) causal multi-head attention.
// Same qkv layout, scale and results (to fp32 rounding) as attention_forward/attention_backward
// in kernels.h, but the T x T attention matrix is never stored: the forward keeps an online
// softmax per query and saves only the log-sum-exp of each query's scores; the backward
// recomputes the probabilities tile by tile from q, k and that log-sum-exp.
// Deterministic for any thread count: every output element is computed by one task, in a fixed
// order that does not depend on how tasks are split among threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace memfit::cpu {

// Tiled causal attention with an online softmax: never stores the T x T scores.
// qkv [B,T,3C] as for attention_forward; out [B,T,C] written; lse [B,NH,T] receives the
// log-sum-exp of each query's scaled scores (saved for backward). S: float, bf16_t or f16_t
// (qkv and out); lse is always float.
// doc_start (null, or i32 [B,T], kernels.h): packed documents; key tiles before a query tile's
// documents are skipped, and keys before a query's document start are masked.
template <class S>
void flash_attention_forward(S * out, float * lse, const S * qkv, int B, int T, int C, int NH,
                             const int32_t * doc_start = nullptr);

// dqkv [B,T,3C] written (not accumulated). Recomputes scores tile by tile from q, k and lse.
// out is the forward's out. scratch: flash_attention_scratch_floats(B, T, C, NH, storage) floats.
// The bf16/f16 versions compute in fp32 and round each gradient element once: up to 1024
// positions in one pass, as fp32 does, with the head's dQ accumulated in fp32 in the scratch;
// beyond, in two passes (dK and dV with key tiles outermost, then dQ with query tiles
// outermost), which recompute the scores once more.
void flash_attention_backward(float * dqkv, float * scratch, const float * dout, const float * out,
                              const float * qkv, const float * lse, int B, int T, int C, int NH,
                              const int32_t * doc_start = nullptr);
void flash_attention_backward(bf16_t * dqkv, float * scratch, const bf16_t * dout, const bf16_t * out,
                              const bf16_t * qkv, const float * lse, int B, int T, int C, int NH,
                              const int32_t * doc_start = nullptr);
void flash_attention_backward(f16_t * dqkv, float * scratch, const f16_t * dout, const f16_t * out,
                              const f16_t * qkv, const float * lse, int B, int T, int C, int NH,
                              const int32_t * doc_start = nullptr);
// The bf16 backward in `passes` (1 or 2) whatever T, for tests (the two give the same bits);
// scratch: the one-pass size, B*NH*(64 + T)*hs floats more than fp32's (see below).
void flash_attention_backward_passes(bf16_t * dqkv, float * scratch, const bf16_t * dout, const bf16_t * out,
                                     const bf16_t * qkv, const float * lse, int B, int T, int C, int NH,
                                     const int32_t * doc_start, int passes);

// Scratch of flash_attention_backward on `storage` (qkv's dtype), in floats; a function of the
// shape and dtype only (not of the thread count), linear in T up to 1024 positions and beyond:
//   round_up(B*NH*T, 16)            D_t = dout_t . out_t, per query and head
//   + B*NH * (2*64*64 + 6*64*hs)    per (b,h): P and dS tiles [64 x 64]; six tiles [64 x hs]:
//                                   fp32 uses K^T, V^T, K, Q and dout; bf16/f16 in two passes
//                                   also an fp32 accumulator (dK and dV in the first pass, dQ in
//                                   the second)
//   + B*NH * (64*hs + T*hs)         bf16/f16 in one pass (T <= 1024): a seventh tile (dK and dV
//                                   each have an accumulator) and the head's dQ in fp32
// with hs = C/NH and 64 the tile size. (The fp32 forward needs no scratch: its three 64 x 64
// tiles, 48 KiB, are on the stack; in bf16/f16 it also packs Q and accumulates the output in
// fp32, 2*64*hs floats per thread on the heap.)
size_t flash_attention_scratch_floats(int B, int T, int C, int NH, DType storage);

}  // namespace memfit::cpu
