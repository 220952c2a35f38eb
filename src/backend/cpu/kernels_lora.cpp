// CPU kernels of LoRA's column slices: an adapter's output is added into (and its gradient read
// from) a slice of columns of a fused projection (e.g. the q, k or v part of qkv). Contracts are in
// kernels.h; each tensor has its own storage type (float, bf16_t, f16_t), loaded through to_f32,
// computed in fp32 and rounded once per store. Rows are parallel tasks (static schedule), so
// results do not depend on the thread count.
#include <cstdint>

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

#define MF_INST2(A, B)                                                                         \
    template void add_columns<A, B>(A *, const B *, int64_t, int64_t, int64_t, int64_t, float); \
    template void take_columns<A, B>(A *, const B *, int64_t, int64_t, int64_t, int64_t, float);
#define MF_INST(A)       \
    MF_INST2(A, float)   \
    MF_INST2(A, bf16_t)  \
    MF_INST2(A, f16_t)

MF_INST(float)
MF_INST(bf16_t)
MF_INST(f16_t)
#undef MF_INST
#undef MF_INST2

}  // namespace memfit::cpu
