// The CPU backend's dtype dispatch: from a Tensor's dtype to the storage type its kernels take.
#pragma once

#include "backend/cpu/convert.h"
#include "core/error.h"
#include "core/tensor.h"

namespace memfit::cpu {

// f(S{}) with S the storage type of dtype t (float, bf16_t or f16_t).
template <class F>
void dispatch(DType t, F && f) {
    switch (t) {
        case DType::f32: f(float{}); return;
        case DType::bf16: f(bf16_t{}); return;
        case DType::f16: f(f16_t{}); return;
        default: MF_ASSERT(!"not a float dtype (f32, bf16, f16)");
    }
}

// The typed pointer of a tensor whose dtype the caller dispatched on.
template <class S>
S * ptr(const Tensor & t) {
    MF_ASSERT(t.dtype == dtype_of<S>());
    return static_cast<S *>(t.data);
}

}  // namespace memfit::cpu
