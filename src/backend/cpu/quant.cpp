// The dequantizing matmuls over the packed frozen weights (the formats and their quantizer:
// backend/quant_format.cpp).
#include "backend/cpu/quant.h"

#include <algorithm>

#include "backend/quant_format.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

// ---- dequantizing matmuls ---------------------------------------------------------------

namespace {

MatmulShape forward_shape(int64_t M, int64_t out, int64_t in, int64_t rows) {
    MatmulShape s;  // Y[:, o0:o0+rows] = X[M,in] · tile[rows,in]^T
    s.M = M, s.N = rows, s.K = in;
    s.a_sm = in, s.a_sk = 1;
    s.b_sk = 1, s.b_sn = in;
    s.ldc = out;
    return s;
}

MatmulShape backward_shape(int64_t M, int64_t out, int64_t in, int64_t rows, bool accumulate) {
    MatmulShape s;  // dX[M,in] (+)= dY[:, o0:o0+rows] · tile[rows,in]
    s.M = M, s.N = in, s.K = rows;
    s.a_sm = out, s.a_sk = 1;
    s.b_sk = in, s.b_sn = 1;
    s.ldc = in;
    s.accumulate = accumulate;
    return s;
}

}  // namespace

size_t gemm_dequant_workspace(DnnlGemm & gemm, int64_t M, int64_t out, int64_t in, int64_t tile_rows) {
    MF_ASSERT(M > 0 && out > 0 && in > 0 && tile_rows > 0);
    const int64_t t = std::min(tile_rows, out);
    const int64_t last = out - (out - 1) / t * t;
    size_t scratch = 0;
    for (const int64_t rows : {t, last}) {
        scratch = std::max(scratch, gemm.scratch_bytes(forward_shape(M, out, in, rows)));
        for (const bool acc : {false, true})
            scratch = std::max(scratch, gemm.scratch_bytes(backward_shape(M, out, in, rows, acc)));
    }
    return align_up(size_t(t) * size_t(in) * sizeof(float)) + scratch;
}

namespace {
// Dequantizes W tile by tile (tile_rows output rows) into the workspace's fp32 tile and hands
// each to f(first row, rows, tile, oneDNN scratch after the tile).
template <class Q, class F>
void for_each_tile(const Q & q, const uint8_t * packed, int64_t tile_rows, void * workspace, F && f) {
    MF_ASSERT(packed != nullptr && workspace != nullptr);
    const int64_t t = std::min(tile_rows, q.out);
    float * tile = static_cast<float *>(workspace);
    void * scratch = static_cast<char *>(workspace) + align_up(size_t(t) * size_t(q.in) * sizeof(float));
    for (int64_t o0 = 0; o0 < q.out; o0 += t) {
        const int64_t rows = std::min(t, q.out - o0);
        q.dequantize_rows(tile, packed, o0, rows);
        f(o0, rows, tile, scratch);
    }
}
}  // namespace

template <class Q>
void gemm_dequant_forward(DnnlGemm & gemm, float * Y, const float * X, const Q & q, const uint8_t * packed,
                          int64_t M, int64_t tile_rows, void * workspace) {
    MF_ASSERT(Y != nullptr && X != nullptr);
    for_each_tile(q, packed, tile_rows, workspace, [&](int64_t o0, int64_t rows, const float * tile, void * scratch) {
        gemm.run(forward_shape(M, q.out, q.in, rows), Y + o0, X, tile, nullptr, scratch);
    });
}

template <class Q>
void gemm_dequant_backward(DnnlGemm & gemm, float * dX, const float * dY, const Q & q, const uint8_t * packed,
                           int64_t M, int64_t tile_rows, void * workspace, bool accumulate) {
    MF_ASSERT(dX != nullptr && dY != nullptr);
    for_each_tile(q, packed, tile_rows, workspace, [&](int64_t o0, int64_t rows, const float * tile, void * scratch) {
        gemm.run(backward_shape(M, q.out, q.in, rows, accumulate || o0 > 0), dX, dY + o0, tile, nullptr, scratch);
    });
}

#define MF_INST_DEQUANT(Q)                                                                                       \
    template void gemm_dequant_forward<Q>(DnnlGemm &, float *, const float *, const Q &, const uint8_t *, int64_t, \
                                          int64_t, void *);                                                      \
    template void gemm_dequant_backward<Q>(DnnlGemm &, float *, const float *, const Q &, const uint8_t *,        \
                                           int64_t, int64_t, void *, bool);
MF_INST_DEQUANT(Int8Quant)
MF_INST_DEQUANT(Nf4Quant)
MF_INST_DEQUANT(Sparse24Quant)
MF_INST_DEQUANT(GptqQuant)
#undef MF_INST_DEQUANT

}  // namespace memfit::cpu
