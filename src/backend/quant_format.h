// The packed frozen-weight formats (QuantFormat, backend/backend.h) for QLoRA-style fine-tuning:
// their exact byte counts, shared by the engine, which declares the packed buffers, and the
// planner, which predicts them; and the host code that packs and unpacks them, shared by the CPU
// backend (backend/cpu/quant.h: the dequantizing matmuls) and the CUDA backend (which packs on the
// host and dequantizes on the device, backend/cuda/kernels_quant.cu).
//
// The base weights W [out, in] (row = output channel, the LLaMA layout) are stored packed in
// caller-provided buffers of exactly *_bytes() bytes.
//
// Formats (all multi-byte fields are stored unaligned, read and written through memcpy):
//   int8, per output channel absmax:  [q: out*in int8][scale: out fp32]
//       scale[o] = max|W[o,:]| / 127, q = round(W / scale) clamped to [-127, 127], W' = q * scale.
//   NF4 (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", sec. 3):
//       blocks of 64 consecutive elements of the flattened row-major W, absmax per block; each
//       element gets the code of the nearest of the 16 NormalFloat levels (kNf4Levels) to
//       x / absmax; two codes per byte (element 2j in the low nibble of byte j, 2j+1 in the high).
//       W' = level[code] * absmax.
//     without double quantization: [codes: n/2][absmax: n/64 fp32]
//     with double quantization (the paper's "Double Quantization", simplified to a symmetric
//       int8 absmax quantizer; the paper uses 8-bit floats): the block absmaxes c2 have their
//       mean subtracted and are quantized to int8 in blocks of 256 with one fp32 scale per
//       256-block: s = max|c2 - mean| / 127, q = round((c2 - mean) / s), c2' = q * s + mean.
//       The codes are chosen against the reconstructed c2' (the absmax the dequantizer uses).
//       [codes: n/2][q: n/64 int8][s: ceil(n/64/256) fp32][mean: fp32]
//     n = out*in must be a multiple of 64 (aborts otherwise); rows need not align with blocks.
//   sparse24, 2:4 structured sparsity (NVIDIA's sparse tensor cores' pattern; model/sparsity.h
//       trains it): each group of 4 consecutive inputs of a row keeps its 2 largest |w| (ties: the
//       lower index), in index order, as bf16 (round to nearest even), with their positions
//       (0..3) as two 2-bit fields: first | second << 2, one nibble per group, group 2j in the low
//       nibble of byte j. Packing a 2:4 weight loses only the bf16 rounding.
//       [values: n/2 bf16 (group g's at 2g, 2g+1)][positions: n/8]
//     in must be a multiple of 4 and n of 8 (aborts otherwise).
//   gptq, the GPTQ checkpoint format's tensors of one linear layer (Frantar et al. 2022; the v1
//       layout AutoGPTQ writes, what a Hub folder holds under quant_method "gptq"), concatenated:
//       [qweight: in/p x out int32][qzeros: G x out/p int32][scales: G x out fp16][g_idx: in int32]
//       p = 32/bits codes per int32, G = in/group groups. qweight[r][o] holds the codes of inputs
//       p r .. p r + p - 1 of output o, input p r + j in bits j*bits; qzeros[g][c] the zero points
//       of outputs p c .. p c + p - 1 of group g the same way, each stored minus one; g_idx[i] is
//       input i's group (i / group, or act-order's). W'[o, i] = scale[g][o] * (code - zero),
//       g = g_idx[i], the fp16 scale widened to fp32 and multiplied once.
//     in and out must be multiples of p and in of group (aborts otherwise).
// In bytes:
//   int8    per output channel absmax: out*in int8 codes + out fp32 scales
//   nf4     4-bit NormalFloat, absmax per block of 64: n/2 code bytes + n/64 fp32 absmaxes
//   nf4_dq  nf4 with the absmaxes quantized again (int8, blocks of 256, one fp32 scale each, plus
//           one fp32 mean): n/2 + n/64 + 4*ceil(n/64/256) + 4
//   sparse24  n bytes of bf16 values + n/8 of positions: 9/16 = 0.5625 of bf16's 2n
//   gptq    n*bits/8 codes + G*out*bits/8 zeros + 2*G*out scales + 4*in group indices (4-bit,
//           groups of 128: 0.2603 of bf16's 2n for a 4096 x 4096 matrix)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"

