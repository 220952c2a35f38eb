#include "train/split_weights.h"

#include <cstring>

namespace memfit {

void store_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                         uint8_t * packed, const float * full) {
    const ParamLayout all = make_param_layout(cfg), dl = dense_layout(cfg, q);
    MF_ASSERT(size_t(dense.numel()) == dl.total);
    std::vector<float> gathered(dl.total);
    for (const auto & p : dl.params)
        std::memcpy(gathered.data() + p.offset, full + all.find(p.name).offset, p.numel * sizeof(float));
    Tensor src(-1, DType::f32, {int64_t(dl.total)});
    src.data = gathered.data();
    backend.copy(dense, src);
    for (const auto & e : q.entries)
        backend.quantize(e.q, packed + e.offset, gather_quant_entry(cfg, all, e, full).data());
}

std::vector<float> load_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                                      const uint8_t * packed) {
    const ParamLayout all = make_param_layout(cfg), dl = dense_layout(cfg, q);
    MF_ASSERT(size_t(dense.numel()) == dl.total);
    std::vector<float> full(all.total), d(dl.total);
    Tensor dst(-1, DType::f32, {int64_t(dl.total)});
    dst.data = d.data();
    backend.copy(dst, dense);
    for (const auto & p : dl.params)
        std::memcpy(full.data() + all.find(p.name).offset, d.data() + p.offset, p.numel * sizeof(float));
    for (const auto & e : q.entries) {
        std::vector<float> m(size_t(e.q.out) * size_t(e.q.in));
        backend.dequantize(e.q, m.data(), packed + e.offset);
        scatter_quant_entry(cfg, all, e, m.data(), full.data());
    }
    return full;
}

}  // namespace memfit
