#include "backend/cpu/cpu_backend.h"

#include "backend/cpu/bf16_path.h"

#include "backend/moments8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_flash.h"
#include "backend/quant_format.h"

namespace memfit {

namespace {
using cpu::dispatch;
using cpu::ptr;
// Shapes: activations are [B,T,C] or [N,C]; B*T rows.
int B_of(const Tensor & t) { return int(t.dim(0)); }
int T_of(const Tensor & t) { return int(t.dim(1)); }

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// f(S{}, G{}) for a kernel with activations of dtype t and a parameter gradient of dtype g, which
// is f32 or t.
template <class F>
void dispatch_grad(DType t, DType g, F && f) {
    MF_ASSERT(g == DType::f32 || g == t);
    dispatch(t, [&](auto s) {
        if (g == DType::f32) f(s, float{}); else f(s, s);
    });
}

void same_dtype(DType t, std::initializer_list<const Tensor *> ts) {
    for (const Tensor * x : ts) MF_ASSERT(x->dtype == t);
}

// Packed documents: doc_start's rows (i32, one per token of the B x T batch of `like`), or null.
const int32_t * docs(const Tensor & doc_start, const Tensor & like) {
    if (!doc_start.valid()) return nullptr;
    MF_ASSERT(doc_start.dtype == DType::i32 && doc_start.numel() == like.dim(0) * like.dim(1));
    return doc_start.i32();
}
}  // namespace

size_t CpuBackend::gemm_workspace(const GemmDesc & d) const {
    if (d.a == DType::f32 && d.b == DType::f32 && d.c == DType::f32) return gemm_.workspace_bytes(d);
    if (gemm_.native(d)) return gemm_.native_workspace_bytes(d);   // bf16 where oneDNN has it
    return mixed_.workspace_bytes(d);
}

bool CpuBackend::native_gemm(const GemmDesc & d) const { return gemm_.native(d); }

double CpuBackend::lowp_gemm_speed() const {
    const cpu::GemmRates & r = cpu::machine_gemm_rates();
    // The path bf16 gemms take here: the chosen one's rate, whichever decided it.
    const double bf16 = cpu::native_bf16_chosen() && r.native > 0 ? r.native : r.convert;
    return r.fp32 > 0 && bf16 > 0 ? bf16 / r.fp32 : 0.9;
}

void CpuBackend::round_bf16_rows(Tensor x) { cpu::round_bf16_rows_in_place(x.f32(), x.rows(), x.cols()); }

void CpuBackend::fill_zero(Tensor t) { std::memset(t.data, 0, t.nbytes()); }

void CpuBackend::copy(Tensor dst, Tensor src) {
    MF_ASSERT(dst.numel() == src.numel());
    if (dst.dtype == src.dtype) {
        std::memcpy(dst.data, src.data, src.nbytes());
        return;
    }
    MF_ASSERT(is_float(dst.dtype) && is_float(src.dtype));
    cpu::convert(dst.data, dst.dtype, src.data, src.dtype, size_t(src.numel()));
}

void CpuBackend::gemm(const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace) {
    MF_ASSERT(c.numel() == d.M * d.N && a.numel() == gemm_a_elems(d) && b.numel() == d.K * d.N);
    MF_ASSERT(c.dtype == d.c && a.dtype == d.a && b.dtype == d.b);
    MF_ASSERT(!d.bias || (bias.valid() && bias.dtype == d.b && bias.numel() == d.N));
    if (d.a == DType::f32 && d.b == DType::f32 && d.c == DType::f32) {
        gemm_.run(d, c.f32(), a.f32(), b.f32(), bias.valid() ? bias.f32() : nullptr, workspace.data);
        return;
    }
    MF_ASSERT(is_float(d.a) && is_float(d.b) && is_float(d.c));
    if (gemm_.native(d)) {
        MF_ASSERT((workspace.valid() ? workspace.nbytes() : 0) >= gemm_.native_workspace_bytes(d));
        gemm_.run_native(d, c.data, a.data, b.data, d.bias ? bias.data : nullptr, workspace.data);
        return;
    }
    MF_ASSERT((workspace.valid() ? workspace.nbytes() : 0) >= mixed_.workspace_bytes(d));
    mixed_.run(d, c.data, a.data, b.data, d.bias ? bias.data : nullptr, workspace.data);
}

void CpuBackend::bias_grad(Tensor dbias, Tensor dout) {
    dispatch_grad(dout.dtype, dbias.dtype, [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        cpu::bias_backward(ptr<G>(dbias), ptr<S>(dout), int(dout.rows()), int(dout.cols()));
    });
}

namespace {
// The embedding of tokens over the table rows [vocab_lo, vocab_lo + vocab_rows) (vocab_rows < 0:
// the whole table), and its backward; invalid wpe, dwte or dwpe are skipped (kernels.h).
void encode(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo, int64_t vocab_rows,
            Tensor doc_start = {}) {
    same_dtype(out.dtype, {&wte});
    if (wpe.valid()) same_dtype(out.dtype, {&wpe});
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::encoder_forward(ptr<S>(out), tokens.i32(), ptr<S>(wte), wpe.valid() ? ptr<S>(wpe) : nullptr, B_of(out),
                             T_of(out), int(out.cols()), vocab_lo, vocab_rows, docs(doc_start, out));
    });
}

