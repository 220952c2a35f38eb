// CPU kernels of LoRA's column slices: an adapter's output is added into (and its gradient read
// from) a slice of columns of a fused projection (e.g. the q, k or v part of qkv). Contracts are in
// kernels.h; each tensor has its own storage type (float, bf16_t, f16_t), loaded through to_f32,
// computed in fp32 and rounded once per store. Rows are parallel tasks (static schedule), so
// results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace memfit::cpu {

template <class O, class D>
void add_columns(O * out, const D * d, int64_t N, int64_t ldo, int64_t cols, int64_t col0, float scale) {
    MF_ASSERT(N >= 0 && cols >= 0 && col0 >= 0 && col0 + cols <= ldo);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        O * o = out + i * ldo + col0;
        const D * di = d + i * cols;
        for (int64_t j = 0; j < cols; ++j) o[j] = from_f32<O>(to_f32(o[j]) + scale * to_f32(di[j]));
    }
}

template <class D, class S>
void take_columns(D * d, const S * src, int64_t N, int64_t lds, int64_t cols, int64_t col0, float scale) {
    MF_ASSERT(N >= 0 && cols >= 0 && col0 >= 0 && col0 + cols <= lds);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        D * di = d + i * cols;
        const S * s = src + i * lds + col0;
        for (int64_t j = 0; j < cols; ++j) di[j] = from_f32<D>(scale * to_f32(s[j]));
    }
}

template <class W>
void dora_norm(float * norm, const W * w, bool in_out, int64_t ld, int64_t in, int64_t cols, int64_t col0,
               const float * a, const float * b, int64_t r, float scale) {
    MF_ASSERT(in > 0 && cols >= 0 && col0 >= 0 && r > 0);
#pragma omp parallel
    {
        std::vector<float> row(static_cast<size_t>(in));
#pragma omp for schedule(static)
        for (int64_t j = 0; j < cols; ++j) {
            for (int64_t i = 0; i < in; ++i) row[size_t(i)] = to_f32(in_out ? w[i * ld + col0 + j] : w[(col0 + j) * ld + i]);
            for (int64_t k = 0; k < r; ++k) {
                const float c = scale * b[j * r + k];
                const float * ak = a + k * in;
                for (int64_t i = 0; i < in; ++i) row[size_t(i)] += c * ak[i];
            }
            double sq = 0;
            for (int64_t i = 0; i < in; ++i) sq += double(row[size_t(i)]) * double(row[size_t(i)]);
            norm[j] = float(std::sqrt(sq));
        }
    }
}

template <class O, class Z>
void dora_scale_fwd(O * out, Z * z, const float * bias, const float * g, int64_t N, int64_t ldo, int64_t cols,
                    int64_t col0) {
    MF_ASSERT(N >= 0 && cols >= 0 && col0 >= 0 && col0 + cols <= ldo);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        O * o = out + i * ldo + col0;
        Z * zi = z + i * cols;
        for (int64_t j = 0; j < cols; ++j) {
            const float v = to_f32(o[j]) - bias[j];
            zi[j] = from_f32<Z>(v);
            o[j] = from_f32<O>(g[j] * v + bias[j]);
        }
    }
}

template <class D, class Z>
void dora_scale_bwd(D * dout, const Z * z, const float * g, float * acc, int64_t N, int64_t ldd, int64_t cols,
                    int64_t col0) {
    MF_ASSERT(N >= 0 && cols >= 0 && col0 >= 0 && col0 + cols <= ldd);
    constexpr int64_t kBlock = 64;   // columns per task: each row's part is one contiguous run
    const int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t j0 = blk * kBlock, j1 = std::min(cols, j0 + kBlock);
        float sum[kBlock] = {};
        for (int64_t i = 0; i < N; ++i) {
            D * d = dout + i * ldd + col0;
            const Z * zi = z + i * cols;
            for (int64_t j = j0; j < j1; ++j) {
                const float dv = to_f32(d[j]);
                sum[j - j0] += dv * to_f32(zi[j]);
                d[j] = from_f32<D>(g[j] * dv);
            }
        }
        for (int64_t j = j0; j < j1; ++j) acc[j] = sum[j - j0];
    }
}

template <class S>
void dropout(S * out, const S * in, size_t n, float p, uint64_t seed) {
    MF_ASSERT(p >= 0.0f && p < 1.0f);
    const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i)
        out[i] = from_f32<S>(dropout_keep(seed, i, p) ? to_f32(in[i]) * keep_scale : 0.0f);
}
template void dropout<float>(float *, const float *, size_t, float, uint64_t);
template void dropout<bf16_t>(bf16_t *, const bf16_t *, size_t, float, uint64_t);
template void dropout<f16_t>(f16_t *, const f16_t *, size_t, float, uint64_t);

#define MF_INST2(A, B)                                                                                   \
    template void add_columns<A, B>(A *, const B *, int64_t, int64_t, int64_t, int64_t, float);           \
    template void take_columns<A, B>(A *, const B *, int64_t, int64_t, int64_t, int64_t, float);          \
    template void dora_scale_fwd<A, B>(A *, B *, const float *, const float *, int64_t, int64_t, int64_t,   \
                                       int64_t);                                                          \
    template void dora_scale_bwd<A, B>(A *, const B *, const float *, float *, int64_t, int64_t, int64_t, \
                                       int64_t);
#define MF_INST(A)                                                                                       \
    MF_INST2(A, float)                                                                                   \
    MF_INST2(A, bf16_t)                                                                                  \
    MF_INST2(A, f16_t)                                                                                   \
    template void dora_norm<A>(float *, const A *, bool, int64_t, int64_t, int64_t, int64_t, const float *, \
                               const float *, int64_t, float);

MF_INST(float)
MF_INST(bf16_t)
MF_INST(f16_t)
#undef MF_INST
#undef MF_INST2

}  // namespace memfit::cpu
