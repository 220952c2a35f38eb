// CPU layer kernels (OpenMP), llm.c-style signatures: outputs first, then saved-for-backward
// buffers, then inputs and weights, then dimensions. All row-major fp32.
//   B = batch, T = sequence, C = channels, NH = heads, V = vocabulary, N = rows (B*T)
// Forward outputs are written with `=`; parameter gradients accumulate with `+=`.
// Activation gradients are written with `=` unless the comment says `+=`.
// Every kernel is deterministic for a fixed thread count (static schedules, no atomics).
#pragma once

#include <cstddef>
#include <cstdint>

namespace memfit::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
void encoder_forward(float * out, const int32_t * tokens, const float * wte, const float * wpe,
                     int B, int T, int C);
// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t,:] += dout[b,t,:]
void encoder_backward(float * dwte, float * dwpe, const float * dout, const int32_t * tokens,
                      int B, int T, int C);

// out = (inp - mean) * rstd * weight + bias, per row of C; mean/rstd saved per row.
void layernorm_forward(float * out, float * mean, float * rstd, const float * inp,
                       const float * weight, const float * bias, int N, int C, float eps);
// dinp += ..., dweight += ..., dbias += ...
void layernorm_backward(float * dinp, float * dweight, float * dbias, const float * dout,
                        const float * inp, const float * weight, const float * mean,
                        const float * rstd, int N, int C);

// Causal multi-head attention. qkv is [B,T,3C] laid out as [q | k | v], each C = NH*hs with
// head h at columns h*hs..(h+1)*hs. att[B,NH,T,T] receives the softmax probabilities (row t
// uses columns 0..t; columns > t are written as 0). out[B,T,C]. Scale 1/sqrt(hs).
void attention_forward(float * out, float * att, const float * qkv, int B, int T, int C, int NH);
// dqkv = gradient w.r.t. qkv (written, not accumulated). scratch: B*NH*T floats.
void attention_backward(float * dqkv, float * scratch, const float * dout, const float * qkv,
                        const float * att, int B, int T, int C, int NH);

// GELU, tanh approximation ("gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float * out, const float * inp, size_t n);
void gelu_backward(float * dinp, const float * dout, const float * inp, size_t n);

void residual_forward(float * out, const float * a, const float * b, size_t n);

// In place: logits[N,V] -> softmax probs. losses[i] = logsumexp(logits_i) - logits_i[target_i],
// 0 where targets[i] == -100.
void crossentropy_forward(float * losses, float * logits_to_probs, const int32_t * targets,
                          int N, int V);
// In place: probs -> (probs - onehot(target)) * dloss; rows whose target is -100 become 0.
void crossentropy_backward(float * probs_to_dlogits, const int32_t * targets, float dloss,
                           int N, int V);

// dbias[j] += sum_i dout[i, j]
void bias_backward(float * dbias, const float * dout, int N, int OC);

// Sum of squares, accumulated in double.
double sum_squares(const float * x, size_t n);

// PyTorch AdamW (decoupled weight decay): p -= lr*wd*p; m,v updated; bias-corrected with t.
// weight_decay is passed per tensor (0 for tensors with < 2 dims). The gradient is multiplied by
// grad_scale first (global-norm clipping; 1 leaves it bitwise unchanged).
void adamw_update(float * param, const float * grad, float * m, float * v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale = 1.0f);

}  // namespace memfit::cpu
