#include "train/split_weights.h"

#include <cstring>

#include "backend/quant_format.h"

namespace memfit {

// On a device backend (!host_memory()) dense and packed are device memory: the dense part is
// rounded and the projections packed on the host, then uploaded (and downloaded the other way),
// so nothing but the weights' own buffers is ever on the device.
void store_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                         uint8_t * packed, const float * full) {
    const ParamLayout all = make_param_layout(cfg), dl = dense_layout(cfg, q);
    MF_ASSERT(size_t(dense.numel()) == dl.total);
    std::vector<float> gathered(dl.total);
    for (const auto & p : dl.params)
        std::memcpy(gathered.data() + p.offset, full + all.find(p.name).offset, p.numel * sizeof(float));
    if (backend.host_memory()) {
        Tensor src(-1, DType::f32, {int64_t(dl.total)});
        src.data = gathered.data();
        backend.copy(dense, src);
    } else {
        std::vector<uint8_t> bytes(dense.nbytes());
        narrow_f32(bytes.data(), gathered.data(), dl.total, dense.dtype);
        backend.upload(dense.data, bytes.data(), bytes.size());
    }
    std::vector<uint8_t> staged;
    for (const auto & e : q.entries) {
        const std::vector<float> w = gather_quant_entry(cfg, all, e, full);
        if (backend.host_memory()) {
            backend.quantize(e.q, packed + e.offset, w.data());
            continue;
        }
        staged.resize(quant_bytes(e.q));
        backend.quantize(e.q, staged.data(), w.data());
        backend.upload(packed + e.offset, staged.data(), staged.size());
    }
}

std::vector<float> load_split_weights(Backend & backend, const ModelConfig & cfg, const QuantLayout & q, Tensor dense,
                                      const uint8_t * packed) {
    const ParamLayout all = make_param_layout(cfg), dl = dense_layout(cfg, q);
    MF_ASSERT(size_t(dense.numel()) == dl.total);
    std::vector<float> full(all.total), d(dl.total);
    if (backend.host_memory()) {
        Tensor dst(-1, DType::f32, {int64_t(dl.total)});
        dst.data = d.data();
        backend.copy(dst, dense);
    } else {
        std::vector<uint8_t> bytes(dense.nbytes());
        backend.download(bytes.data(), dense.data, bytes.size());
        widen_to_f32(d.data(), bytes.data(), dl.total, dense.dtype);
    }
    for (const auto & p : dl.params)
        std::memcpy(full.data() + all.find(p.name).offset, d.data() + p.offset, p.numel * sizeof(float));
    std::vector<uint8_t> staged;
    for (const auto & e : q.entries) {
        std::vector<float> m(size_t(e.q.out) * size_t(e.q.in));
        const uint8_t * src = packed + e.offset;
        if (!backend.host_memory()) {
            staged.resize(quant_bytes(e.q));
            backend.download(staged.data(), src, staged.size());
            src = staged.data();
        }
        backend.dequantize(e.q, m.data(), src);
        scatter_quant_entry(cfg, all, e, m.data(), full.data());
    }
    return full;
}

}  // namespace memfit
