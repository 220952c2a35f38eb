#include "train/split_weights.h"

#include <cstring>

#include "backend/quant_format.h"

namespace memfit {

SplitBytes split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, DType dense_dt,
                         const float * full) {
    return split_weights(backend, cfg, dense_layout(cfg, q), q, dense_dt, full);
}

SplitBytes split_weights(Backend & backend, const ModelConfig & cfg, const ParamLayout & dl, const QuantLayout & q,
                         DType dense_dt, const float * full, const uint8_t * packed) {
    const ParamLayout all = make_param_layout(cfg);
    std::vector<float> gathered(dl.total);
    for (const auto & p : dl.params)
        std::memcpy(gathered.data() + p.offset, full + all.find(p.name).offset, p.numel * sizeof(float));
    SplitBytes out;
    out.dense.resize(dl.total * dtype_size(dense_dt));
    narrow_f32(out.dense.data(), gathered.data(), dl.total, dense_dt);
    if (packed) {
        out.packed.assign(packed, packed + q.bytes);
        return out;
    }
    out.packed.assign(q.bytes, 0);
    for (const auto & e : q.entries) {
        const std::vector<float> w = gather_quant_entry(cfg, all, e, full);
        backend.quantize(e.q, out.packed.data() + e.offset, w.data());
    }
    return out;
}

std::vector<float> join_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q,
                                      DType dense_dt, const uint8_t * dense, const uint8_t * packed) {
    return join_split_weights(backend, cfg, dense_layout(cfg, q), q, dense_dt, dense, packed);
}

std::vector<float> join_split_weights(Backend & backend, const ModelConfig & cfg, const ParamLayout & dl,
                                      const QuantLayout & q, DType dense_dt, const uint8_t * dense,
                                      const uint8_t * packed) {
    const ParamLayout all = make_param_layout(cfg);
    std::vector<float> full(all.total), d(dl.total);
    widen_to_f32(d.data(), dense, dl.total, dense_dt);
    for (const auto & p : dl.params)
        std::memcpy(full.data() + all.find(p.name).offset, d.data() + p.offset, p.numel * sizeof(float));
    for (const auto & e : q.entries) {
        std::vector<float> m(size_t(e.q.out) * size_t(e.q.in));
        backend.dequantize(e.q, m.data(), packed + e.offset);
        scatter_quant_entry(cfg, all, e, m.data(), full.data());
    }
    return full;
}

void store_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                         uint8_t * packed, const float * full, const uint8_t * packed_from) {
    const SplitBytes s = split_weights(backend, cfg, dense_layout(cfg, q), q, dense.dtype, full, packed_from);
    MF_ASSERT(s.dense.size() == dense.nbytes());
    backend.upload(dense.data, s.dense.data(), s.dense.size());
    if (!s.packed.empty()) backend.upload(packed, s.packed.data(), s.packed.size());
}

std::vector<float> load_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                                      const uint8_t * packed) {
    std::vector<uint8_t> d(dense.nbytes()), p(q.bytes);
    backend.download(d.data(), dense.data, d.size());
    if (!p.empty()) backend.download(p.data(), packed, p.size());
    return join_split_weights(backend, cfg, q, dense.dtype, d.data(), p.data());
}

}  // namespace memfit
