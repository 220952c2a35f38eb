// The CPU backend's quantized gemms (QLoRA's frozen base, Backend::qgemm_*): the packed formats
// are quant_format.h's and the fp32 dequantizing matmuls quant.h's; this file adapts them to the
// activation dtypes.
//
//   f32 activations:      quant.h's fp32 gemms run on the caller's buffers (all M rows at once).
//   bf16/f16 activations: M is processed kQgemmRowChunk rows at a time: the chunk of x (dy) is
//                         converted to fp32 in the workspace, the fp32 dequantizing gemm writes the
//                         chunk of y (dx) in fp32, and that is rounded once into y (+ bias) or dx
//                         (written, or added when accumulating).
// Either way W is dequantized tile_rows output rows at a time (qgemm_tile_rows), never whole.
//
// Workspace (each region 64-byte aligned), c = min(M, kQgemmRowChunk):
//   f32:       [gemm_dequant_workspace(M)]
//   bf16/f16:  [fp32 c x in: x chunk (fwd) / dx chunk (bwd)][fp32 c x out: y chunk / dy chunk]
//              [gemm_dequant_workspace: the larger of a full chunk's and the last chunk's]
// Deterministic: fixed chunk and tile sizes, static OpenMP schedules, no atomics.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "backend/quant_format.h"
#include "core/error.h"

namespace memfit {

namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// The chunking of M rows of bf16/f16 activations.
struct Chunks {
    int64_t rows = 0, last = 0;   // rows per chunk; rows of the last chunk
    size_t  off_y = 0, off_gemm = 0;  // byte offsets of the c x out region and of the gemm's workspace
};

Chunks chunks_of(const QuantDesc & q, int64_t M) {
    Chunks c;
    c.rows = std::min(M, cpu::kQgemmRowChunk);
    c.last = M - (M - 1) / c.rows * c.rows;
    c.off_y = align_up(size_t(c.rows) * size_t(q.in) * sizeof(float));
    c.off_gemm = c.off_y + align_up(size_t(c.rows) * size_t(q.out) * sizeof(float));
    return c;
}

// y[r, :] += bias for rows r < rows of the fp32 y[rows, cols] (bias of dtype bt).
void add_bias_rows(float * y, const void * bias, DType bt, int64_t rows, int64_t cols) {
    auto run = [&](const auto * b) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float * yr = y + r * cols;
            for (int64_t j = 0; j < cols; ++j) yr[j] += to_f32(b[j]);
        }
    };
    switch (bt) {
        case DType::f32: run(static_cast<const float *>(bias)); return;
        case DType::bf16: run(static_cast<const bf16_t *>(bias)); return;
        case DType::f16: run(static_cast<const f16_t *>(bias)); return;
        default: MF_ASSERT(!"qgemm bias: not a float dtype");
    }
}

// Checks the operands of one qgemm call: a[M, a_cols] and b[M, b_cols] of one float dtype, the
// packed weight and a workspace of at least `need` bytes.
void check_operands(const QuantDesc & q, const Tensor & a, int64_t a_cols, const Tensor & b, int64_t b_cols,
                    const Tensor & packed, const Tensor & workspace, size_t need) {
    MF_ASSERT(is_float(a.dtype) && b.dtype == a.dtype);
    MF_ASSERT(a.valid() && b.valid() && a.cols() == a_cols && b.cols() == b_cols && a.rows() == b.rows());
    MF_ASSERT(a.data != nullptr && b.data != nullptr);
    MF_ASSERT(packed.valid() && packed.data != nullptr && packed.nbytes() >= quant_bytes(q));
    MF_ASSERT(need == 0 || (workspace.valid() && workspace.data != nullptr && workspace.nbytes() >= need));
}

}  // namespace

namespace cpu {

// Activation rows per chunk (bf16/f16), kQgemmRowChunk = 128 (quant.h): each chunk dequantizes
// all of W again, so a chunk amortises the dequantization over 128 rows of gemm work (256 flops
// per weight; NF4's dequantization measured a fifth to a quarter of the gemm's time at
// 4096 x 4096). Its two fp32 chunks cost 4 * 128 * (in + out) bytes of workspace (4 MiB for
// in = out = 4096). 256 rows halve the dequantization overhead but made the backward slower in
// our measurements (its fp32 dx chunk outgrows the cache).
//
// The fp32 weight tile: about kTileBytes (a core's L2), but at least kMinTileRows rows: the tile's
// rows are the backward gemm's K, and every tile reads and writes the whole fp32 dx chunk, so
// thin tiles make the backward memory-bound (16-row tiles ran it at half the speed of 64-row ones).
constexpr size_t kTileBytes = size_t{512} << 10;
constexpr int64_t kMinTileRows = 64;

int64_t qgemm_tile_rows(int64_t out, int64_t in) {
    MF_ASSERT(out > 0 && in > 0);
    const auto rows = int64_t(kTileBytes / (sizeof(float) * size_t(in)));
    return std::min(out, std::max(kMinTileRows, rows));
}

}  // namespace cpu

