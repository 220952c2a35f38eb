#include "train/step.h"

#include <cctype>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {
// The transformer block a parameter belongs to ("model.layers.3.", "h.3.", "...transformer.h.3."),
// or -1.
int param_layer(const std::string & name) {
    size_t at = std::string::npos;
    if (const size_t p = name.find("layers."); p != std::string::npos) at = p + 7;
    else if (name.starts_with("h.")) at = 2;
    else if (const size_t q = name.find(".h."); q != std::string::npos) at = q + 3;
    if (at == std::string::npos || at >= name.size() || !std::isdigit(static_cast<unsigned char>(name[at]))) return -1;
    return std::atoi(name.c_str() + at);
}
}  // namespace

TrainStep::TrainStep(const ModelConfig & cfg, int B, int T, StepMode mode, const Backend * sizing,
                     const ModelOptions & model, StepParts parts)
    : cfg_(cfg), lora_(model.lora.enabled()), mode_(mode), parts_(parts), B_(B), T_(T), compute_(model.compute),
      grad_dt_(model.grad) {
    if (B < 1 || T < 1) throw ConfigError(fmt::format("batch = {}, seq = {}: both must be at least 1", B, T));
    if (T > cfg.max_seq)
        throw ConfigError(fmt::format("seq = {} exceeds the model's context of {} positions; lower --seq", T,
                                      cfg.max_seq));
    const bool train = mode == StepMode::train;
    layout_ = lora_ ? make_lora_layout(cfg, model.lora) : make_param_layout(cfg);
    const char * trainable = "";
    if (lora_) {
        // The frozen base: no gradients, no master copy, no optimizer states.
        trainable = "lora.";
        if (model.lora.quantized()) quant_layout_ = make_quant_layout(cfg, model.lora.format());
        base_layout_ = dense_layout(cfg, quant_layout_);
        base = program_.declare("parameters", Category::parameters, base_layout_.total * dtype_size(compute_), true);
        if (quant_layout_.bytes)
            base_q = program_.declare("parameters.quantized", Category::parameters, quant_layout_.bytes, true);
    }
    const std::string pre = trainable;
    const size_t P = layout_.total * sizeof(float), BT = size_t(B) * size_t(T);
    const bool mixed = compute_ != DType::f32;
    params = program_.declare(pre + "parameters", Category::parameters, layout_.total * dtype_size(compute_), true);
    // fp32 master weights: with the AdamW moments, the 12 bytes per parameter of optimizer state
    // in the ZeRO paper's count; reported in their own category.
    master = train && mixed ? program_.declare(pre + "master_parameters", Category::master_weights, P, true) : -1;
    grads = train ? program_.declare(pre + "gradients", Category::gradients, layout_.total * dtype_size(grad_dt_), true) : -1;
    adam_m = train ? program_.declare(pre + "adamw.m", Category::optimizer_states, P, true) : -1;
    adam_v = train ? program_.declare(pre + "adamw.v", Category::optimizer_states, P, true) : -1;
    tokens = program_.declare("batch.tokens", Category::activations, BT * 4, true);
    targets = program_.declare("batch.targets", Category::activations, BT * 4, true);
    losses = program_.declare("batch.losses", Category::activations, BT * 4, true);
    grad_norm_sq = train ? program_.declare("grad_norm_sq", Category::activations, 4, true) : -1;
    workspace_ = program_.declare("workspace", Category::workspace, 0);
    ModelOptions mo = model;
    mo.with_backward = train;
    mo.keep_logits = mode == StepMode::logits;
    if (mo.keep_logits) mo.loss_chunk = 0;
    model_ = std::make_unique<Transformer>(cfg_, B, T, program_, mo);
    if (lora_) {
        w_ = lora_model_weights(cfg_, model.lora, base, compute_, quant_layout_, base_q, params, compute_);
        if (train) dw_ = lora_model_weights(cfg_, model.lora, -1, compute_, quant_layout_, -1, grads, grad_dt_);
    } else {
        w_ = model_weights(cfg_, layout_, params, compute_);
        if (train) dw_ = model_weights(cfg_, layout_, grads, grad_dt_);
    }

    if (train && parts_.optimizer && parts_.reduce_grads)
        for (const auto & p : layout_.params) {
            const int l = param_layer(p.name);
            if (!buckets_.empty() && buckets_.back().layer == l) buckets_.back().numel += p.numel;
            else buckets_.push_back(Bucket{l, p.offset, p.numel});
        }
    Graph rec(program_, sizing);
    run(rec, StepScalars{});
    program_.finalize();
}

void TrainStep::run(Graph & g, const StepScalars & s) const {
    g.set_workspace(workspace_);
    g.set_seed(s.seed);
    const int64_t b = B_, t = T_, P = int64_t(layout_.total);
    const Tensor tok(tokens, DType::i32, {b, t}), tgt(targets, DType::i32, {b, t});
    const Tensor loss(losses, DType::f32, {b, t});
    if (mode_ == StepMode::train && parts_.zero_grads) {
        g.phase(Phase::other);
        g.fill_zero(Tensor(grads, grad_dt_, {P}));
    }
    model_->forward(g, w_, tok);
    if (mode_ == StepMode::logits) {
        model_->head_logits(g, w_);
        return;
    }
    model_->head_loss(g, w_, mode_ == StepMode::train ? &dw_ : nullptr, tgt.view(0, {b * t}), loss.view(0, {b * t}),
                      s.dloss);
    if (mode_ == StepMode::eval) return;
    auto grad_view = [&](const Bucket & bucket) {
        return Tensor(grads, grad_dt_, {int64_t(bucket.numel)}, bucket.offset * dtype_size(grad_dt_));
    };
    std::function<void(Graph &, int)> reduce;
    if (!buckets_.empty())
        reduce = [&](Graph & gg, int layer) {
            gg.phase(Phase::communication);
            for (size_t i = 0; i < buckets_.size(); ++i)
                if (buckets_[i].layer == layer) gg.all_reduce_start(grad_view(buckets_[i]), int(i));
            gg.phase(Phase::backward);
        };
    model_->backward(g, w_, dw_, tok, reduce);
    if (!parts_.optimizer) return;
    g.phase(Phase::communication);
    g.layer(-1);
    for (size_t i = 0; i < buckets_.size(); ++i) g.all_reduce_wait(grad_view(buckets_[i]), int(i));

    g.phase(Phase::optimizer);
    g.layer(-1);
    const Tensor norm_sq(grad_norm_sq, DType::f32, {1});
    g.sum_squares(norm_sq, Tensor(grads, grad_dt_, {P}));
    const bool mixed = master >= 0;
    for (const auto & p : layout_.params) {
        AdamWHyper h = s.adamw;
        if (!p.decay()) h.weight_decay = 0;
        const size_t off = p.offset * sizeof(float);
        const int64_t n = int64_t(p.numel);
        // Mixed precision: AdamW updates the fp32 master weights and rounds them into the
        // compute-precision copy the next step's matmuls read.
        const Tensor copy = mixed ? Tensor(params, compute_, {n}, p.offset * dtype_size(compute_)) : Tensor{};
        g.adamw(Tensor(mixed ? master : params, DType::f32, {n}, off),
                Tensor(grads, grad_dt_, {n}, p.offset * dtype_size(grad_dt_)), Tensor(adam_m, DType::f32, {n}, off),
                Tensor(adam_v, DType::f32, {n}, off), norm_sq, copy, h);
    }
}

}  // namespace memfit
