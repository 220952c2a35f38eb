// The CPU backend: oneDNN gemms (cached primitives, planned scratchpad) and OpenMP kernels.
// Mixed precision: kernels take f32, bf16 or f16 storage (dispatching on Tensor::dtype) and
// compute in fp32; gemms with any bf16/f16 operand go through fp32 tiles (gemm_mixed.h).
#pragma once

#include "backend/backend.h"
#include "backend/cpu/dnnl_gemm.h"
#include "backend/cpu/gemm_mixed.h"

namespace memfit {

class CpuBackend : public Backend {
public:
    const char * name() const override { return "cpu"; }
    size_t gemm_workspace(const GemmDesc & d) const override;
    bool native_gemm(const GemmDesc & d) const override;
    double lowp_gemm_speed() const override;   // measured: backend/cpu/bf16_path.h
    void round_bf16_rows(Tensor x) override;
    void xent_fwd_bwd_round(Tensor losses, Tensor logits, Tensor targets, float dloss) override;

    // The kernels (backend/kernel_list.h).
#define MF_KERNEL(name, params) void name params override;
#include "backend/kernel_list.h"
#undef MF_KERNEL
    size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH, DType storage) const override;
    // Quantized frozen weights (qgemm.cpp) and LoRA's column slices (kernels_lora.cpp).
    size_t qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const override;
    void dora_norm_packed(Tensor norm, const QuantDesc & q, Tensor packed, int64_t col0, Tensor a, Tensor b, float scale,
                          Tensor workspace) override;
    void qgemm_fwd(const QuantDesc & q, Tensor y, Tensor x, Tensor packed, Tensor bias, Tensor workspace) override;
    void qgemm_bwd(const QuantDesc & q, Tensor dx, Tensor dy, Tensor packed, bool accumulate,
                   Tensor workspace) override;
    void quantize(const QuantDesc & q, void * packed, const float * W) const override;
    void dequantize(const QuantDesc & q, float * W, const void * packed) const override;

private:
    mutable cpu::DnnlGemm gemm_;   // primitive cache: querying sizes creates primitives
    mutable cpu::MixedGemm mixed_{gemm_};  // tile plans of the gemms that are not all f32
};

}  // namespace memfit