size_t CpuBackend::qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const {
    MF_ASSERT(q.out > 0 && q.in > 0 && M >= 0 && is_float(act));
    if (M == 0) return 0;
    const int64_t tile = cpu::qgemm_tile_rows(q.out, q.in);
    if (act == DType::f32) return cpu::gemm_dequant_workspace(gemm_, M, q.out, q.in, tile);
    const Chunks c = chunks_of(q, M);
    return c.off_gemm + std::max(cpu::gemm_dequant_workspace(gemm_, c.rows, q.out, q.in, tile),
                                 cpu::gemm_dequant_workspace(gemm_, c.last, q.out, q.in, tile));
}

void CpuBackend::qgemm_fwd(const QuantDesc & q, Tensor y, Tensor x, Tensor packed, Tensor bias, Tensor workspace) {
    const int64_t M = x.rows();
    const size_t need = qgemm_workspace(q, M, x.dtype);
    check_operands(q, x, q.in, y, q.out, packed, workspace, need);
    if (bias.valid()) MF_ASSERT(bias.dtype == y.dtype && bias.numel() == q.out && bias.data != nullptr);
    if (M == 0) return;
    const int64_t tile = cpu::qgemm_tile_rows(q.out, q.in);
    const auto * w = static_cast<const uint8_t *>(packed.data);
    char * ws = static_cast<char *>(workspace.data);

    with_quant(q, [&](const auto & Q) {
        if (x.dtype == DType::f32) {
            cpu::gemm_dequant_forward(gemm_, y.f32(), x.f32(), Q, w, M, tile, ws);
            if (bias.valid()) add_bias_rows(y.f32(), bias.data, bias.dtype, M, q.out);
            return;
        }
        const Chunks c = chunks_of(q, M);
        auto * xc = reinterpret_cast<float *>(ws);
        auto * yc = reinterpret_cast<float *>(ws + c.off_y);
        const size_t es = dtype_size(x.dtype);
        for (int64_t m0 = 0; m0 < M; m0 += c.rows) {
            const int64_t rows = std::min(c.rows, M - m0);
            cpu::load_rows(xc, static_cast<const char *>(x.data) + size_t(m0 * q.in) * es, x.dtype, size_t(q.in),
                           rows, q.in);
            cpu::gemm_dequant_forward(gemm_, yc, xc, Q, w, rows, tile, ws + c.off_gemm);
            if (bias.valid()) add_bias_rows(yc, bias.data, bias.dtype, rows, q.out);
            cpu::store_rows(static_cast<char *>(y.data) + size_t(m0 * q.out) * es, y.dtype, size_t(q.out), yc, rows,
                            q.out, false);
        }
    });
}

void CpuBackend::qgemm_bwd(const QuantDesc & q, Tensor dx, Tensor dy, Tensor packed, bool accumulate,
                           Tensor workspace) {
    const int64_t M = dy.rows();
    const size_t need = qgemm_workspace(q, M, dy.dtype);
    check_operands(q, dy, q.out, dx, q.in, packed, workspace, need);
    if (M == 0) return;
    const int64_t tile = cpu::qgemm_tile_rows(q.out, q.in);
    const auto * w = static_cast<const uint8_t *>(packed.data);
    char * ws = static_cast<char *>(workspace.data);

    with_quant(q, [&](const auto & Q) {
        if (dy.dtype == DType::f32) {
            cpu::gemm_dequant_backward(gemm_, dx.f32(), dy.f32(), Q, w, M, tile, ws, accumulate);
            return;
        }
        const Chunks c = chunks_of(q, M);
        auto * dxc = reinterpret_cast<float *>(ws);
        auto * dyc = reinterpret_cast<float *>(ws + c.off_y);
        const size_t es = dtype_size(dy.dtype);
        for (int64_t m0 = 0; m0 < M; m0 += c.rows) {
            const int64_t rows = std::min(c.rows, M - m0);
            cpu::load_rows(dyc, static_cast<const char *>(dy.data) + size_t(m0 * q.out) * es, dy.dtype,
                           size_t(q.out), rows, q.out);
            cpu::gemm_dequant_backward(gemm_, dxc, dyc, Q, w, rows, tile, ws + c.off_gemm, false);
            cpu::store_rows(static_cast<char *>(dx.data) + size_t(m0 * q.in) * es, dx.dtype, size_t(q.in), dxc, rows,
                            q.in, accumulate);
        }
    });
}

void CpuBackend::quantize(const QuantDesc & q, void * packed, const float * W) const {
    MF_ASSERT(packed != nullptr && W != nullptr);
    with_quant(q, [&](const auto & Q) { Q.quantize(static_cast<uint8_t *>(packed), W); });
}

void CpuBackend::dequantize(const QuantDesc & q, float * W, const void * packed) const {
    MF_ASSERT(packed != nullptr && W != nullptr);
    with_quant(q, [&](const auto & Q) { Q.dequantize_rows(W, static_cast<const uint8_t *>(packed), 0, q.out); });
}

}  // namespace memfit