void encode_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo, int64_t vocab_rows,
                Tensor doc_start = {}) {
    MF_ASSERT(!dwpe.valid() || dwpe.dtype == DType::f32 || dwpe.dtype == dout.dtype);
    dispatch_grad(dout.dtype, dwte.valid() ? dwte.dtype : DType::f32, [&](auto s, auto ge) {
        using S = decltype(s);
        using GE = decltype(ge);
        auto run = [&](auto gp) {
            using GP = decltype(gp);
            cpu::encoder_backward(dwte.valid() ? ptr<GE>(dwte) : nullptr, dwpe.valid() ? ptr<GP>(dwpe) : nullptr,
                                  ptr<S>(dout), tokens.i32(), B_of(dout), T_of(dout), int(dout.cols()), vocab_lo,
                                  vocab_rows, docs(doc_start, dout));
        };
        if (!dwpe.valid() || dwpe.dtype == DType::f32) run(float{}); else run(S{});
    });
}
}  // namespace

void CpuBackend::encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start) {
    encode(out, tokens, wte, wpe, 0, -1, doc_start);
}

void CpuBackend::encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start) {
    encode_bwd(dwte, dwpe, dout, tokens, 0, -1, doc_start);
}

void CpuBackend::vocab_encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo) {
    // wte holds whole rows of C = out.cols() (any shape: [Vl, C] or flat).
    MF_ASSERT(vocab_lo >= 0 && wte.numel() % out.cols() == 0 && tokens.numel() == out.rows());
    encode(out, tokens, wte, wpe, vocab_lo, wte.numel() / out.cols());
}

void CpuBackend::vocab_encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo) {
    MF_ASSERT(vocab_lo >= 0 && tokens.numel() == dout.rows());
    MF_ASSERT(!dwte.valid() || dwte.numel() % dout.cols() == 0);
    // A frozen table (invalid dwte): only dwpe, so the shard's size does not matter.
    encode_bwd(dwte, dwpe, dout, tokens, vocab_lo, dwte.valid() ? dwte.numel() / dout.cols() : 0);
}

void CpuBackend::layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
    same_dtype(inp.dtype, {&out, &w, &b});
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::layernorm_forward(ptr<S>(out), mean.f32(), rstd.f32(), ptr<S>(inp), ptr<S>(w), ptr<S>(b),
                               int(inp.rows()), int(inp.cols()), eps);
    });
}

void CpuBackend::layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                               Tensor rstd) {
    same_dtype(inp.dtype, {&dinp, &dout, &w});
    MF_ASSERT(dw.dtype == db.dtype);
    dispatch_grad(inp.dtype, dw.dtype, [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        cpu::layernorm_backward(ptr<S>(dinp), ptr<G>(dw), ptr<G>(db), ptr<S>(dout), ptr<S>(inp), ptr<S>(w),
                                mean.f32(), rstd.f32(), int(inp.rows()), int(inp.cols()));
    });
}

void CpuBackend::attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start) {
    same_dtype(qkv.dtype, {&out, &att});
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::attention_forward(ptr<S>(out), ptr<S>(att), ptr<S>(qkv), B_of(qkv), T_of(qkv), int(out.cols()), NH,
                               docs(doc_start, qkv));
    });
}

void CpuBackend::attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH,
                               Tensor doc_start) {
    same_dtype(qkv.dtype, {&dqkv, &dout, &att});
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::attention_backward(ptr<S>(dqkv), scratch.f32(), ptr<S>(dout), ptr<S>(qkv), ptr<S>(att), B_of(qkv),
                                T_of(qkv), int(dout.cols()), NH, docs(doc_start, qkv));
    });
}

