// Tensor: a non-owning view of bytes that belong to a program buffer (or to the caller).
// While a step is being recorded `data` is null and only `buffer`, `offset`, dtype and shape
// matter; when it executes, the graph resolves `data` from the placed buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"
#include "core/error.h"

namespace memfit {

struct Tensor {
    static constexpr int kMaxDims = 4;

    void *  data   = nullptr;   // resolved pointer; null while recording
    int32_t buffer = -1;        // program buffer id, -1 for caller-owned memory
    size_t  offset = 0;         // byte offset of this view inside its buffer
    DType   dtype  = DType::f32;
    int     ndim   = 0;
    int64_t shape[kMaxDims] = {0, 0, 0, 0};

    Tensor() = default;
    Tensor(int32_t buf, DType dt, std::initializer_list<int64_t> dims, size_t byte_offset = 0)
        : buffer(buf), offset(byte_offset), dtype(dt) {
        MF_ASSERT(dims.size() >= 1 && dims.size() <= kMaxDims);
        for (int64_t d : dims) shape[ndim++] = d;
    }

    bool    valid() const { return ndim > 0; }
    int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
    int64_t numel() const { int64_t n = 1; for (int i = 0; i < ndim; ++i) n *= shape[i]; return n; }
    size_t  nbytes() const { return size_t(numel()) * dtype_size(dtype); }
    // rows = product of all dims but the last; cols = the last dim.
    int64_t rows() const { return numel() / shape[ndim - 1]; }
    int64_t cols() const { return shape[ndim - 1]; }

    float *   f32() const { MF_ASSERT(dtype == DType::f32); return static_cast<float *>(data); }
    int32_t * i32() const { MF_ASSERT(dtype == DType::i32); return static_cast<int32_t *>(data); }

    // A view of `dims` starting `elem_offset` elements into this one.
    Tensor view(int64_t elem_offset, std::initializer_list<int64_t> dims) const {
        Tensor t(buffer, dtype, dims, offset + size_t(elem_offset) * dtype_size(dtype));
        if (data) t.data = static_cast<char *>(data) + size_t(elem_offset) * dtype_size(dtype);
        MF_ASSERT(elem_offset + t.numel() <= numel());
        return t;
    }
};

}  // namespace memfit
