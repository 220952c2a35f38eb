// The step program for one configuration: the persistent buffers (parameters, gradients, AdamW
// moments, the batch) plus the model's forward, loss, backward and optimizer ops, recorded once
// into a Program. run() is the single source of truth: the constructor records it through a
// recording Graph, and the engine executes the very same calls.
#pragma once

#include <memory>

#include "backend/graph.h"
#include "memory/program.h"
#include "model/config.h"
#include "model/transformer.h"
#include "model/param_layout.h"

namespace memfit {

enum class StepMode {
    train,    // forward, loss, backward, gradient norm, AdamW
    eval,     // forward and loss
    logits,   // forward only; the logits buffer keeps the logits
};

// Which ends of a training step a program includes (gradient accumulation splits one optimizer
// step into several micro-steps: the first zeroes the gradients, the last updates).
struct StepParts {
    bool zero_grads = true;
    bool optimizer = true;
    // Data parallel: sum the gradients over the ranks before the optimizer, bucket by bucket
    // (one per layer) as soon as backward has finished each layer's.
    bool reduce_grads = false;
};

struct StepScalars {
    float      dloss = 0;       // 1 / (number of non-ignored targets in the batch)
    AdamWHyper adamw;           // lr, betas, eps, weight decay (applied to >= 2-D tensors), t
    uint64_t   seed = 0;        // this micro-step's random stream (LoRA dropout)
};

class TrainStep {
public:
    // `sizing` answers library-scratch queries while recording (the backend that will run it).
    // Model options (loss_chunk, flash_attention) come from `model`; the mode decides the rest.
    TrainStep(const ModelConfig & cfg, int B, int T, StepMode mode, const Backend * sizing,
              const ModelOptions & model = {}, StepParts parts = {});

    void run(Graph & g, const StepScalars & s) const;

    const Program & program() const { return program_; }
    const ModelConfig & config() const { return cfg_; }
    // The trainable parameters: the whole model, or (LoRA) the adapters.
    const ParamLayout & layout() const { return layout_; }
    bool lora() const { return lora_; }
    // LoRA: the frozen base, dense part (`base`, compute dtype) and quantized projections (`base_q`).
    const ParamLayout & base_layout() const { return base_layout_; }
    const QuantLayout & quant_layout() const { return quant_layout_; }
    StepMode mode() const { return mode_; }
    int B() const { return B_; }
    int T() const { return T_; }

    // Persistent buffers the host reads or writes between steps. params holds the trainable
    // weights in the compute dtype; under mixed precision `master` holds them in fp32 (else -1).
    BufferId params, master, grads, adam_m, adam_v, tokens, targets, losses, grad_norm_sq;
    BufferId base = -1, base_q = -1;   // LoRA's frozen base
    DType compute() const { return compute_; }
    DType grad_dtype() const { return grad_dt_; }
    Tensor logits() const { return model_->logits(); }

private:
    ModelConfig cfg_;
    ParamLayout layout_, base_layout_;
    QuantLayout quant_layout_;
    bool lora_ = false;
    StepMode mode_;
    StepParts parts_;
    int B_, T_;
    DType compute_, grad_dt_;
    Program program_;
    BufferId workspace_ = -1;
    std::unique_ptr<Transformer> model_;
    ModelWeights w_, dw_;
    // Gradient buckets: runs of adjacent parameters of one layer (-1: outside the blocks).
    struct Bucket { int layer; size_t offset, numel; };
    std::vector<Bucket> buckets_;
};

}  // namespace memfit