void CpuBackend::flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start) {
    same_dtype(qkv.dtype, {&out});
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::flash_attention_forward(ptr<S>(out), lse.f32(), ptr<S>(qkv), B_of(qkv), T_of(qkv), int(out.cols()), NH,
                                     docs(doc_start, qkv));
    });
}

void CpuBackend::flash_attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse,
                                     int NH, Tensor doc_start) {
    same_dtype(qkv.dtype, {&dqkv, &dout, &out});
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::flash_attention_backward(ptr<S>(dqkv), scratch.f32(), ptr<S>(dout), ptr<S>(out), ptr<S>(qkv), lse.f32(),
                                      B_of(qkv), T_of(qkv), int(dout.cols()), NH, docs(doc_start, qkv));
    });
}

size_t CpuBackend::flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH, DType storage) const {
    return cpu::flash_attention_scratch_floats(int(B), int(T), int(C), NH, storage) * sizeof(float);
}

void CpuBackend::gelu_fwd(Tensor out, Tensor inp, Gelu kind) {
    same_dtype(inp.dtype, {&out});
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        if (kind == Gelu::erf) cpu::gelu_erf_forward(ptr<S>(out), ptr<S>(inp), size_t(inp.numel()));
        else cpu::gelu_forward(ptr<S>(out), ptr<S>(inp), size_t(inp.numel()));
    });
}

void CpuBackend::gelu_bwd(Tensor dinp, Tensor dout, Tensor inp, Gelu kind) {
    same_dtype(inp.dtype, {&dinp, &dout});
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        if (kind == Gelu::erf) cpu::gelu_erf_backward(ptr<S>(dinp), ptr<S>(dout), ptr<S>(inp), size_t(inp.numel()));
        else cpu::gelu_backward(ptr<S>(dinp), ptr<S>(dout), ptr<S>(inp), size_t(inp.numel()));
    });
}

void CpuBackend::residual_fwd(Tensor out, Tensor a, Tensor b) {
    same_dtype(out.dtype, {&a, &b});
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::residual_forward(ptr<S>(out), ptr<S>(a), ptr<S>(b), size_t(out.numel()));
    });
}

// ---------------------------------------------------------------------------------------------
// LLaMA family

namespace {
// qkv[B,T,(NH+2*KVH)*hd] (or [N, ...]): the head dim, checked against the width.
int head_dim(const Tensor & qkv, int NH, int KVH) {
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0);
    const int64_t width = qkv.cols();
    MF_ASSERT(width % (NH + 2 * KVH) == 0 && "qkv width is not (NH + 2*KVH) heads");
    return int(width / (NH + 2 * KVH));
}
}  // namespace

void CpuBackend::rmsnorm_fwd(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) {
    same_dtype(inp.dtype, {&out, &w});
    MF_ASSERT(out.numel() == inp.numel() && w.numel() == inp.cols() && rstd.numel() == inp.rows());
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::rmsnorm_forward(ptr<S>(out), rstd.f32(), ptr<S>(inp), ptr<S>(w), int(inp.rows()), int(inp.cols()), eps);
    });
}

void CpuBackend::rmsnorm_bwd(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) {
    same_dtype(inp.dtype, {&dinp, &dout, &w});
    MF_ASSERT(dinp.numel() == inp.numel() && dout.numel() == inp.numel());
    MF_ASSERT(w.numel() == inp.cols() && (!dw.valid() || dw.numel() == inp.cols()) && rstd.numel() == inp.rows());
    dispatch_grad(inp.dtype, dw.dtype, [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        cpu::rmsnorm_backward(ptr<S>(dinp), ptr<G>(dw), ptr<S>(dout), ptr<S>(inp), ptr<S>(w), rstd.f32(),
                              int(inp.rows()), int(inp.cols()));
    });
}

namespace {
// Qwen3's q/k norm operands, checked; returns the head dim.
int qk_norm_dim(const Tensor & qkv, const Tensor & raw, const Tensor & rstd, const Tensor & wq, const Tensor & wk,
                int NH, int KVH) {
    const int hd = head_dim(qkv, NH, KVH);
    MF_ASSERT(raw.dtype == qkv.dtype && wq.dtype == qkv.dtype && wk.dtype == qkv.dtype && rstd.dtype == DType::f32);
    MF_ASSERT(raw.numel() == qkv.rows() * (NH + KVH) * hd && rstd.numel() == qkv.rows() * (NH + KVH));
    MF_ASSERT(wq.numel() == hd && wk.numel() == hd);
    return hd;
}
}  // namespace

