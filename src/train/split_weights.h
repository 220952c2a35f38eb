// A model's weights held as a dense part in the compute dtype (dense_layout(cfg, q) order) plus
// packed projections (QuantLayout q): LoRA's frozen base and the quantized Decoder. These move
// the whole model's fp32 weights (make_param_layout order) in and out of that form.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/lora.h"

namespace memfit {

// dense: a resolved tensor of dense_layout(cfg, q).total elements; packed: q.bytes (null if none).
void store_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                         uint8_t * packed, const float * full);
// The weights as the kernels see them: rounded to the compute dtype, or dequantized.
std::vector<float> load_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                                      const uint8_t * packed);

}  // namespace memfit
