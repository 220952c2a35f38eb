// Bulk conversions between f32, bf16 and f16 storage (round to nearest even, core/dtype.h), for
// the tiles the mixed-precision kernels and gemms convert as they load and store. Vectorised
// (F16C for f16 where the compiler targets it, integer arithmetic otherwise); the whole-array and
// row-block versions run in parallel (OpenMP, static schedules).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/dtype.h"

namespace memfit::cpu {

// d[i] = float(s[i]), one row, no threads.
template <class S>
inline void to_f32_row(float * d, const S * s, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    if constexpr (std::is_same_v<S, f16_t>) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i))));
    }
#endif
#pragma omp simd
    for (size_t j = i; j < n; ++j) d[j] = to_f32(s[j]);
}

// d[i] = round(s[i]) (T's rounding; a copy for float), one row, no threads.
template <class T>
inline void from_f32_row(T * d, const float * s, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    if constexpr (std::is_same_v<T, f16_t>) {
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
#pragma omp simd
    for (size_t j = i; j < n; ++j) d[j] = from_f32<T>(s[j]);
}

// d[i] = round(d[i] + s[i]), one row, no threads.
template <class T>
inline void add_f32_row(T * d, const float * s, size_t n) {
#pragma omp simd
    for (size_t j = 0; j < n; ++j) d[j] = from_f32<T>(to_f32(d[j]) + s[j]);
}

// dst = src converted elementwise (n elements of dtypes dt and st: f32, bf16 or f16); a memcpy
// when the dtypes are equal. bf16 <-> f16 goes through f32 exactly (one rounding).
void convert(void * dst, DType dt, const void * src, DType st, size_t n);

// dst[r * cols + c] = float(src[r * lds + c]) for r < rows, c < cols (src elements of dtype st).
void load_rows(float * dst, const void * src, DType st, size_t lds, int64_t rows, int64_t cols);

// Each row of the f32 matrix x[rows, cols] rounded to bf16 in place, into the row's own first
// 2 * cols bytes: afterwards x's bytes are a bf16 matrix of row stride 2 * cols whose first cols
// columns hold the values (the LM head's logit gradients, Backend::round_bf16_rows).
void round_bf16_rows_in_place(float * x, int64_t rows, int64_t cols);
// One such row (serial: for a caller that already runs rows in parallel).
void round_bf16_row_in_place(float * row, int64_t cols);

// dst[r * ldd + c] = round((accumulate ? dst[r * ldd + c] : 0) + src[r * cols + c]), dst of
// dtype dt (for f32 and accumulate: one fp32 add, like the gemm's sum post-op).
void store_rows(void * dst, DType dt, size_t ldd, const float * src, int64_t rows, int64_t cols, bool accumulate);

}  // namespace memfit::cpu