void CpuBackend::qk_norm_fwd(Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps) {
    const int hd = qk_norm_dim(qkv, raw, rstd, wq, wk, NH, KVH);
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::qk_norm_forward(ptr<S>(qkv), ptr<S>(raw), rstd.f32(), ptr<S>(wq), ptr<S>(wk), int(qkv.rows()), NH, KVH,
                             hd, eps);
    });
}

void CpuBackend::qk_norm_bwd(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd,
                             int NH, int KVH) {
    const int hd = qk_norm_dim(dqkv, raw, rstd, wq, wk, NH, KVH);
    MF_ASSERT(dwq.valid() == dwk.valid() && (!dwq.valid() || (dwq.numel() == hd && dwk.numel() == hd &&
                                                              dwk.dtype == dwq.dtype)));
    dispatch_grad(dqkv.dtype, dwq.valid() ? dwq.dtype : DType::f32, [&](auto s, auto g) {
        using S = decltype(s);
        using G = decltype(g);
        cpu::qk_norm_backward(ptr<S>(dqkv), ptr<G>(dwq), ptr<G>(dwk), ptr<S>(raw), ptr<S>(wq), ptr<S>(wk), rstd.f32(),
                              int(dqkv.rows()), NH, KVH, hd);
    });
}

void CpuBackend::rope_fwd(Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    MF_ASSERT(qkv.ndim == 3);
    const int hd = head_dim(qkv, NH, KVH);
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::rope_forward(ptr<S>(qkv), B_of(qkv), T_of(qkv), NH, KVH, hd, rope, pos0, docs(doc_start, qkv));
    });
}

void CpuBackend::rope_bwd(Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    MF_ASSERT(dqkv.ndim == 3);
    const int hd = head_dim(dqkv, NH, KVH);
    dispatch(dqkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::rope_backward(ptr<S>(dqkv), B_of(dqkv), T_of(dqkv), NH, KVH, hd, rope, pos0, docs(doc_start, dqkv));
    });
}

void CpuBackend::swiglu_fwd(Tensor out, Tensor inp) {
    same_dtype(inp.dtype, {&out});
    MF_ASSERT(inp.cols() == 2 * out.cols() && inp.rows() == out.rows());
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::swiglu_forward(ptr<S>(out), ptr<S>(inp), int(out.rows()), int(out.cols()));
    });
}

void CpuBackend::swiglu_bwd(Tensor dinp, Tensor dout, Tensor inp) {
    same_dtype(inp.dtype, {&dinp, &dout});
    MF_ASSERT(inp.cols() == 2 * dout.cols() && inp.rows() == dout.rows() && dinp.numel() == inp.numel());
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::swiglu_backward(ptr<S>(dinp), ptr<S>(dout), ptr<S>(inp), int(dout.rows()), int(dout.cols()));
    });
}

void CpuBackend::geglu_fwd(Tensor out, Tensor inp) {
    same_dtype(inp.dtype, {&out});
    MF_ASSERT(inp.cols() == 2 * out.cols() && inp.rows() == out.rows());
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::geglu_forward(ptr<S>(out), ptr<S>(inp), int(out.rows()), int(out.cols()));
    });
}

void CpuBackend::geglu_bwd(Tensor dinp, Tensor dout, Tensor inp) {
    same_dtype(inp.dtype, {&dinp, &dout});
    MF_ASSERT(inp.cols() == 2 * dout.cols() && inp.rows() == dout.rows() && dinp.numel() == inp.numel());
    dispatch(inp.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::geglu_backward(ptr<S>(dinp), ptr<S>(dout), ptr<S>(inp), int(dout.rows()), int(dout.cols()));
    });
}

void CpuBackend::repeat_kv_fwd(Tensor full, Tensor qkv, int NH, int KVH) {
    same_dtype(qkv.dtype, {&full});
    const int hd = head_dim(qkv, NH, KVH);
    MF_ASSERT(full.rows() == qkv.rows() && full.cols() == 3 * int64_t(NH) * hd);
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::repeat_kv_forward(ptr<S>(full), ptr<S>(qkv), int(qkv.rows()), NH, KVH, hd);
    });
}

