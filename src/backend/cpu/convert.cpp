#include "backend/cpu/convert.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/dispatch.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

constexpr size_t kChunk = size_t{1} << 15;   // elements per task of convert()
constexpr size_t kSerialBelow = size_t{1} << 14;  // elements (per call) not worth a parallel region

template <class D, class S>
void convert_row(D * d, const S * s, size_t n) {
    if constexpr (std::is_same_v<D, S>) {
        std::memcpy(d, s, n * sizeof(S));
    } else if constexpr (std::is_same_v<D, float>) {
        to_f32_row(d, s, n);
    } else if constexpr (std::is_same_v<S, float>) {
        from_f32_row(d, s, n);
    } else {  // bf16 <-> f16 through a small f32 buffer
        float buf[256];
        for (size_t i = 0; i < n; i += 256) {
            const size_t m = std::min<size_t>(256, n - i);
            to_f32_row(buf, s + i, m);
            from_f32_row(d + i, buf, m);
        }
    }
}

}  // namespace

void convert(void * dst, DType dt, const void * src, DType st, size_t n) {
    dispatch(dt, [&](auto dz) {
        dispatch(st, [&](auto sz) {
            using D = decltype(dz);
            using S = decltype(sz);
            D * d = static_cast<D *>(dst);
            const S * s = static_cast<const S *>(src);
            const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kSerialBelow)
            for (size_t k = 0; k < chunks; ++k) {
                const size_t lo = k * kChunk;
                convert_row(d + lo, s + lo, std::min(kChunk, n - lo));
            }
        });
    });
}

void load_rows(float * dst, const void * src, DType st, size_t lds, int64_t rows, int64_t cols) {
    dispatch(st, [&](auto sz) {
        using S = decltype(sz);
        const S * s = static_cast<const S *>(src);
#pragma omp parallel for schedule(static) if (size_t(rows * cols) >= kSerialBelow)
        for (int64_t r = 0; r < rows; ++r) to_f32_row(dst + r * cols, s + size_t(r) * lds, size_t(cols));
    });
}

void round_bf16_row_in_place(float * row, int64_t cols) {
    constexpr int64_t kBlock = 256;
    bf16_t * d = reinterpret_cast<bf16_t *>(row);
    // Through a block on the stack: block j's bf16 bytes end before block j + 1's floats begin,
    // so no value is overwritten before it is read, whatever the compiler reorders.
    bf16_t tmp[kBlock];
    for (int64_t j = 0; j < cols; j += kBlock) {
        const int64_t n = std::min(kBlock, cols - j);
        from_f32_row(tmp, row + j, size_t(n));
        std::memcpy(d + j, tmp, size_t(n) * sizeof(bf16_t));
    }
}

void round_bf16_rows_in_place(float * x, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (size_t(rows * cols) >= kSerialBelow)
    for (int64_t r = 0; r < rows; ++r) round_bf16_row_in_place(x + r * cols, cols);
}

void store_rows(void * dst, DType dt, size_t ldd, const float * src, int64_t rows, int64_t cols, bool accumulate) {
    dispatch(dt, [&](auto dz) {
        using D = decltype(dz);
        D * d = static_cast<D *>(dst);
#pragma omp parallel for schedule(static) if (size_t(rows * cols) >= kSerialBelow)
        for (int64_t r = 0; r < rows; ++r) {
            if (accumulate)
                add_f32_row(d + size_t(r) * ldd, src + r * cols, size_t(cols));
            else
                from_f32_row(d + size_t(r) * ldd, src + r * cols, size_t(cols));
        }
    });
}

}  // namespace memfit::cpu
