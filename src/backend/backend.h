// The op interface every backend implements (CPU now; CUDA later; the null backend computes
// nothing). Ops take resolved Tensor views; dimensions come from the tensors' shapes:
//   B = batch, T = sequence, C = channels, NH = heads, V = vocabulary, N = rows (B*T).
// Conventions (DESIGN.md): outputs first, then saved-for-backward buffers, then inputs and
// weights. Forward outputs are written with `=`; parameter gradients accumulate with `+=`;
// activation gradients are written with `=` except where an op says it accumulates.
// The dtype rides in each Tensor; this CPU kernels accept f32 only.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace memfit {

// C[M,N] (+)= op(A)[M,K] . op(B)[K,N] (+ bias[N]), all row-major; op(X) = X^T when trans_x,
// i.e. A is stored [K,M] when trans_a and B is stored [N,K] when trans_b.
struct GemmDesc {
    int64_t M = 0, N = 0, K = 0;
    bool trans_a = false, trans_b = false;
    bool accumulate = false;   // C += ... instead of C = ...
    bool bias = false;         // add bias[N] to every row (only with accumulate == false)
    bool operator==(const GemmDesc &) const = default;
};

struct AdamWHyper {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
    int   t = 1;   // 1-based step count, for bias correction
    float clip = 0;  // clip gradients to this global L2 norm before the update (0: no clipping)
};

// The factor global-norm clipping applies to every gradient: min(1, clip / norm).
inline float clip_scale(float clip, float norm_sq) {
    if (!(clip > 0)) return 1.0f;
    const float norm = std::sqrt(norm_sq);
    return norm > clip ? clip / norm : 1.0f;
}

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char * name() const = 0;

    // Scratch bytes gemm() needs for this shape; planned as `workspace` (0 if none).
    virtual size_t gemm_workspace(const GemmDesc & d) const { (void) d; return 0; }

    virtual void fill_zero(Tensor t) = 0;
    virtual void copy(Tensor dst, Tensor src) = 0;

    virtual void gemm(const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace) = 0;
    // dbias[N] += column sums of dout[rows, N]
    virtual void bias_grad(Tensor dbias, Tensor dout) = 0;

    // out[B,T,C] = wte[tokens] + wpe[t]
    virtual void encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) = 0;
    // dwte, dwpe += ...
    virtual void encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) = 0;

    // out[N,C], mean[N], rstd[N] from inp[N,C]
    virtual void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) = 0;
    // dinp += ..., dw += ..., db += ...
    virtual void layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                               Tensor mean, Tensor rstd) = 0;

    // Causal self-attention. qkv[B,T,3C] -> out[B,T,C]; att[B,NH,T,T] softmax probs saved.
    virtual void attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH) = 0;
    // dqkv = ... (written); scratch holds >= B*NH*T floats.
    virtual void attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH) = 0;

    // Memory-efficient causal attention: never stores the T x T scores. lse[B,NH,T] keeps one
    // log-sum-exp per query; backward recomputes the scores tile by tile.
    virtual void flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH) = 0;
    virtual void flash_attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse,
                                     int NH) = 0;
    // Scratch bytes flash_attention_bwd needs for this shape (planned as workspace).
    virtual size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH) const = 0;

    virtual void gelu_fwd(Tensor out, Tensor inp) = 0;
    virtual void gelu_bwd(Tensor dinp, Tensor dout, Tensor inp) = 0;          // dinp = ...
    virtual void residual_fwd(Tensor out, Tensor a, Tensor b) = 0;            // out = a + b

    // logits[N,V] are turned into probabilities in place; losses[N] = -log p[target]
    // (0 where target == -100).
    virtual void xent_fwd(Tensor losses, Tensor logits, Tensor targets) = 0;
    // probs[N,V] become dlogits in place: (p - onehot(target)) * dloss; rows with target -100 -> 0.
    virtual void xent_bwd(Tensor probs, Tensor targets, float dloss) = 0;

    // out[0] = sum of squares of x (f32, accumulated in double). Several calls on slices may be
    // summed by the caller.
    virtual void sum_squares(Tensor out, Tensor x) = 0;
    // norm_sq[0]: the gradients' global sum of squares (from sum_squares), used when h.clip > 0.
    virtual void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor norm_sq, const AdamWHyper & h) = 0;
};

}  // namespace memfit