void CpuBackend::repeat_kv_bwd(Tensor dqkv, Tensor dfull, int NH, int KVH) {
    same_dtype(dqkv.dtype, {&dfull});
    const int hd = head_dim(dqkv, NH, KVH);
    MF_ASSERT(dfull.rows() == dqkv.rows() && dfull.cols() == 3 * int64_t(NH) * hd);
    dispatch(dqkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::repeat_kv_backward(ptr<S>(dqkv), ptr<S>(dfull), int(dqkv.rows()), NH, KVH, hd);
    });
}

void CpuBackend::cached_attention_fwd(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH,
                                      int KVH, int window) {
    same_dtype(out.dtype, {&qkv, &kcache, &vcache});
    const int hd = head_dim(qkv, NH, KVH);
    const int B = int(qkv.dim(0)), T = int(qkv.dim(1)), cap = int(kcache.dim(1));
    MF_ASSERT(out.numel() == int64_t(B) * T * NH * hd && kcache.numel() == int64_t(B) * cap * KVH * hd);
    MF_ASSERT(vcache.numel() == kcache.numel() && pos0 >= 0 && window >= 0);
    MF_ASSERT((pos0 + T <= cap || (window > 0 && T + window - 1 <= cap)) && "the KV cache cannot hold the window");
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::cached_attention_forward(ptr<S>(out), ptr<S>(kcache), ptr<S>(vcache), ptr<S>(qkv), B, T, pos0, cap, NH,
                                      KVH, hd, window);
    });
}

void CpuBackend::cp_attention_fwd(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH) {
    same_dtype(out.dtype, {&qkv, &kv});
    const int hd = head_dim(qkv, NH, KVH), B = int(qkv.dim(0)), Tl = int(qkv.dim(1)), T = int(kv.dim(1));
    MF_ASSERT(qkv.ndim == 3 && kv.ndim == 3 && kv.dim(0) == B && kv.cols() == int64_t(2) * KVH * hd);
    MF_ASSERT(out.numel() == int64_t(B) * Tl * NH * hd && lse.numel() == int64_t(B) * NH * Tl);
    MF_ASSERT(meta.dtype == DType::i32 && meta.numel() == int64_t(2) * B * Tl);
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::cp_attention_forward(ptr<S>(out), lse.f32(), ptr<S>(qkv), ptr<S>(kv), meta.i32(), B, Tl, T, NH, KVH, hd);
    });
}

void CpuBackend::cp_attention_bwd(Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv,
                                  Tensor kv, Tensor lse, Tensor meta, int NH, int KVH) {
    same_dtype(out.dtype, {&qkv, &kv, &dqkv, &dkv, &dout});
    const int hd = head_dim(qkv, NH, KVH), B = int(qkv.dim(0)), Tl = int(qkv.dim(1)), T = int(kv.dim(1));
    MF_ASSERT(dqkv.numel() == qkv.numel() && dkv.numel() == kv.numel() && meta.numel() == int64_t(2) * B * Tl);
    MF_ASSERT(scratch.numel() >= int64_t(B) * Tl * NH && scratch.dtype == DType::f32);
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::cp_attention_backward(ptr<S>(dqkv), ptr<S>(dkv), scratch.f32(), ptr<S>(dout), ptr<S>(out), ptr<S>(qkv),
                                   ptr<S>(kv), lse.f32(), meta.i32(), B, Tl, T, NH, KVH, hd);
    });
}

void CpuBackend::cp_block_fwd(Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH, int KVH,
                              bool first) {
    same_dtype(qkv.dtype, {&kv});
    const int hd = head_dim(qkv, NH, KVH), B = int(qkv.dim(0)), Tl = int(qkv.dim(1));
    MF_ASSERT(kv.numel() == int64_t(B) * Tl * 2 * KVH * hd && kpos.numel() == Tl && meta.numel() == int64_t(2) * B * Tl);
    MF_ASSERT(acc.numel() == int64_t(B) * Tl * NH * hd && lse.numel() == int64_t(B) * NH * Tl);
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::cp_block_forward(acc.f32(), lse.f32(), ptr<S>(qkv), ptr<S>(kv), kpos.i32(), meta.i32(), B, Tl, NH, KVH, hd,
                              first);
    });
}

