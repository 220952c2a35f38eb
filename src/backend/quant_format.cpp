// The packed frozen-weight formats: int8 per-channel absmax, NF4 with optional double
// quantization (the layouts: quant_format.h). Host code, shared by the CPU and CUDA backends.
#include "backend/quant_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace memfit {

namespace {

float load_f32(const uint8_t * p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
void store_f32(uint8_t * p, float v) { std::memcpy(p, &v, sizeof v); }

// Byte offsets of the NF4 regions.
struct Nf4Layout {
    int64_t n = 0, nb = 0, ns = 0;   // elements, 64-blocks, 256-blocks of absmaxes
    size_t codes = 0, absmax = 0;    // absmax: fp32 (plain) or int8 (double quant)
    size_t scale2 = 0, mean = 0;     // double quant only
};

Nf4Layout nf4_layout(int64_t n) {
    MF_ASSERT(n > 0 && n % kNf4Block == 0);
    Nf4Layout l;
    l.n = n;
    l.nb = n / kNf4Block;
    l.ns = (l.nb + kNf4ScaleBlock - 1) / kNf4ScaleBlock;
    l.codes = 0;
    l.absmax = size_t(n / 2);
    l.scale2 = l.absmax + size_t(l.nb);
    l.mean = l.scale2 + size_t(l.ns) * sizeof(float);
    return l;
}

// The absmax of block b as the dequantizer sees it.
float nf4_absmax(const uint8_t * packed, const Nf4Layout & l, bool dq, int64_t b) {
    if (!dq) return load_f32(packed + l.absmax + size_t(b) * sizeof(float));
    const auto q = static_cast<int8_t>(packed[l.absmax + size_t(b)]);
    const float s = load_f32(packed + l.scale2 + size_t(b / kNf4ScaleBlock) * sizeof(float));
    return float(q) * s + load_f32(packed + l.mean);
}

float block_absmax(const float * x) {
    float m = 0.0f;
    for (int64_t i = 0; i < kNf4Block; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

}  // namespace

// The sizes are quant_bytes()'s (the formula the engine and the planner use); the layouts above
// must end exactly there.
size_t int8_bytes(int64_t out, int64_t in) {
    MF_ASSERT(out > 0 && in > 0);
    const size_t bytes = quant_bytes(QuantDesc{QuantFormat::int8, out, in});
    MF_ASSERT(bytes == size_t(out) * size_t(in) + size_t(out) * sizeof(float));
    return bytes;
}

size_t nf4_bytes(int64_t n, bool double_quant) {
    const Nf4Layout l = nf4_layout(n);
    const size_t bytes = quant_bytes(QuantDesc{double_quant ? QuantFormat::nf4_dq : QuantFormat::nf4, 1, n});
    MF_ASSERT(bytes == (double_quant ? l.mean + sizeof(float) : l.absmax + size_t(l.nb) * sizeof(float)));
    return bytes;
}

uint8_t nf4_code(float v) {
    // Count the midpoints between consecutive levels that lie below v.
    uint8_t c = 0;
    for (int i = 0; i < 15; ++i)
        if (v > 0.5f * (kNf4Levels[i] + kNf4Levels[i + 1])) c = uint8_t(i + 1);
    return c;
}

// ---- int8 -------------------------------------------------------------------------------

void Int8Quant::quantize(uint8_t * packed, const float * W) const {
    uint8_t * scales = packed + size_t(out) * size_t(in);
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
        const float * w = W + o * in;
        float m = 0.0f;
        for (int64_t k = 0; k < in; ++k) m = std::max(m, std::fabs(w[k]));
        const float scale = m / 127.0f;
        store_f32(scales + size_t(o) * sizeof(float), scale);
        int8_t * q = reinterpret_cast<int8_t *>(packed) + o * in;
        for (int64_t k = 0; k < in; ++k) {
            const float r = scale > 0.0f ? std::round(w[k] / scale) : 0.0f;
            q[k] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
        }
    }
}

void Int8Quant::dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const {
    MF_ASSERT(row0 >= 0 && nrows >= 0 && row0 + nrows <= out);
    const uint8_t * scales = packed + size_t(out) * size_t(in);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nrows; ++r) {
        const float scale = load_f32(scales + size_t(row0 + r) * sizeof(float));
        const int8_t * q = reinterpret_cast<const int8_t *>(packed) + (row0 + r) * in;
        float * d = dst + r * in;
        for (int64_t k = 0; k < in; ++k) d[k] = float(q[k]) * scale;
    }
}

// ---- NF4 --------------------------------------------------------------------------------

void Nf4Quant::quantize(uint8_t * packed, const float * W) const {
    const Nf4Layout l = nf4_layout(out * in);
    if (!double_quant) {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < l.nb; ++b)
            store_f32(packed + l.absmax + size_t(b) * sizeof(float), block_absmax(W + b * kNf4Block));
    } else {
        // The fp32 absmaxes are staged in the codes region (n/2 bytes >= n/16 needed) until
        // they are quantized; the codes overwrite them afterwards.
        uint8_t * stage = packed + l.codes;
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < l.nb; ++b)
            store_f32(stage + size_t(b) * sizeof(float), block_absmax(W + b * kNf4Block));
        double sum = 0.0;  // serial: deterministic
        for (int64_t b = 0; b < l.nb; ++b) sum += double(load_f32(stage + size_t(b) * sizeof(float)));
        const float mean = float(sum / double(l.nb));
        store_f32(packed + l.mean, mean);
#pragma omp parallel for schedule(static)
        for (int64_t s = 0; s < l.ns; ++s) {
            const int64_t b0 = s * kNf4ScaleBlock, b1 = std::min(l.nb, b0 + kNf4ScaleBlock);
            float m = 0.0f;
            for (int64_t b = b0; b < b1; ++b)
                m = std::max(m, std::fabs(load_f32(stage + size_t(b) * sizeof(float)) - mean));
            const float scale = m / 127.0f;
            store_f32(packed + l.scale2 + size_t(s) * sizeof(float), scale);
            for (int64_t b = b0; b < b1; ++b) {
                const float d = load_f32(stage + size_t(b) * sizeof(float)) - mean;
                const float r = scale > 0.0f ? std::clamp(std::round(d / scale), -127.0f, 127.0f) : 0.0f;
                packed[l.absmax + size_t(b)] = static_cast<uint8_t>(static_cast<int8_t>(r));
            }
        }
    }
    // Codes against the absmax the dequantizer will use.
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < l.nb; ++b) {
        const float a = nf4_absmax(packed, l, double_quant, b);
        const float * x = W + b * kNf4Block;
        uint8_t * c = packed + l.codes + size_t(b * kNf4Block / 2);
        for (int64_t j = 0; j < kNf4Block / 2; ++j) {
            const uint8_t lo = nf4_code(a > 0.0f ? x[2 * j] / a : 0.0f);
            const uint8_t hi = nf4_code(a > 0.0f ? x[2 * j + 1] / a : 0.0f);
            c[j] = uint8_t(lo | hi << 4);
        }
    }
}

void Nf4Quant::dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const {
    MF_ASSERT(row0 >= 0 && nrows >= 0 && row0 + nrows <= out);
    if (nrows == 0) return;
    const Nf4Layout l = nf4_layout(out * in);
    const int64_t e0 = row0 * in, e1 = (row0 + nrows) * in;
    const int64_t b0 = e0 / kNf4Block, b1 = (e1 - 1) / kNf4Block + 1;
#pragma omp parallel for schedule(static)
    for (int64_t b = b0; b < b1; ++b) {
        const float a = nf4_absmax(packed, l, double_quant, b);
        const int64_t i0 = std::max(e0, b * kNf4Block), i1 = std::min(e1, (b + 1) * kNf4Block);
        for (int64_t i = i0; i < i1; ++i) {
            const uint8_t byte = packed[l.codes + size_t(i >> 1)];
            const uint8_t code = (i & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 15);
            dst[i - e0] = kNf4Levels[code] * a;
        }
    }
}

}  // namespace memfit
