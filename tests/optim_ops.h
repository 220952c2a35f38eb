// The optimizers' former call shapes, for the kernel tests: each is one Backend::optimizer_step
// of a backend/optimizer.h row (AdamW's by its moments' dtype).
#pragma once

#include "backend/backend.h"

namespace memfit::test {

inline void adamw_op(Backend & b, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor norm_sq, Tensor copy,
                     const OptimHyper & h) {
    const Optimizer o = m.dtype == DType::bf16 ? Optimizer::adamw_bf16 : Optimizer::adamw;
    b.optimizer_step(o, param, grad, OptimizerStates{{m, v}}, norm_sq, copy, h);
}

inline void adamw_8bit_op(Backend & b, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor m_scale, Tensor v_scale,
                          Tensor norm_sq, Tensor copy, const OptimHyper & h) {
    b.optimizer_step(Optimizer::adamw_8bit, param, grad, OptimizerStates{{m, v, m_scale, v_scale}}, norm_sq, copy, h);
}

inline void sgd_op(Backend & b, Tensor param, Tensor grad, Tensor buf, Tensor norm_sq, Tensor copy,
                   const OptimHyper & h) {
    b.optimizer_step(Optimizer::sgd, param, grad, OptimizerStates{{buf}}, norm_sq, copy, h);
}

// The row whose moments have this dtype (f32, bf16, u8), or SGD's.
inline Optimizer optimizer_for(DType moments, bool sgd = false) {
    if (sgd) return Optimizer::sgd;
    return moments == DType::bf16 ? Optimizer::adamw_bf16 : moments == DType::u8 ? Optimizer::adamw_8bit : Optimizer::adamw;
}

}  // namespace memfit::test
