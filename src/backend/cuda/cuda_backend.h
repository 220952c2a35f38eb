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
    // The kernels (backend/kernel_list.h).
#define MF_KERNEL(name, params) void name params override;
#include "backend/kernel_list.h"
#undef MF_KERNEL
    size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH, DType storage) const override;
    std::string flash_attention_refusal(int head_dim) const override;
    size_t qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const override;
    void dora_norm_packed(Tensor norm, const QuantDesc & q, Tensor packed, int64_t col0, Tensor a, Tensor b, float scale,
                          Tensor workspace) override;
    void qgemm_fwd(const QuantDesc & q, Tensor y, Tensor x, Tensor packed, Tensor bias, Tensor workspace) override;
    void qgemm_bwd(const QuantDesc & q, Tensor dx, Tensor dy, Tensor packed, bool accumulate,
                   Tensor workspace) override;
    void quantize(const QuantDesc & q, void * packed, const float * W) const override;
    void dequantize(const QuantDesc & q, float * W, const void * packed) const override;

    struct State;   // CUDA handles (cuda_backend.cpp)

private:
    int device_ = 0;
    CudaRuntimeMemory runtime_;
    std::unique_ptr<State> st_;
};

}  // namespace memfit
