// The optimizers memfit trains with, one row each (ggml's op table as the model): the states a
// row keeps per trainable element (their names, dtypes and sizes), its settings and what the
// planner and the launch files need to know. Everything generic reads the row: the step declares
// the row's states (train/step.cpp), offload stages them, checkpoints widen its moments, the
// planner counts their bytes. One op runs a step of any row (Backend::optimizer_step); each
// backend keeps a table of kernels indexed by the row (cpu/kernels_optim.cpp,
// cuda/kernels_optim.cu), and the per-element rules both compile are in backend/update_rules.h.
// A new optimizer: a row here, its rule, a kernel per backend, its tests.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace memfit {

enum class Optimizer : uint8_t { adamw, adamw_bf16, sgd, adamw_8bit, adafactor, galore_adamw, galore_adamw_8bit };
constexpr int kOptimizerCount = 7;
constexpr int kMaxOptimizerStates = 6;

// How many elements of a state a parameter view of n elements owns (state_len()): n, one per
// block of kMoments8Block (backend/moments8.h; blocks never straddle two parameter tensors),
// (factored) one per row and one per column of a matrix view [R, C] (R + C; a vector, or a
// matrix with one row or column, one per element: factored_len()). GaLore's, for a view it
// projects to rank r (galore_rank(); 0: it does not): the projector, r x min(R, C); the
// projected moments, r x max(R, C) (n when not projected) and their 8-bit blocks; the step's
// scratch, declared once at the largest view's size and live only while the updates run.
// Adafactor's optional first moment (first_moment): n when the run has one, else none.
enum class StateSize : uint8_t { elements, blocks, factored, projector, projected, projected_blocks, scratch, first_moment };

// A view's matrix: [R, C] when its shape is two-dimensional, else [1, n].
inline int64_t view_rows(const Tensor & t) { return t.ndim == 2 ? t.shape[0] : 1; }
inline int64_t view_cols(const Tensor & t) { return t.ndim == 2 ? t.shape[1] : t.numel(); }
// Elements of a factored state for an R x C view: R + C when both are 2 or more (Adafactor's
// row and column statistics), else R x C (a vector's, whose factoring would change nothing).
inline size_t factored_len(int64_t rows, int64_t cols) {
    return rows >= 2 && cols >= 2 ? size_t(rows + cols) : size_t(rows * cols);
}

// GaLore (Zhao et al. 2024) projects a view's gradient when it is a whole matrix the optimizer
// targets (the blocks' projection weights) whose shorter side is at least twice the rank (so
// its states and projector fit in its own fp32 moments' range of a checkpoint); else rank 0.
inline int64_t galore_rank(bool target, int64_t rows, int64_t cols, int64_t rank) {
    return target && rank > 0 && rows >= 2 * rank && cols >= 2 * rank ? rank : 0;
}
// Elements of state kind k for an R x C view (R = 1 for a vector) at GaLore rank r (0: none),
// with Adafactor's first moment or without.
size_t state_len(StateSize k, int64_t rows, int64_t cols, int64_t rank, bool first_moment = false);

struct OptimizerState {
    const char * name = nullptr;   // the buffer's name after the trainable buffer's prefix ("adamw.m")
    DType dtype = DType::f32;
    StateSize size = StateSize::elements;
};

struct OptimizerRow {
    Optimizer id;
    const char * name;    // --optimizer's spelling
    const char * op;      // the step program's op (traces, profiles)
    const char * about;   // one line: what it keeps per parameter
    int n_states;
    std::array<OptimizerState, kMaxOptimizerStates> states;
    // The checkpoint's fp32 first and second moments (adamw.m, adamw.v): the states holding them
    // (-1: none, written as zeros); an 8-bit moment's f32 block scales are state scales[k].
    int moment[2];
    int scales[2];
    double flops;              // per element, for the op's trace and the time model
    const char * deepspeed;    // DeepSpeed's optimizer "type" in a launch file; nullptr: none names it
};

const OptimizerRow & optimizer_row(Optimizer o);
// Whether the row keeps a state of kind k.
bool has_state(Optimizer o, StateSize k);
// Per state kind: a total of elements (a shard's state buffers), or where a view's states start.
using StateLens = std::array<size_t, 8>;
inline size_t & lens_at(StateLens & l, StateSize k) { return l[size_t(k)]; }
// Bytes of state per trainable parameter (the planner's count; block scales amortized; a
// factored state as its matrices' R + C over R x C with R = C = `width`, the model's; GaLore's
// as rank-`rank` moments and projector of width x width matrices, every parameter projected).
double optimizer_state_bytes(Optimizer o, int64_t width = 1024, int64_t rank = 128, bool first_moment = false);
// Bytes of the states of one R x C matrix at GaLore rank `rank` (galore_rank(): 0 when it is not
// projected), 8-bit blocks whole, the update's scratch not counted.
size_t matrix_state_bytes(Optimizer o, int64_t rows, int64_t cols, int64_t rank, bool first_moment = false);
Optimizer parse_optimizer(std::string_view o);   // ConfigError naming the rows
const char * optimizer_name(Optimizer o);
std::string optimizer_choices();                 // the rows' names, comma separated

