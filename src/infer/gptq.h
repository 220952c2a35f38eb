// GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers"), the solver: one linear layer's weights W [out, in] quantized column
// by column, each column's rounding error spread over the columns not yet quantized through the
// inverse Hessian of the layer's inputs, H = 2 X X^T (X: the inputs [in, samples]).
//
// As the paper's Algorithm 1 and the published implementation compute it:
//   - dead inputs (H_ii = 0) get H_ii = 1 and their weights 0;
//   - act-order (desc_act): columns in order of decreasing H_ii, W and H permuted alike;
//   - dampening: H += damp * mean(diag H) * I;
//   - U = the upper Cholesky factor of H^-1 (H^-1 = U^T U); column j's error is
//     (w_j - q_j) / U_jj and the later columns take err * U_j,j+1..;
//   - lazy batches of `block` columns: updates inside the block at once, the rest of the matrix
//     once per block (the same arithmetic, fewer passes over W);
//   - a group's scale and zero point (min-max over its columns, symmetric or not) are fixed when
//     its first column is reached, from the columns as updated by then.
// memfit's choices where the published code leaves it open: the block is the group size when the
// group is a multiple of 128 (else 128, and the group divides it), so a group's columns are all
// current when its grid is set; the scale is rounded to fp16 before it is used, so the solver
// compensates the error of the grid the file stores; an asymmetric zero point is at least 1,
// because the v1 checkpoint format stores zero - 1 in `bits` bits.
//
// Round-to-nearest (rtn) is the same grid without the error compensation, GPTQ's baseline.
// The results are packed into backend/quant_format.h's gptq layout (GptqQuant).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/gptq_folder.h"   // GptqOptions

namespace memfit {


// One matrix's integer result, in the input order of W (act-order undone).
struct GptqCodes {
    int64_t out = 0, in = 0;
    int     bits = 4, group = 0;          // group: inputs per group (in, for a whole row)
    std::vector<uint8_t>  q;              // [out, in] codes 0 .. 2^bits - 1
    std::vector<uint16_t> scales;         // [groups, out] fp16 bits
    std::vector<int32_t>  zeros;          // [groups, out] 1 .. 2^bits - 1
    std::vector<int32_t>  g_idx;          // [in] the group of each input
    int64_t groups() const { return in / group; }
    // W' [out, in]: scale * (q - zero), the values the dequantizing kernels compute.
    std::vector<float> dequantize() const;
};

// H [in, in] (row-major, any positive multiple of X X^T) is modified (dead inputs, dampening,
// permutation); W [out, in]. ConfigError when H is not positive definite after dampening.
GptqCodes gptq_quantize(const float * W, int64_t out, int64_t in, std::vector<double> H, const GptqOptions & o);
GptqCodes rtn_quantize(const float * W, int64_t out, int64_t in, const GptqOptions & o);

// The QuantDesc of the gptq layout these options give a [out, in] matrix.
QuantDesc gptq_desc(int64_t out, int64_t in, const GptqOptions & o);
// Packed bytes in the gptq layout (quant_bytes(desc) of them) and back.
std::vector<uint8_t> pack_gptq(const GptqCodes & c);
GptqCodes unpack_gptq(const QuantDesc & q, const uint8_t * packed);

}  // namespace memfit
