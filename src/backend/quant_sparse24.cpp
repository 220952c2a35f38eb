// sparse24, the 2:4 structured-sparse packing (the layout: quant_format.h). Host code, shared by
// the CPU backend (its dequantizing matmuls, tile by tile) and the CUDA backend (which packs here
// and expands on the device, backend/cuda/kernels_quant.cu).
#include <cstring>

#include "backend/quant_format.h"
#include "core/dtype.h"
#include "core/error.h"

namespace memfit {

namespace {

constexpr int64_t kGroup = 4;   // inputs per group; 2 kept

void check_shape(int64_t out, int64_t in) {
    MF_ASSERT(out > 0 && in > 0 && in % kGroup == 0 && (out * in) % 8 == 0);
}

}  // namespace

size_t sparse24_bytes(int64_t out, int64_t in) {
    check_shape(out, in);
    const size_t n = size_t(out) * size_t(in), bytes = quant_bytes(QuantDesc{QuantFormat::sparse24, out, in});
    MF_ASSERT(bytes == n / 2 * sizeof(uint16_t) + n / 8);   // the values, then a nibble of positions per group
    return bytes;
}

void Sparse24Quant::quantize(uint8_t * packed, const float * W) const {
    check_shape(out, in);
    const int64_t groups = out * in / kGroup;
    uint8_t * pos = packed + size_t(groups) * 2 * sizeof(uint16_t);
    // Two groups per position byte: each task writes whole bytes.
#pragma omp parallel for schedule(static)
    for (int64_t pair = 0; pair < groups / 2; ++pair) {
        uint8_t byte = 0;
        for (int64_t h = 0; h < 2; ++h) {
            const int64_t g = 2 * pair + h;
            const float * x = W + g * kGroup;   // rows are whole groups: in % 4 == 0
            bool keep[kGroup];
            nm_keep(x, 1, 2, int(kGroup), keep);
            uint8_t fields = 0;
            int slot = 0;
            for (int j = 0; j < kGroup; ++j) {
                if (!keep[j]) continue;
                const uint16_t v = f32_to_bf16(x[j]);
                std::memcpy(packed + size_t(2 * g + slot) * sizeof v, &v, sizeof v);
                fields = uint8_t(fields | j << (2 * slot));
                ++slot;
            }
            byte = uint8_t(byte | fields << (4 * h));
        }
        pos[pair] = byte;
    }
}

void Sparse24Quant::dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const {
    check_shape(out, in);
    MF_ASSERT(row0 >= 0 && nrows >= 0 && row0 + nrows <= out);
    const int64_t groups = out * in / kGroup, g0 = row0 * in / kGroup, g1 = (row0 + nrows) * in / kGroup;
    const uint8_t * pos = packed + size_t(groups) * 2 * sizeof(uint16_t);
#pragma omp parallel for schedule(static)
    for (int64_t g = g0; g < g1; ++g) {
        float * d = dst + (g - g0) * kGroup;
        d[0] = d[1] = d[2] = d[3] = 0.0f;
        const unsigned fields = unsigned(pos[g / 2] >> (4 * (g % 2))) & 15u;
        for (int slot = 0; slot < 2; ++slot) {
            uint16_t v;
            std::memcpy(&v, packed + size_t(2 * g + slot) * sizeof v, sizeof v);
            d[(fields >> (2 * slot)) & 3u] = bf16_to_f32(v);
        }
    }
}

}  // namespace memfit