// One optimizer step's settings, per parameter view (the step sets weight_decay, keep_zeros and
// sr_at per view; everything else is the step's).
struct OptimHyper {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
    int   t = 1;   // 1-based step count, for bias correction
    float clip = 0;  // clip gradients to this global L2 norm before the update (0: no clipping)
    // Gradients are multiplied by grad_scale first (1 / the loss scale); norm_sq is the sum of
    // squares of the scaled gradients, so the true norm is sqrt(norm_sq) * grad_scale.
    float grad_scale = 1.0f;
    // Loss scaling: leave every tensor unchanged when norm_sq is inf or NaN (a skipped step).
    bool skip_nonfinite = false;
    // > 0: leave them unchanged too when norm_sq is above this (a gradient spike, --skip-spikes).
    // Same units as norm_sq (the scaled gradients').
    float skip_above_norm_sq = 0;
    // > 0: the engine leaves the step out when its mean loss (over the whole step: every
    // micro-batch and rank) is above this or not finite, deciding before the update begins
    // (--skip-spikes). The kernels never read it.
    float skip_above_loss = 0;
    // Tests: the loss gradient is multiplied by this (an injected gradient spike, or NaN).
    float loss_grad_factor = 1.0f;
    // --master-weights bf16-sr: `param` is the bf16 weights themselves (no fp32 master, no
    // param_copy), updated in place and rounded stochastically (backend/stochastic_round.h) with
    // the draws of (sr_seed, sr_at + i): sr_at is the view's first element in the flat buffer.
    uint64_t sr_seed = 0, sr_at = 0;
    // --optimizer sgd: PyTorch's SGD with momentum (no dampening or Nesterov) and L2 weight
    // decay: g' = g + weight_decay * p, buf = momentum * buf + g', p -= lr * buf.
    float momentum = 0.9f;
    // N:M sparsity's masked updates (model/sparsity.h): an element whose weight (`param`) is
    // exactly 0 stays 0 and its states are set to 0, whatever its gradient; the mask is the zeros
    // themselves, so it needs no buffer. Set per op by the step, for the pruned projection
    // weights only (zero-initialised biases must still train).
    bool keep_zeros = false;
    // --optimizer adafactor (Shazeer & Stern 2018, as transformers' Adafactor with relative_step
    // and scale_parameter off): the second moments' decay 1 - t^decay_rate, eps1 added to the
    // squared gradients, and the update's RMS clipped to clip_threshold.
    float decay_rate = -0.8f, eps1 = 1e-30f, clip_threshold = 1.0f;
    // --adafactor-beta1: its first moment's decay (transformers' beta1; 0: none, its default),
    // an average of the clipped, lr-scaled updates, which then is the step.
    float adafactor_beta1 = 0.0f;
    // --optimizer galore-adamw[-8bit] (Zhao et al. 2024): the view's rank (galore_rank(); 0: a
    // plain AdamW update of the view), the projector's refresh every update_gap steps (on steps
    // 1, gap + 1, ...), and the projected update's scale (alpha).
    int galore_rank = 0, galore_update_gap = 200;
    float galore_scale = 0.25f;
};

// The states of one parameter view, in its row's order (invalid past n_states).
struct OptimizerStates {
    std::array<Tensor, kMaxOptimizerStates> t;
};

// Whether an optimizer op's `param` is bf16-sr's bf16 weights (true: a seed and no copy, checked)
// or fp32 (false); the kernels of every backend ask it.
inline bool sr_weights(const Tensor & param, const Tensor & param_copy, const OptimHyper & h) {
    MF_ASSERT(param.dtype == DType::f32 || (param.dtype == DType::bf16 && h.sr_seed != 0 && !param_copy.valid()));
    return param.dtype == DType::bf16;
}

// Whether the optimizer leaves the step out (the kernels and the engine decide alike).
inline bool skips_update(const OptimHyper & h, float norm_sq) {
    if (h.skip_nonfinite && !std::isfinite(norm_sq)) return true;
    return h.skip_above_norm_sq > 0 && norm_sq > h.skip_above_norm_sq;
}

// The factor applied to every stored gradient: grad_scale, times min(1, clip / true norm).
inline float update_scale(const OptimHyper & h, float norm_sq) {
    if (!(h.clip > 0)) return h.grad_scale;
    const float norm = std::sqrt(norm_sq) * h.grad_scale;
    return norm > h.clip ? h.grad_scale * (h.clip / norm) : h.grad_scale;
}

// The checks every backend's optimizer_step makes of a view before its kernel runs.
void check_optimizer_view(Optimizer o, const Tensor & param, const Tensor & grad, const OptimizerStates & st,
                          const Tensor & param_copy, const OptimHyper & h);

}  // namespace memfit