void CpuBackend::cp_block_bwd(Tensor dq, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor kv,
                              Tensor lse, Tensor kpos, Tensor meta, int NH, int KVH) {
    same_dtype(qkv.dtype, {&kv, &dout, &out});
    const int hd = head_dim(qkv, NH, KVH), B = int(qkv.dim(0)), Tl = int(qkv.dim(1));
    MF_ASSERT(dq.numel() == int64_t(B) * Tl * NH * hd && dkv.numel() == kv.numel() && scratch.numel() >= int64_t(B) * Tl * NH);
    dispatch(qkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::cp_block_backward(dq.f32(), dkv.f32(), scratch.f32(), ptr<S>(dout), ptr<S>(out), ptr<S>(qkv), ptr<S>(kv),
                               lse.f32(), kpos.i32(), meta.i32(), B, Tl, NH, KVH, hd);
    });
}

void CpuBackend::cp_qkv_grad(Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH) {
    const int hd = head_dim(dqkv, NH, KVH);
    MF_ASSERT(dq.numel() == dqkv.rows() * NH * hd && dkv.numel() == dqkv.rows() * 2 * KVH * hd);
    dispatch(dqkv.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::cp_qkv_grad(ptr<S>(dqkv), dq.f32(), dkv.f32(), dqkv.rows(), NH, KVH, hd);
    });
}

void CpuBackend::paged_attention_fwd(Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta,
                                     const PagedKv & kv, int NH, int KVH, int window) {
    same_dtype(out.dtype, {&qkv});
    const int hd = head_dim(qkv, NH, KVH);
    const int n = int(qkv.rows());
    MF_ASSERT(kpool.dtype == (kv.int8 ? DType::u8 : out.dtype) && vpool.dtype == kpool.dtype);
    const int64_t pool_bytes = kv.pool_rows() * paged_row_bytes(kv, KVH, hd, int64_t(dtype_size(out.dtype)));
    MF_ASSERT(out.numel() == int64_t(n) * NH * hd && kpool.nbytes() == size_t(pool_bytes));
    MF_ASSERT(vpool.nbytes() == kpool.nbytes() && meta.dtype == DType::i32 && meta.numel() == kv.meta_words());
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::paged_attention_forward(ptr<S>(out), kpool.data, vpool.data, ptr<S>(qkv), meta.i32(), kv, n, NH, KVH, hd,
                                     window);
    });
}

// ---------------------------------------------------------------------------------------------
// LoRA column slices

void CpuBackend::add_columns(Tensor out, Tensor d, int64_t col0, float scale) {
    MF_ASSERT(out.rows() == d.rows() && col0 >= 0 && col0 + d.cols() <= out.cols());
    dispatch(out.dtype, [&](auto o) {
        dispatch(d.dtype, [&](auto s) {
            using O = decltype(o);
            using S = decltype(s);
            cpu::add_columns(ptr<O>(out), ptr<S>(d), d.rows(), out.cols(), d.cols(), col0, scale);
        });
    });
}

void CpuBackend::dropout(Tensor out, Tensor in, float p, uint64_t seed) {
    MF_ASSERT(out.numel() == in.numel() && out.dtype == in.dtype);
    dispatch(in.dtype, [&](auto s) {
        using S = decltype(s);
        cpu::dropout(ptr<S>(out), ptr<S>(in), size_t(in.numel()), p, seed);
    });
}

void CpuBackend::take_columns(Tensor d, Tensor src, int64_t col0, float scale) {
    MF_ASSERT(src.rows() == d.rows() && col0 >= 0 && col0 + d.cols() <= src.cols());
    dispatch(d.dtype, [&](auto dz) {
        dispatch(src.dtype, [&](auto s) {
            using D = decltype(dz);
            using S = decltype(s);
            cpu::take_columns(ptr<D>(d), ptr<S>(src), d.rows(), src.cols(), d.cols(), col0, scale);
        });
    });
}

namespace {
// A small tensor's values (DoRA's adapters and vectors) in fp32; from element `at`, n of them
// (n < 0: to the end). An invalid tensor: n zeros.
std::vector<float> floats(const Tensor & t, int64_t at = 0, int64_t n = -1) {
    if (n < 0) n = t.numel() - at;
    std::vector<float> v(size_t(n), 0.0f);
    if (!t.valid()) return v;
    MF_ASSERT(at >= 0 && at + n <= t.numel());
    dispatch(t.dtype, [&](auto s) { cpu::to_f32_row(v.data(), ptr<decltype(s)>(t) + at, size_t(n)); });
    return v;
}

// DoRA's column factors mag / norm.
std::vector<float> dora_factors(const Tensor & mag, const Tensor & norm) {
    std::vector<float> g = floats(mag);
    MF_ASSERT(norm.dtype == DType::f32 && norm.numel() == mag.numel());
    for (size_t j = 0; j < g.size(); ++j) g[j] /= norm.f32()[j];
    return g;
}
}  // namespace

