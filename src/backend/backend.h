// The op interface every backend implements (CPU, CUDA in src/backend/cuda; the null backend
// computes nothing). Ops take resolved Tensor views; dimensions come from the tensors' shapes:
//   B = batch, T = sequence, C = channels, NH = heads, V = vocabulary, N = rows (B*T).
// Conventions: outputs first, then saved-for-backward buffers, then inputs and
// weights. Forward outputs are written with `=`; parameter gradients accumulate with `+=`;
// activation gradients are written with `=` except where an op says it accumulates.
// The dtype rides in each Tensor. Mixed precision (docs/design.md): activations and weights are
// stored in the compute dtype (f32, bf16 or f16) and every kernel computes in f32, converting
// as it loads and rounding as it stores; mean/rstd/lse, losses, logits and norm_sq stay f32;
// parameter gradients are f32 or the compute dtype.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "backend/activation.h"
#include "backend/moe.h"
#include "backend/optimizer.h"
#include "backend/paged_kv.h"
#include "backend/preference_loss.h"
#include "backend/rope.h"
#include "core/tensor.h"
#include "memory/step_memory.h"

namespace memfit {

// C[M,N] (+)= op(A)[M,K] . op(B)[K,N] (+ bias[N]), all row-major; op(X) = X^T when trans_x,
// i.e. A is stored [K,M] when trans_a and B is stored [N,K] when trans_b.
struct GemmDesc {
    int64_t M = 0, N = 0, K = 0;
    bool trans_a = false, trans_b = false;
    bool accumulate = false;   // C += ... instead of C = ...
    bool bias = false;         // add bias[N] to every row (only with accumulate == false)
    // Storage of A, B and C (bias has B's dtype). Kernels compute in f32; a backend without
    // native low-precision kernels converts tiles through the workspace gemm_workspace() sizes.
    DType a = DType::f32, b = DType::f32, c = DType::f32;
    // A's row stride in elements as stored (0: packed, i.e. K, or M when trans_a): the LM head's
    // logit gradients rounded to bf16 in place (Backend::round_bf16_rows) are read with 2 * V.
    int64_t lda = 0;
    bool operator==(const GemmDesc &) const = default;
};

// A's row stride and the elements its storage spans.
inline int64_t gemm_lda(const GemmDesc & d) { return d.lda ? d.lda : d.trans_a ? d.M : d.K; }
inline int64_t gemm_a_elems(const GemmDesc & d) { return (d.trans_a ? d.K : d.M) * gemm_lda(d); }

// A frozen weight W [out, in] (row = output channel) stored packed, for LoRA's quantized base
// (QLoRA) and generation. Formats and exact byte counts: backend/quant_format.h (sparse24: 2:4
// structured sparse, two bf16 values and their 2-bit positions per group of 4 inputs; gptq: the
// GPTQ checkpoint format's integer codes with a scale and zero point per group of inputs).
enum class QuantFormat : uint8_t { int8, nf4, nf4_dq, sparse24, gptq };
struct QuantDesc {
    QuantFormat format = QuantFormat::int8;
    int64_t out = 0, in = 0;
    int32_t bits = 0, group = 0;   // gptq only: bits per code (4 or 8), inputs per group (divides in)
    bool operator==(const QuantDesc &) const = default;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char * name() const = 0;

    // Where this backend's tensors live. The CPU backend computes on host memory; a device
    // backend (CUDA) obtains its regions from its own allocator, and the engine moves bytes
    // between the host and those regions only through upload and download, which complete
    // before they return (after every op issued before them).
    virtual bool host_memory() const { return true; }
    // Whether the collectives this backend's runs use (NCCL on the CUDA backend; MPI, which sums
    // fp32, on the CPU) add bf16/f16 buffers natively: then a 16-bit sum needs no fp32 copy, and
    // the step declares no communication scratch for it (step_scratch_elems).
    virtual bool native_16bit_sums() const { return false; }
    // Whether the sizing queries a recording asks (workspace sizes, flash attention's head
    // dimensions, native gemms) are pure functions of their arguments: then programs can be
    // recorded for this backend from several threads at once (memfit plan's exact plans). The
    // CPU backend's answers come from oneDNN primitives it caches, so not by default.
    virtual bool pure_sizing() const { return false; }
    virtual RegionAllocator & allocator() { return host_allocator(); }
    virtual void upload(void * dst, const void * host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }
    virtual void download(void * host_dst, const void * src, size_t bytes) { std::memcpy(host_dst, src, bytes); }
    // --offload optimizer (backend/host_store.h): host memory for the offloaded states (pinned
    // on a device, for full-rate copies), and copies between it and device memory (to_device:
    // dst is the region) that start after every op issued before them and are complete for the
    // ops issued after copy_wait(slot), the wait for every copy started on that slot so far. The
    // CUDA backend runs them on a copy stream of its own, so they overlap the kernels issued in
    // between; synchronize() completes them too. (Default: copied at once.)
    virtual RegionAllocator & offload_allocator() { return host_allocator(); }
    virtual void copy_start(int slot, void * dst, const void * src, size_t bytes, bool to_device) {
        (void) slot;
        if (to_device) upload(dst, src, bytes);
        else download(dst, src, bytes);
    }
    virtual void copy_wait(int slot) { (void) slot; }
    // Waits for every op issued so far (the CPU backend's ops have finished when they return).
    virtual void synchronize() {}
    // A device backend's memory (0 on the host): free bytes now; the runtime's bytes (context,
    // library handles) measured at start-up; and the bytes used on the device now beyond what
    // was used before this process started there (the runtime plus every region obtained).
    virtual uint64_t device_free() const { return 0; }
    virtual uint64_t runtime_bytes() const { return 0; }
    virtual uint64_t device_used_delta() const { return 0; }