namespace memfit {

// Dettmers et al. 2023 (QLoRA), appendix E: the NF4 data type's values, ascending; code = index.
inline constexpr float kNf4Levels[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};
constexpr int64_t kNf4Block = 64;          // elements per absmax block
constexpr int64_t kNf4ScaleBlock = 256;    // absmaxes per second-level block (double quant)

constexpr size_t quant_bytes(const QuantDesc & q) {
    const size_t n = size_t(q.out) * size_t(q.in);
    switch (q.format) {
        case QuantFormat::int8: return n + size_t(q.out) * 4;
        case QuantFormat::nf4: return n / 2 + n / 64 * 4;
        case QuantFormat::nf4_dq: return n / 2 + n / 64 + 4 * ((n / 64 + 255) / 256) + 4;
        case QuantFormat::sparse24: return n + n / 8;
        case QuantFormat::gptq: {
            const size_t groups = q.group > 0 ? size_t(q.in) / size_t(q.group) : 0;
            const size_t zs = groups * size_t(q.out);
            return n * size_t(q.bits) / 8 + zs * size_t(q.bits) / 8 + zs * 2 + size_t(q.in) * 4;
        }
    }
    return 0;
}

inline const char * quant_format_name(QuantFormat f) {
    switch (f) {
        case QuantFormat::int8: return "int8";
        case QuantFormat::nf4: return "nf4";
        case QuantFormat::nf4_dq: return "nf4+dq";
        case QuantFormat::sparse24: return "sparse24";
        case QuantFormat::gptq: return "gptq";
    }
    return "?";
}

// Exact packed sizes in bytes (quant_bytes()'s formula, checked against the layouts).
size_t int8_bytes(int64_t out, int64_t in);
size_t nf4_bytes(int64_t n, bool double_quant);
size_t sparse24_bytes(int64_t out, int64_t in);
// ConfigError naming `what` unless a gptq matrix of this shape can be stored: bits 4 or 8, in and
// out multiples of 32/bits, group a divisor of in.
void check_gptq_shape(const QuantDesc & q, const std::string & what);

// Magnitude pruning's choice within one group of m values x[0], x[stride], .., x[(m-1)*stride]:
// keep[j] for the n largest |x| (ties: the lower index). One rule for the N:M pruner
// (model/sparsity.h) and the sparse24 packer, so packing a pruned weight keeps what pruning kept.
inline void nm_keep(const float * x, size_t stride, int n, int m, bool * keep) {
    for (int j = 0; j < m; ++j) {
        const float a = std::fabs(x[size_t(j) * stride]);
        int beaten = 0;   // others that come first: larger, or as large at a lower index
        for (int k = 0; k < m; ++k) {
            const float b = std::fabs(x[size_t(k) * stride]);
            beaten += b > a || (b == a && k < j);
        }
        keep[j] = beaten < n;
    }
}

// The index of the NF4 level nearest to v (v in [-1, 1]; values beyond are clamped).
uint8_t nf4_code(float v);

// A quantized weight format. The struct carries the shape; the packed bytes live in the
// caller's buffer (bytes() long).
struct Int8Quant {
    int64_t out = 0, in = 0;
    size_t bytes() const { return int8_bytes(out, in); }
    void quantize(uint8_t * packed, const float * W) const;
    // dst[nrows, in] = rows row0 .. row0+nrows-1 of the dequantized W.
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

struct Nf4Quant {
    int64_t out = 0, in = 0;
    bool double_quant = false;
    size_t bytes() const { return nf4_bytes(out * in, double_quant); }
    void quantize(uint8_t * packed, const float * W) const;
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

struct Sparse24Quant {
    int64_t out = 0, in = 0;
    size_t bytes() const { return sparse24_bytes(out, in); }
    void quantize(uint8_t * packed, const float * W) const;
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

// GPTQ's quantizer grid for values in [lo, hi] (a group of one row, as the published code sets
// it): the range widened to hold 0; symmetric: [-m, m] for m = max(|lo|, hi) when lo < 0, the zero
// point in the middle ((maxq + 1) / 2); asymmetric: zero = round(-lo / scale), at least 1 (the v1
// format stores zero - 1). The scale is rounded to fp16, as the file stores it (at least fp16's
// smallest step), and used so. Returns the fp16 scale's bits.
inline uint16_t gptq_grid(double lo, double hi, int bits, bool sym, int * zero) {
    const int maxq = (1 << bits) - 1;
    lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
    if (sym) {
        hi = std::max(std::fabs(lo), hi);
        if (lo < 0) lo = -hi;
    }
    if (lo == 0 && hi == 0) lo = -1, hi = 1;
    uint16_t h = f32_to_f16(float((hi - lo) / maxq));
    if (f16_to_f32(h) <= 0) h = 1;   // below fp16's smallest step
    const double scale = f16_to_f32(h);
    *zero = sym ? (maxq + 1) / 2 : int(std::clamp(std::nearbyint(-lo / scale), 1.0, double(maxq)));
    return h;
}
// A value's code on that grid: clamp(round(x / scale) + zero, 0, maxq).
inline int gptq_code(double x, double scale, int zero, int bits) {
    return int(std::clamp(std::nearbyint(x / scale) + zero, 0.0, double((1 << bits) - 1)));
}

// GPTQ's layout (above): bits, group and act-order's g_idx as the file holds them. quantize() is
// round-to-nearest (RTN) on gptq_grid's symmetric groups in input order, GPTQ's baseline; the GPTQ solver
// itself (infer/gptq.h) writes the same layout from its own codes.
struct GptqQuant {
    int64_t out = 0, in = 0;
    int bits = 4, group = 128;
    int per_word() const { return 32 / bits; }
    int64_t groups() const { return in / group; }
    // Byte offsets of the four tensors.
    size_t qzeros_at() const { return size_t(in) * size_t(out) * size_t(bits) / 8; }
    size_t scales_at() const { return qzeros_at() + size_t(groups()) * size_t(out) * size_t(bits) / 8; }
    size_t g_idx_at() const { return scales_at() + size_t(groups()) * size_t(out) * 2; }
    size_t bytes() const { return g_idx_at() + size_t(in) * 4; }
    void quantize(uint8_t * packed, const float * W) const;
    void dequantize_rows(float * dst, const uint8_t * packed, int64_t row0, int64_t nrows) const;
};

// f(Q) with Q the format struct of q: the one dispatch of every backend's host code.
template <class F>
void with_quant(const QuantDesc & q, F && f) {
    switch (q.format) {
        case QuantFormat::int8: f(Int8Quant{q.out, q.in}); return;
        case QuantFormat::nf4: f(Nf4Quant{q.out, q.in, false}); return;
        case QuantFormat::nf4_dq: f(Nf4Quant{q.out, q.in, true}); return;
        case QuantFormat::sparse24: f(Sparse24Quant{q.out, q.in}); return;
        case QuantFormat::gptq: f(GptqQuant{q.out, q.in, q.bits, q.group}); return;
    }
    MF_UNREACHABLE();
}

}  // namespace memfit
