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

enum class Optimizer : uint8_t { adamw, adamw_bf16, sgd, adamw_8bit, adafactor };
constexpr int kOptimizerCount = 5;
constexpr int kMaxOptimizerStates = 4;

// How many elements of a state a parameter view of n elements owns: n, one per block of
// kMoments8Block (backend/moments8.h; blocks never straddle two parameter tensors), or
// (factored) one per row and one per column of a matrix view [R, C] (R + C; a vector, or a
// matrix with one row or column, one per element: factored_len()).
enum class StateSize : uint8_t { elements, blocks, factored };

// A view's matrix: [R, C] when its shape is two-dimensional, else [1, n].
inline int64_t view_rows(const Tensor & t) { return t.ndim == 2 ? t.shape[0] : 1; }
inline int64_t view_cols(const Tensor & t) { return t.ndim == 2 ? t.shape[1] : t.numel(); }
// Elements of a factored state for an R x C view: R + C when both are 2 or more (Adafactor's
// row and column statistics), else R x C (a vector's, whose factoring would change nothing).
inline size_t factored_len(int64_t rows, int64_t cols) {
    return rows >= 2 && cols >= 2 ? size_t(rows + cols) : size_t(rows * cols);
}

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
// Bytes of a state for views of `elems` elements in `blocks` 8-bit blocks and `factored`
// factored_len() elements.
inline size_t state_buffer_bytes(const OptimizerState & s, size_t elems, size_t blocks, size_t factored) {
    const size_t n = s.size == StateSize::blocks ? blocks : s.size == StateSize::factored ? factored : elems;
    return n * dtype_size(s.dtype);
}
// Bytes of state per trainable parameter (the planner's count; block scales amortized; a
// factored state as its matrices' R + C over R x C with R = C = `width`, the model's).
double optimizer_state_bytes(Optimizer o, int64_t width = 1024);
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
