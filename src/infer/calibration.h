// GPTQ's calibration: the inputs of one block's four projections over calibration sequences,
// accumulated as H = X^T X per projection ([in, in], fp32), by a planned program like any other.
//
// The program is the model's forward up to and including layer `layer` (the embedding, blocks
// 0 .. layer; no final norm or head), in fp32, with a tap on that layer's projections
// (Transformer::set_projection_tap) that adds each input's X^T X into a persistent buffer
// "gptq.hessian.<proj>" (category workspace) through the weight-gradient gemm. The blocks below
// hold whatever weights set_weights() gives them: the quantizer gives them their already
// quantized (dequantized) values, so each layer is calibrated on the inputs the quantized model
// below it produces, as the paper does. One program per layer: its memory is that layer's
// Hessians, the weights and one batch's forward activations, planned and checked as a step's are.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "model/config.h"

namespace memfit {

class LayerHessians {
public:
    // rows of `seq` tokens, `batch` of them per run(); ConfigError when the model cannot run them.
    LayerHessians(const ModelConfig & cfg, Backend & backend, int layer, int batch, int seq);
    ~LayerHessians();
    // The whole model's fp32 weights (make_param_layout order).
    void set_weights(const float * params);
    // Adds the inputs of batch x seq tokens (row-major) to the Hessians.
    void run(const int32_t * tokens);
    // X^T X of the projection's inputs [in, in] in double, summed over every run, and the rows
    // (tokens) that made it.
    std::vector<double> hessian(int proj) const;
    int64_t rows() const { return rows_; }
    // The program's planned peak and the ledger's measured one.
    CategoryBytes planned_peak_live() const;
    const Ledger & ledger() const { return ledger_; }

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    Backend & backend_;
    Ledger ledger_;
    int64_t rows_ = 0;
};

}  // namespace memfit
