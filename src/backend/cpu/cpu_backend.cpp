#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_flash.h"

namespace memfit {

namespace {
// Shapes: activations are [B,T,C] or [N,C]; B*T rows.
int B_of(const Tensor & t) { return int(t.dim(0)); }
int T_of(const Tensor & t) { return int(t.dim(1)); }
}  // namespace

size_t CpuBackend::gemm_workspace(const GemmDesc & d) const { return gemm_.workspace_bytes(d); }

void CpuBackend::fill_zero(Tensor t) { std::memset(t.data, 0, t.nbytes()); }

void CpuBackend::copy(Tensor dst, Tensor src) {
    MF_ASSERT(dst.nbytes() == src.nbytes());
    std::memcpy(dst.data, src.data, src.nbytes());
}

void CpuBackend::gemm(const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace) {
    MF_ASSERT(c.numel() == d.M * d.N && a.numel() == d.M * d.K && b.numel() == d.K * d.N);
    gemm_.run(d, c.f32(), a.f32(), b.f32(), bias.valid() ? bias.f32() : nullptr, workspace.data);
}

void CpuBackend::bias_grad(Tensor dbias, Tensor dout) {
    cpu::bias_backward(dbias.f32(), dout.f32(), int(dout.rows()), int(dout.cols()));
}

void CpuBackend::encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
    cpu::encoder_forward(out.f32(), tokens.i32(), wte.f32(), wpe.f32(), B_of(out), T_of(out), int(out.cols()));
}

void CpuBackend::encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
    cpu::encoder_backward(dwte.f32(), dwpe.f32(), dout.f32(), tokens.i32(), B_of(dout), T_of(dout), int(dout.cols()));
}

void CpuBackend::layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
    cpu::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), inp.f32(), w.f32(), b.f32(), int(inp.rows()),
                           int(inp.cols()), eps);
}

void CpuBackend::layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                               Tensor rstd) {
    cpu::layernorm_backward(dinp.f32(), dw.f32(), db.f32(), dout.f32(), inp.f32(), w.f32(), mean.f32(), rstd.f32(),
                            int(inp.rows()), int(inp.cols()));
}

void CpuBackend::attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH) {
    cpu::attention_forward(out.f32(), att.f32(), qkv.f32(), B_of(qkv), T_of(qkv), int(out.cols()), NH);
}

void CpuBackend::attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH) {
    cpu::attention_backward(dqkv.f32(), scratch.f32(), dout.f32(), qkv.f32(), att.f32(), B_of(qkv), T_of(qkv),
                            int(dout.cols()), NH);
}

void CpuBackend::flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH) {
    cpu::flash_attention_forward(out.f32(), lse.f32(), qkv.f32(), B_of(qkv), T_of(qkv), int(out.cols()), NH);
}

void CpuBackend::flash_attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse,
                                     int NH) {
    cpu::flash_attention_backward(dqkv.f32(), scratch.f32(), dout.f32(), out.f32(), qkv.f32(), lse.f32(), B_of(qkv),
                                  T_of(qkv), int(dout.cols()), NH);
}

size_t CpuBackend::flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH) const {
    return cpu::flash_attention_scratch_floats(int(B), int(T), int(C), NH) * sizeof(float);
}

void CpuBackend::gelu_fwd(Tensor out, Tensor inp) { cpu::gelu_forward(out.f32(), inp.f32(), size_t(inp.numel())); }

void CpuBackend::gelu_bwd(Tensor dinp, Tensor dout, Tensor inp) {
    cpu::gelu_backward(dinp.f32(), dout.f32(), inp.f32(), size_t(inp.numel()));
}

void CpuBackend::residual_fwd(Tensor out, Tensor a, Tensor b) {
    cpu::residual_forward(out.f32(), a.f32(), b.f32(), size_t(out.numel()));
}

void CpuBackend::xent_fwd(Tensor losses, Tensor logits, Tensor targets) {
    cpu::crossentropy_forward(losses.f32(), logits.f32(), targets.i32(), int(logits.rows()), int(logits.cols()));
}

void CpuBackend::xent_bwd(Tensor probs, Tensor targets, float dloss) {
    cpu::crossentropy_backward(probs.f32(), targets.i32(), dloss, int(probs.rows()), int(probs.cols()));
}

void CpuBackend::sum_squares(Tensor out, Tensor x) {
    out.f32()[0] = float(cpu::sum_squares(x.f32(), size_t(x.numel())));
}

void CpuBackend::adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor norm_sq, Tensor param_copy,
                       const AdamWHyper & h) {
    MF_ASSERT(!param_copy.valid());
    const float nsq = norm_sq.valid() ? norm_sq.f32()[0] : 0.0f;
    if (h.skip_nonfinite && !std::isfinite(nsq)) return;
    const float scale = update_scale(h, nsq);
    cpu::adamw_update(param.f32(), grad.f32(), m.f32(), v.f32(), size_t(param.numel()), h.lr, h.beta1, h.beta2, h.eps,
                      h.weight_decay, h.t, scale);
}

}  // namespace memfit
