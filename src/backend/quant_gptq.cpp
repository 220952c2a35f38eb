// gptq, the GPTQ checkpoint format's v1 layout (quant_format.h). Host code, shared by the CPU
// backend (its dequantizing matmuls, tile by tile) and the CUDA backend (which packs here and
// dequantizes on the device, backend/cuda/kernels_quant.cu). The GPTQ solver is infer/gptq.h's;
// quantize() here is its round-to-nearest baseline.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/dtype.h"
#include "core/error.h"

namespace memfit {

namespace {

uint32_t load_u32(const uint8_t * p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
void store_u32(uint8_t * p, uint32_t v) { std::memcpy(p, &v, sizeof v); }

void check(const GptqQuant & q) {
    MF_ASSERT((q.bits == 4 || q.bits == 8) && q.out > 0 && q.in > 0 && q.group > 0);
    MF_ASSERT(q.in % q.per_word() == 0 && q.out % q.per_word() == 0 && q.in % q.group == 0);
}

}  // namespace

void check_gptq_shape(const QuantDesc & q, const std::string & what) {
    if (q.bits != 4 && q.bits != 8)
        throw ConfigError(fmt::format("{}: {} bits per code; GPTQ stores 4 or 8", what, q.bits));
    const int p = 32 / q.bits;
    if (q.in % p != 0 || q.out % p != 0)
        throw ConfigError(fmt::format("{} is {} x {}: {}-bit codes pack {} to an int32, so both sides must be "
                                      "multiples of {}", what, q.out, q.in, q.bits, p, p));
    if (q.group <= 0 || q.in % q.group != 0)
        throw ConfigError(fmt::format("{} has {} inputs: the group size {} does not divide them; pass --group-size "
                                      "with a divisor (e.g. {}), or -1 for one group per row", what, q.in, q.group,
                                      std::gcd(int64_t(q.in), int64_t(128))));
}

void GptqQuant::quantize(uint8_t * packed, const float * W) const {
    check(*this);
    const int p = per_word();
    std::memset(packed, 0, bytes());
    for (int64_t g = 0; g < groups(); ++g)
        for (int64_t o = 0; o < out; ++o) {
            const float * x = W + o * in + g * group;
            const auto [lo, hi] = std::minmax_element(x, x + group);
            int zero = 0;
            const uint16_t h = gptq_grid(*lo, *hi, bits, true, &zero);
            std::memcpy(packed + scales_at() + size_t(g * out + o) * 2, &h, 2);
            uint8_t * zw = packed + qzeros_at() + size_t(g * (out / p) + o / p) * 4;
            store_u32(zw, load_u32(zw) | uint32_t(zero - 1) << (bits * int(o % p)));
            for (int64_t k = 0; k < group; ++k) {
                const int64_t i = g * group + k;
                const auto code = uint32_t(gptq_code(x[k], f16_to_f32(h), zero, bits));
                uint8_t * qw = packed + size_t((i / p) * out + o) * 4;
                store_u32(qw, load_u32(qw) | code << (bits * int(i % p)));
            }
        }
    for (int64_t i = 0; i < in; ++i) store_u32(packed + g_idx_at() + size_t(i) * 4, uint32_t(i / group));
}

void GptqQuant::dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const {
    check(*this);
    MF_ASSERT(row0 >= 0 && nrows >= 0 && row0 + nrows <= out);
    const int p = per_word();
    const uint32_t mask = (1u << bits) - 1;
    const int64_t G = groups();
    std::vector<int32_t> gi(static_cast<size_t>(in));
    std::memcpy(gi.data(), packed + g_idx_at(), size_t(in) * 4);
    for (const int32_t g : gi) MF_ASSERT(g >= 0 && g < G && "g_idx out of range");
    // The tile's scales and zero points once, [row][group], then every code of a row.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nrows; ++r) {
        const int64_t o = row0 + r;
        std::vector<float> sc(static_cast<size_t>(G)), zero(static_cast<size_t>(G));
        for (int64_t g = 0; g < G; ++g) {
            uint16_t h;
            std::memcpy(&h, packed + scales_at() + size_t(g * out + o) * 2, 2);
            sc[size_t(g)] = f16_to_f32(h);
            const uint32_t z = (load_u32(packed + qzeros_at() + size_t(g * (out / p) + o / p) * 4) >> (bits * int(o % p))) & mask;
            zero[size_t(g)] = float(int32_t(z) + 1);
        }
        float * d = dst + r * in;
        for (int64_t k = 0; k < in / p; ++k) {
            const uint32_t word = load_u32(packed + size_t(k * out + o) * 4);
            for (int j = 0; j < p; ++j) {
                const int64_t i = k * p + j;
                const size_t g = size_t(gi[size_t(i)]);
                d[i] = sc[g] * (float((word >> (bits * j)) & mask) - zero[g]);
            }
        }
    }
}

}  // namespace memfit
