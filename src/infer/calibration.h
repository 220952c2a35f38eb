// GPTQ's calibration: the inputs of one block's four projections over calibration sequences,
// accumulated as H = X^T X per projection ([in, in], fp32), by a planned program like any other.
//
// The program runs one block, layer `layer`, in fp32: layer 0 with the embedding, from tokens;
// a later layer from the residual stream its predecessor produced ([batch, seq, C] fp32 in, the
// same out), the way a pipeline stage runs from what it receives (ModelOptions::layer_begin/end).
// A tap on the block's projections (Transformer::set_projection_tap) adds each input's X^T X into
// a persistent buffer "gptq.hessian.<proj>" (category workspace) through the weight-gradient gemm.
// The quantizer (app/quantize.h) runs each layer for the Hessians (once, or before each projection
// under true-sequential, reset() between), then quantized for the outputs the next layer
// calibrates on, so that every layer sees the inputs the quantized model below it produces, as
// the paper does: 2 L block passes, 5 L true-sequential. The memory is that layer's
// Hessians, the weights and one batch's forward activations, planned and checked as a step's.
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
    // The whole model's fp32 weights (make_param_layout order; the program reads its layer's).
    void set_weights(const float * params);
    // Runs the block on batch x seq tokens (layer 0) or on the previous block's output
    // (batch x seq x C floats, later layers), adding its projections' inputs to the Hessians, and
    // returns the block's output (batch x seq x C floats, the next layer's input).
    std::vector<float> run(const int32_t * tokens);
    std::vector<float> run(const float * hidden);
    // X^T X of the projection's inputs [in, in] in double, summed over every run, and the rows
    // (tokens) that made it.
    std::vector<double> hessian(int proj) const;
    // Zeroes the Hessians (a true-sequential pass starts its projection's afresh).
    void reset();
    int64_t rows() const { return rows_; }
    int layer() const;
    // The program's planned peak and the ledger's measured one.
    CategoryBytes planned_peak_live() const;
    const Ledger & ledger() const { return ledger_; }

private:
    std::vector<float> execute(const void * input, size_t bytes);
    struct Impl;
    std::unique_ptr<Impl> impl_;
    Backend & backend_;
    Ledger ledger_;
    int64_t rows_ = 0;
};

}  // namespace memfit