void CpuBackend::dora_norm(Tensor norm, Tensor w, bool w_in_out, int64_t col0, Tensor a, Tensor b, float scale) {
    const int64_t cols = b.dim(0), r = b.dim(1), in = a.dim(1);
    MF_ASSERT(norm.dtype == DType::f32 && norm.numel() == cols && a.dim(0) == r);
    const int64_t ld = w.dim(1);
    MF_ASSERT(w_in_out ? w.dim(0) == in && col0 + cols <= ld : ld == in && col0 + cols <= w.dim(0));
    const std::vector<float> af = floats(a), bf = floats(b);
    dispatch(w.dtype, [&](auto s) {
        using W = decltype(s);
        cpu::dora_norm(norm.f32(), ptr<W>(w), w_in_out, ld, in, cols, col0, af.data(), bf.data(), r, scale);
    });
}

void CpuBackend::dora_norm_packed(Tensor norm, const QuantDesc & q, Tensor packed, int64_t col0, Tensor a, Tensor b,
                                  float scale, Tensor workspace) {
    const int64_t cols = b.dim(0), r = b.dim(1), in = q.in;
    MF_ASSERT(norm.dtype == DType::f32 && norm.numel() == cols && a.dim(0) == r && a.dim(1) == in);
    MF_ASSERT(col0 >= 0 && col0 + cols <= q.out && workspace.nbytes() >= dora_norm_workspace(q, cols));
    const std::vector<float> af = floats(a), bf = floats(b);
    float * tile = static_cast<float *>(workspace.data);
    with_quant(q, [&](const auto & Q) {
        for (int64_t t0 = 0; t0 < cols; t0 += kDoraTileRows) {
            const int64_t n = std::min(kDoraTileRows, cols - t0);
            Q.dequantize_rows(tile, static_cast<const uint8_t *>(packed.data), col0 + t0, n);
            cpu::dora_norm(norm.f32() + t0, tile, false, in, in, n, 0, af.data(), bf.data() + t0 * r, r, scale);
        }
    });
}

void CpuBackend::dora_scale_fwd(Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0) {
    const int64_t cols = mag.numel();
    MF_ASSERT(z.rows() == out.rows() && z.cols() == cols && col0 + cols <= out.cols());
    const std::vector<float> g = dora_factors(mag, norm), bs = floats(bias, bias.valid() ? col0 : 0, cols);
    dispatch(out.dtype, [&](auto o) {
        dispatch(z.dtype, [&](auto zz) {
            using O = decltype(o);
            using Z = decltype(zz);
            cpu::dora_scale_fwd(ptr<O>(out), ptr<Z>(z), bs.data(), g.data(), out.rows(), out.cols(), cols, col0);
        });
    });
}

void CpuBackend::dora_scale_bwd(Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0) {
    const int64_t cols = mag.numel();
    MF_ASSERT(z.rows() == dout.rows() && z.cols() == cols && col0 + cols <= dout.cols() && dmag.numel() == cols);
    const std::vector<float> g = dora_factors(mag, norm);
    std::vector<float> acc(static_cast<size_t>(cols));
    dispatch(dout.dtype, [&](auto d) {
        dispatch(z.dtype, [&](auto zz) {
            using D = decltype(d);
            using Z = decltype(zz);
            cpu::dora_scale_bwd(ptr<D>(dout), ptr<Z>(z), g.data(), acc.data(), dout.rows(), dout.cols(), cols, col0);
        });
    });
    dispatch(dmag.dtype, [&](auto s) {   // the gradient accumulates, one rounded add per element
        using S = decltype(s);
        S * dm = ptr<S>(dmag);
        for (int64_t j = 0; j < cols; ++j) dm[j] = from_f32<S>(to_f32(dm[j]) + acc[size_t(j)] / norm.f32()[j]);
    });
}

// ---------------------------------------------------------------------------------------------

void CpuBackend::xent_fwd(Tensor losses, Tensor logits, Tensor targets) {
    cpu::crossentropy_forward(losses.f32(), logits.f32(), targets.i32(), int(logits.rows()), int(logits.cols()));
}

