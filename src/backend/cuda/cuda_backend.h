// The CUDA backend: cuBLASLt gemms and the kernels of kernels.h, on one stream of one device.
// Its regions come from cudaMalloc, one per region (device_allocator.h); the engine moves bytes
// to and from them with upload/download. Built when MEMFIT_HAVE_CUDA is defined (CMake option
// MEMFIT_CUDA); this header includes no CUDA header, so any translation unit may include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace memfit {

// Device memory that is not the plan's: the CUDA context, the cuBLASLt handle and NCCL's
// buffers, measured with cudaMemGetInfo (used = total - free) around start-up.
struct CudaRuntimeMemory {
    uint64_t used_before = 0;   // used on the device before this process's context: cudaMemGetInfo's
                                // total less NVML's free memory then (0: NVML unavailable)
    uint64_t used_after = 0;    // used once the backend is ready
    uint64_t total = 0;         // the device's memory
    uint64_t runtime() const { return used_after > used_before ? used_after - used_before : 0; }
};

// How many CUDA devices this process sees; 0 with the reason in `why` (no driver, no device).
int cuda_device_count(std::string * why = nullptr);

class CudaBackend final : public Backend {
public:
    // Starts CUDA on device `device` modulo the devices present (ConfigError if there are none);
    // measures the runtime memory.
    explicit CudaBackend(int device = 0);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend &) = delete;
    CudaBackend & operator=(const CudaBackend &) = delete;

    const char * name() const override { return "cuda"; }
    bool host_memory() const override { return false; }
    bool native_16bit_sums() const override { return true; }   // NCCL's ncclSum on bf16 / f16
    RegionAllocator & allocator() override;
    void upload(void * dst, const void * host_src, size_t bytes) override;
    void download(void * host_dst, const void * src, size_t bytes) override;
    RegionAllocator & offload_allocator() override;   // pinned host memory (cudaMallocHost)
    void copy_start(int slot, void * dst, const void * src, size_t bytes, bool to_device) override;
    void copy_wait(int slot) override;
    void synchronize() override;

    uint64_t device_free() const override;
    uint64_t runtime_bytes() const override { return runtime_.runtime(); }
    uint64_t device_used_delta() const override;
    // Measures the runtime memory again (after NCCL has set up its buffers, say).
    void remeasure_runtime();

    // The stream every op is issued on (a cudaStream_t), for NCCL and the tests.
    void * stream() const;
    int device() const { return device_; }
    const CudaRuntimeMemory & runtime_memory() const { return runtime_; }
    // Device memory in use right now (cudaMemGetInfo: total - free), and the device's name.
    uint64_t device_used() const;
    std::string device_name() const;

    size_t gemm_workspace(const GemmDesc & d) const override;
    void fill_zero(Tensor t) override;
    void copy(Tensor dst, Tensor src) override;
    void gemm(const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace) override;
    void bias_grad(Tensor dbias, Tensor dout) override;
    void encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start = {}) override;
    void encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start = {}) override;
    void vocab_encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo) override;
    void vocab_encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo) override;
    void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) override;
    void layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                       Tensor rstd) override;
    void attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start = {}) override;
    void attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH,
                       Tensor doc_start = {}) override;
    void flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start = {}) override;
    void flash_attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse,
                             int NH, Tensor doc_start = {}) override;
    size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH) const override;
    std::string flash_attention_refusal(int head_dim) const override;
    void gelu_fwd(Tensor out, Tensor inp) override;
    void gelu_bwd(Tensor dinp, Tensor dout, Tensor inp) override;
    void residual_fwd(Tensor out, Tensor a, Tensor b) override;
    void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) override;
    void rmsnorm_bwd(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) override;
    void qk_norm_fwd(Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps) override;
    void qk_norm_bwd(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd, int NH,
                     int KVH) override;
    void rope_fwd(Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {}) override;
    void rope_bwd(Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {}) override;
    void swiglu_fwd(Tensor out, Tensor inp) override;
    void swiglu_bwd(Tensor dinp, Tensor dout, Tensor inp) override;
    void repeat_kv_fwd(Tensor full, Tensor qkv, int NH, int KVH) override;
    void repeat_kv_bwd(Tensor dqkv, Tensor dfull, int NH, int KVH) override;
    void cached_attention_fwd(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH,
                              int KVH, int window = 0) override;
    size_t qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const override;
    void qgemm_fwd(const QuantDesc & q, Tensor y, Tensor x, Tensor packed, Tensor bias, Tensor workspace) override;
    void qgemm_bwd(const QuantDesc & q, Tensor dx, Tensor dy, Tensor packed, bool accumulate,
                   Tensor workspace) override;
    void quantize(const QuantDesc & q, void * packed, const float * W) const override;
    void dequantize(const QuantDesc & q, float * W, const void * packed) const override;
    void dropout(Tensor out, Tensor in, float p, uint64_t seed) override;
    void add_columns(Tensor out, Tensor d, int64_t col0, float scale) override;
    void take_columns(Tensor d, Tensor src, int64_t col0, float scale) override;
    void xent_fwd(Tensor losses, Tensor logits, Tensor targets) override;
    void xent_bwd(Tensor probs, Tensor targets, float dloss) override;
    void xent_shard_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab) override;
    void xent_shard_loss(Tensor losses, Tensor lse, Tensor gathered, Tensor targets) override;
    void xent_shard_bwd(Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab,
                        float dloss) override;
    void distill_fwd(Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                     float temperature) override;
    void distill_bwd(Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha, float temperature,
                     float dloss) override;
    void sum_squares(Tensor out, Tensor x) override;
    void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor norm_sq, Tensor param_copy,
               const AdamWHyper & h) override;
    void sgd(Tensor param, Tensor grad, Tensor buf, Tensor norm_sq, Tensor param_copy, const AdamWHyper & h) override;
    void adamw_8bit(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor m_scale, Tensor v_scale, Tensor norm_sq,
                    Tensor param_copy, const AdamWHyper & h) override;

    struct State;   // CUDA handles (cuda_backend.cpp)

private:
    int device_ = 0;
    CudaRuntimeMemory runtime_;
    std::unique_ptr<State> st_;
};

}  // namespace memfit
