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

// The split form in host memory: the dense part's bytes (dtype `dense_dt`) and the packed
// projections' q.bytes (empty without quantized projections). The backend packs (its quantize
// reads and writes host memory).
struct SplitBytes {
    std::vector<uint8_t> dense, packed;
};
SplitBytes split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, DType dense_dt,
                         const float * full);
// The whole model's fp32 weights from the split form in host memory (dequantized).
std::vector<float> join_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q,
                                      DType dense_dt, const uint8_t * dense, const uint8_t * packed);
// The same of a part of the model (a pipeline stage's): its dense part `dl` (a dense_part of
// the model's layout) and packed projections `q`; join fills only that part of the whole model.
// packed (q.bytes, optional): the projections already packed (a GPTQ folder's), taken as they are
// instead of quantizing full's.
SplitBytes split_weights(Backend & backend, const ModelConfig & cfg, const ParamLayout & dl, const QuantLayout & q,
                         DType dense_dt, const float * full, const uint8_t * packed = nullptr);
std::vector<float> join_split_weights(Backend & backend, const ModelConfig & cfg, const ParamLayout & dl,
                                      const QuantLayout & q, DType dense_dt, const uint8_t * dense,
                                      const uint8_t * packed);

// dense: a resolved tensor of dense_layout(cfg, q).total elements; packed: q.bytes (null if none),
// both in the backend's memory (device memory on a GPU: staged through the host, so nothing but
// the weights' own buffers is ever on the device).
// packed_from (optional): the projections already packed, as split_weights takes them.
void store_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                         uint8_t * packed, const float * full, const uint8_t * packed_from = nullptr);
// The weights as the kernels see them: rounded to the compute dtype, or dequantized.
std::vector<float> load_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                                      const uint8_t * packed);

}  // namespace memfit