void CpuBackend::xent_bwd(Tensor probs, Tensor targets, float dloss) {
    cpu::crossentropy_backward(probs.f32(), targets.i32(), dloss, int(probs.rows()), int(probs.cols()));
}

void CpuBackend::xent_fwd_bwd(Tensor losses, Tensor logits, Tensor targets, float dloss) {
    cpu::crossentropy_forward_backward(losses.f32(), logits.f32(), targets.i32(), dloss, int(logits.rows()),
                                       int(logits.cols()));
}

void CpuBackend::xent_fwd_bwd_round(Tensor losses, Tensor logits, Tensor targets, float dloss) {
    cpu::crossentropy_forward_backward(losses.f32(), logits.f32(), targets.i32(), dloss, int(logits.rows()),
                                       int(logits.cols()), true);
}

void CpuBackend::xent_shard_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab) {
    const int64_t N = logits.rows();
    MF_ASSERT(stats.numel() == 2 * N && targets.numel() == N && vocab_lo >= 0);
    cpu::crossentropy_shard_stats(stats.f32(), logits.f32(), targets.i32(), int(N), int(logits.cols()), vocab_lo,
                                  vocab);
}

void CpuBackend::xent_shard_loss(Tensor losses, Tensor lse, Tensor gathered, Tensor targets) {
    const int64_t N = losses.numel();
    MF_ASSERT(lse.numel() == N && targets.numel() == N);
    if (N == 0) return;
    MF_ASSERT(gathered.numel() % (2 * N) == 0);
    cpu::crossentropy_shard_loss(losses.f32(), lse.f32(), gathered.f32(), targets.i32(), int(N),
                                 int(gathered.numel() / (2 * N)));
}

void CpuBackend::xent_shard_bwd(Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab,
                                float dloss) {
    const int64_t N = logits.rows();
    MF_ASSERT(targets.numel() == N && lse.numel() == N && vocab_lo >= 0);
    cpu::crossentropy_shard_backward(logits.f32(), targets.i32(), lse.f32(), dloss, int(N), int(logits.cols()),
                                     vocab_lo, vocab);
}

void CpuBackend::distill_fwd(Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                             float temperature) {
    const int64_t N = logits.rows(), V = logits.cols();
    MF_ASSERT(teacher.rows() == N && teacher.cols() == V && stats.numel() == 2 * N && losses.numel() == N &&
              targets.numel() == N);
    cpu::distill_forward(losses.f32(), stats.f32(), logits.f32(), teacher.f32(), targets.i32(), int(N), int(V), alpha,
                         temperature);
}

void CpuBackend::distill_bwd(Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha,
                             float temperature, float dloss) {
    const int64_t N = logits.rows(), V = logits.cols();
    MF_ASSERT(teacher_probs.rows() == N && teacher_probs.cols() == V && stats.numel() == 2 * N && targets.numel() == N);
    cpu::distill_backward(logits.f32(), stats.f32(), teacher_probs.f32(), targets.i32(), int(N), int(V), alpha,
                          temperature, dloss);
}

void CpuBackend::row_logps(Tensor out, Tensor losses) {
    MF_ASSERT(losses.ndim == 2 && out.numel() == losses.rows());
    cpu::row_logps(out.f32(), losses.f32(), int(losses.rows()), int(losses.cols()));
}

void CpuBackend::dpo_loss(Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d) {
    const int64_t B = losses.rows(), T = losses.cols();
    MF_ASSERT(scale.numel() == B * T && targets.numel() == B * T && logps.numel() == B && ref.numel() == B);
    cpu::dpo_loss(losses.f32(), scale.f32(), logps.f32(), ref.f32(), targets.i32(), int(B), int(T), d);
}

void CpuBackend::xent_grad_rows(Tensor logits, Tensor targets, Tensor scale) {
    const int64_t N = logits.rows();
    MF_ASSERT(targets.numel() == N && scale.numel() == N);
    cpu::crossentropy_forward_backward(nullptr, logits.f32(), targets.i32(), 0.0f, int(N), int(logits.cols()), false,
                                       scale.f32());
}

void CpuBackend::sum_squares(Tensor out, Tensor x) {
    dispatch(x.dtype, [&](auto s) {
        using S = decltype(s);
        out.f32()[0] = float(cpu::sum_squares(ptr<S>(x), size_t(x.numel())));
    });
}


}  // namespace memfit