    // Scratch bytes gemm() needs for this shape; planned as `workspace` (0 if none).
    virtual size_t gemm_workspace(const GemmDesc & d) const { (void) d; return 0; }
    // Whether gemm() multiplies d's bf16 operands natively (no fp32 copies of them): then
    // Graph::matmul_bwd may round the LM head's fp32 logit gradients to bf16 in place
    // (round_bf16_rows) and read them strided (GemmDesc::lda), as autocast takes them in bf16.
    virtual bool native_gemm(const GemmDesc & d) const { (void) d; return false; }
    // The speed of gemms on bf16/fp16 storage relative to fp32's, as this backend runs them: the
    // op time model's factor (`--fit auto`, plan/time_model.h). The CPU's is measured on its cores
    // (backend/cpu/bf16_path.h); others keep the model's default.
    virtual double lowp_gemm_speed() const { return 0.9; }
    // x f32 [R, N]: each row rounded to bf16 into its own first 2N bytes, leaving a bf16 matrix of
    // row stride 2N. Called only where native_gemm said yes.
    virtual void round_bf16_rows(Tensor x) { (void) x; MF_UNREACHABLE(); }
    // xent_fwd_bwd, then its logit gradients rounded as round_bf16_rows rounds them (the CPU's in
    // the same pass over each row, while it is in cache). Called only where native_gemm said yes.
    virtual void xent_fwd_bwd_round(Tensor losses, Tensor logits, Tensor targets, float dloss) {
        xent_fwd_bwd(losses, logits, targets, dloss);
        round_bf16_rows(logits);
    }

    // The kernels (backend/kernel_list.h).
#define MF_KERNEL(name, params) virtual void name params = 0;
#include "backend/kernel_list.h"
#undef MF_KERNEL

    // Scratch bytes flash_attention_bwd needs for this shape (planned as workspace).
    virtual size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH, DType storage) const = 0;
    // Why the flash kernels cannot take this head dimension ("" when they can).
    virtual std::string flash_attention_refusal(int head_dim) const { (void) head_dim; return {}; }
    bool runs_flash_attention(int head_dim) const { return flash_attention_refusal(head_dim).empty(); }
    // Frozen quantized weights (QLoRA). x, y, dx, dy, bias: f32, bf16 or f16 (one dtype per
    // call, the compute dtype); W' = the dequantized W, never materialised whole.
    // Scratch bytes qgemm_fwd and qgemm_bwd need for M rows of activations of dtype `act`.
    virtual size_t qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const {
        (void) q, (void) M, (void) act;
        return 0;
    }
    // y[M,out] = x[M,in] . W'^T (+ bias[out]), written.
    virtual void qgemm_fwd(const QuantDesc & q, Tensor y, Tensor x, Tensor packed, Tensor bias, Tensor workspace) {
        (void) q, (void) y, (void) x, (void) packed, (void) bias, (void) workspace;
        MF_ASSERT(false && "this backend has no quantized gemm");
    }
    // dx[M,in] = dy[M,out] . W' (accumulate: dx += ...).
    virtual void qgemm_bwd(const QuantDesc & q, Tensor dx, Tensor dy, Tensor packed, bool accumulate,
                           Tensor workspace) {
        (void) q, (void) dx, (void) dy, (void) packed, (void) accumulate, (void) workspace;
        MF_ASSERT(false && "this backend has no quantized gemm");
    }
    // DoRA on a packed base (model/lora.h): dora_norm's norms (kernel_list.h) of rows col0 ..
    // col0 + b.rows - 1 of the dequantized W, dequantized a tile of rows at a time into
    // `workspace` (dora_norm_workspace bytes, fp32).
    virtual size_t dora_norm_workspace(const QuantDesc & q, int64_t cols) const {
        return size_t(std::min<int64_t>(cols, kDoraTileRows)) * size_t(q.in) * sizeof(float);
    }
    virtual void dora_norm_packed(Tensor norm, const QuantDesc & q, Tensor packed, int64_t col0, Tensor a, Tensor b,
                                  float scale, Tensor workspace) {
        (void) norm, (void) q, (void) packed, (void) col0, (void) a, (void) b, (void) scale, (void) workspace;
        MF_ASSERT(false && "this backend has no quantized gemm");
    }
    static constexpr int64_t kDoraTileRows = 64;
    // Host memory: packed (quant_bytes(q) bytes) from W [out, in] fp32, and back.
    virtual void quantize(const QuantDesc & q, void * packed, const float * W) const {
        (void) q, (void) packed, (void) W;
        MF_ASSERT(false && "this backend has no quantized gemm");
    }
    virtual void dequantize(const QuantDesc & q, float * W, const void * packed) const {
        (void) q, (void) W, (void) packed;
        MF_ASSERT(false && "this backend has no quantized gemm");
    }
};

}  // namespace memfit
