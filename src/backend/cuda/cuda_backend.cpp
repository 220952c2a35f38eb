// CudaBackend: start-up (device, stream, cuBLASLt, runtime memory), the region allocator, host
// transfers, and the ops, each forwarded to its launcher (kernels.h) or to cuBLASLt (gemm.cpp).
#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda_sizing.h"
#include "core/units.h"
#include "memory/budget.h"

namespace memfit {

[[noreturn]] void cuda::fail(const char * file, int line, const char * library, const char * call, int code,
                             const char * message) {
    const std::string msg = fmt::format("{} call failed: {}: {} (status {})", library, call, message ? message : "?", code);
    abort_with(file, line, msg.c_str());
}

int cuda_device_count(std::string * why) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why) *why = e != cudaSuccess ? fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(e))
                                         : std::string("cudaGetDeviceCount found no device");
        return 0;
    }
    return n;
}

namespace {

// One cudaMalloc per region (never managed memory); running out is an expected failure.
class DeviceAllocator final : public RegionAllocator {
public:
    explicit DeviceAllocator(cudaStream_t s) : stream_(s) {}
    void * allocate(size_t bytes) override {
        if (bytes == 0) return nullptr;
        void * p = nullptr;
        const cudaError_t e = cudaMalloc(&p, bytes);
        if (e == cudaErrorMemoryAllocation) {
            (void) cudaGetLastError();   // clear it
            size_t free_b = 0, total_b = 0;
            MF_CUDA(cudaMemGetInfo(&free_b, &total_b));
            throw OutOfMemory(fmt::format("out of GPU memory: cudaMalloc of {} failed with {} free of {}; lower "
                                          "--batch or --seq, add --recompute, or pass --memory-budget to check the "
                                          "plan first", format_bytes(bytes), format_bytes(free_b), format_bytes(total_b)));
        }
        MF_CUDA(e);
        return p;
    }
    void release(void * p, size_t) override {
        if (!p) return;
        MF_CUDA(cudaStreamSynchronize(stream_));
        MF_CUDA(cudaFree(p));
    }
    void poison(void * p, size_t bytes) override { MF_CUDA(cudaMemsetAsync(p, 0xff, bytes, stream_)); }

private:
    cudaStream_t stream_;
};

// Pinned host memory for the offloaded optimizer states: DMA at the link's full rate.
class PinnedAllocator final : public RegionAllocator {
public:
    explicit PinnedAllocator(cudaStream_t s) : stream_(s) {}
    void * allocate(size_t bytes) override {
        if (bytes == 0) return nullptr;
        void * p = nullptr;
        const cudaError_t e = cudaMallocHost(&p, bytes);
        if (e == cudaErrorMemoryAllocation) {
            (void) cudaGetLastError();
            throw OutOfMemory(fmt::format("out of pinned host memory: cudaMallocHost of {} failed for --offload "
                                          "optimizer; lower --offload-fraction, or free host memory",
                                          format_bytes(bytes)));
        }
        MF_CUDA(e);
        return p;
    }
    void release(void * p, size_t) override {
        if (!p) return;
        MF_CUDA(cudaStreamSynchronize(stream_));
        MF_CUDA(cudaFreeHost(p));
    }

private:
    cudaStream_t stream_;
};

// Unallocated memory on the device as NVML sees it, before this process creates a CUDA context
// there (0 when NVML, part of the driver, cannot be loaded). Free memory, not NVML's "used": that
// one (nvmlMemory_t) counts the driver's and firmware's reserved memory, which cudaMemGetInfo's
// total leaves out (1.1 GiB on an H200 with driver 580), so free is the figure both APIs share.
uint64_t nvml_free(int device) {
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, int(sizeof bus), device) != cudaSuccess) return 0;
    void * lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    using init_t = int (*)();
    using handle_t = int (*)(const char *, void **);
    struct Mem { unsigned long long total, free, used; };
    using info_t = int (*)(void *, Mem *);
    auto init = reinterpret_cast<init_t>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<handle_t>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto info = reinterpret_cast<info_t>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    auto shutdown = reinterpret_cast<init_t>(dlsym(lib, "nvmlShutdown"));
    uint64_t free_b = 0;
    void * h = nullptr;
    Mem m{};
    if (init && by_bus && info && init() == 0) {
        if (by_bus(bus, &h) == 0 && info(h, &m) == 0) free_b = m.free;
        if (shutdown) shutdown();
    }
    dlclose(lib);
    return free_b;
}


}  // namespace

struct CudaBackend::State {
    cudaStream_t stream = nullptr;
    // Offload's copies (copy_start): their own stream, ordered after the compute stream's work by
    // `issued`, and one event per slot that the compute stream waits on at copy_wait.
    cudaStream_t copies = nullptr;
    cudaEvent_t issued = nullptr;
    std::vector<cudaEvent_t> done;
    std::unique_ptr<DeviceAllocator> alloc;
    std::unique_ptr<PinnedAllocator> pinned;
    std::unique_ptr<cuda::Gemm> gemm;
};

CudaBackend::CudaBackend(int device) : device_(device), st_(std::make_unique<State>()) {
    std::string why;
    const int n = cuda_device_count(&why);
    if (n == 0) throw ConfigError("--device cuda: no CUDA device (" + why + "); train on the CPU (the default)");
    if (device < 0) throw ConfigError(fmt::format("--device cuda: device {} does not exist ({} found)", device, n));
    device %= n;
    device_ = device;
    const uint64_t free_before = nvml_free(device);
    MF_CUDA(cudaSetDevice(device));
    MF_CUDA(cudaFree(nullptr));   // creates the context
    MF_CUDA(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
    MF_CUDA(cudaStreamCreateWithFlags(&st_->copies, cudaStreamNonBlocking));
    MF_CUDA(cudaEventCreateWithFlags(&st_->issued, cudaEventDisableTiming));
    st_->alloc = std::make_unique<DeviceAllocator>(st_->stream);
    st_->pinned = std::make_unique<PinnedAllocator>(st_->stream);
    st_->gemm = std::make_unique<cuda::Gemm>();
    MF_CUDA(cudaDeviceSynchronize());
    size_t free_b = 0, total_b = 0;
    MF_CUDA(cudaMemGetInfo(&free_b, &total_b));
    runtime_.total = total_b;
    runtime_.used_after = uint64_t(total_b - free_b);
    // What was in use before the context, in cudaMemGetInfo's terms (its total less the free
    // memory NVML saw then); 0 when NVML could not say.
    runtime_.used_before = free_before > 0 && free_before < total_b ? uint64_t(total_b) - free_before : 0;
}

CudaBackend::~CudaBackend() {
    if (st_->copies) (void) cudaStreamSynchronize(st_->copies);
    if (st_->stream) {
        (void) cudaStreamSynchronize(st_->stream);
        st_->gemm.reset();
        (void) cudaStreamDestroy(st_->stream);
    }
    for (cudaEvent_t e : st_->done) (void) cudaEventDestroy(e);
    if (st_->issued) (void) cudaEventDestroy(st_->issued);
    if (st_->copies) (void) cudaStreamDestroy(st_->copies);
}

RegionAllocator & CudaBackend::allocator() { return *st_->alloc; }

void CudaBackend::upload(void * dst, const void * host_src, size_t bytes) {
    if (bytes == 0) return;
    MF_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, st_->stream));
    MF_CUDA(cudaStreamSynchronize(st_->stream));
}

void CudaBackend::download(void * host_dst, const void * src, size_t bytes) {
    if (bytes == 0) return;
    MF_CUDA(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, st_->stream));
    MF_CUDA(cudaStreamSynchronize(st_->stream));
}

RegionAllocator & CudaBackend::offload_allocator() { return *st_->pinned; }

// After the compute stream's work so far (a read's staging buffer is free, a write's data is
// computed), on the copy stream; the slot's event marks it done.
void CudaBackend::copy_start(int slot, void * dst, const void * src, size_t bytes, bool to_device) {
    MF_ASSERT(slot >= 0);
    if (bytes == 0) return;
    while (st_->done.size() <= size_t(slot)) {
        cudaEvent_t e = nullptr;
        MF_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        st_->done.push_back(e);
    }
    MF_CUDA(cudaEventRecord(st_->issued, st_->stream));
    MF_CUDA(cudaStreamWaitEvent(st_->copies, st_->issued, 0));
    MF_CUDA(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, st_->copies));
    MF_CUDA(cudaEventRecord(st_->done[size_t(slot)], st_->copies));
}

// The compute stream's later work waits for the slot's copies (the copy stream runs them in
// order, so its last event covers every one started before).
void CudaBackend::copy_wait(int slot) {
    if (size_t(slot) < st_->done.size()) MF_CUDA(cudaStreamWaitEvent(st_->stream, st_->done[size_t(slot)], 0));
}

void CudaBackend::synchronize() {
    MF_CUDA(cudaStreamSynchronize(st_->copies));
    MF_CUDA(cudaStreamSynchronize(st_->stream));
}
void * CudaBackend::stream() const { return st_->stream; }

uint64_t CudaBackend::device_used() const {
    size_t free_b = 0, total_b = 0;
    MF_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return uint64_t(total_b - free_b);
}

uint64_t CudaBackend::device_free() const {
    size_t free_b = 0, total_b = 0;
    MF_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

uint64_t CudaBackend::device_used_delta() const {
    const uint64_t used = device_used();
    return used > runtime_.used_before ? used - runtime_.used_before : 0;
}

void CudaBackend::remeasure_runtime() {
    MF_CUDA(cudaDeviceSynchronize());
    runtime_.used_after = device_used();
}

std::string CudaBackend::device_name() const {
    cudaDeviceProp p{};
    MF_CUDA(cudaGetDeviceProperties(&p, device_));
    return p.name;
}

size_t CudaBackend::gemm_workspace(const GemmDesc & d) const { return cuda_gemm_workspace(d); }
size_t CudaBackend::flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH, DType) const {
    return cuda_flash_attention_workspace(B, T, C, NH);
}
std::string CudaBackend::flash_attention_refusal(int head_dim) const { return cuda_flash_attention_refusal(head_dim); }
size_t CudaBackend::qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const {
    return cuda_qgemm_workspace(q, M, act);
}

void CudaBackend::fill_zero(Tensor t) {
    if (t.nbytes()) MF_CUDA(cudaMemsetAsync(t.data, 0, t.nbytes(), st_->stream));
}

void CudaBackend::gemm(const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace) {
    MF_ASSERT(d.lda == 0);   // packed A only (native_gemm says no: no strided bf16 logit gradients)
    st_->gemm->run(st_->stream, d, c, a, b, bias, workspace);
}

// QLoRA's frozen base (and a quantized decoder's projections): W' is dequantized tile by tile
// (cuda_qgemm_tile_rows rows) into the workspace and each tile multiplied at once, never whole.
// Forward: y[:, o0:o0+R] = x . tile^T (+ bias[o0:o0+R]), a column slice of y (ldc = out).
// Backward: dx (+)= dy[:, o0:o0+R] . tile, over the tiles in turn (dy read with lda = out).
namespace {

// Each tile of W' in `dt`, dequantized into the workspace, with its first row: f(o0, tile).
template <class F>
void for_each_tile(cudaStream_t s, const QuantDesc & q, DType dt, Tensor packed, Tensor workspace, F && f) {
    const int64_t R = cuda_qgemm_tile_rows(q);
    for (int64_t o0 = 0; o0 < q.out; o0 += R) {
        Tensor w(-1, dt, {std::min(R, q.out - o0), q.in});
        w.data = workspace.data;
        cuda::dequantize(s, q, w, packed, o0);
        f(o0, w);
    }
}

// t advanced by `elems` elements of its dtype (a column offset into a row-major matrix).
Tensor offset(Tensor t, int64_t elems) {
    if (t.valid()) t.data = static_cast<uint8_t *>(t.data) + elems * int64_t(dtype_size(t.dtype));
    return t;
}

}  // namespace

void CudaBackend::qgemm_fwd(const QuantDesc & q, Tensor y, Tensor x, Tensor packed, Tensor bias, Tensor workspace) {
    MF_ASSERT(workspace.data != nullptr && workspace.nbytes() >= cuda_qgemm_workspace(q, x.rows(), x.dtype));
    for_each_tile(st_->stream, q, x.dtype, packed, workspace, [&](int64_t o0, Tensor w) {
        GemmDesc d;
        d.M = x.rows(), d.N = w.rows(), d.K = q.in, d.trans_b = true, d.bias = bias.valid();
        d.a = x.dtype, d.b = x.dtype, d.c = y.dtype;
        st_->gemm->run(st_->stream, d, offset(y, o0), x, w, offset(bias, o0), Tensor{}, q.out);
    });
}

void CudaBackend::qgemm_bwd(const QuantDesc & q, Tensor dx, Tensor dy, Tensor packed, bool accumulate,
                            Tensor workspace) {
    MF_ASSERT(workspace.data != nullptr && workspace.nbytes() >= cuda_qgemm_workspace(q, dy.rows(), dy.dtype));
    for_each_tile(st_->stream, q, dy.dtype, packed, workspace, [&](int64_t o0, Tensor w) {
        GemmDesc d;
        d.M = dy.rows(), d.N = q.in, d.K = w.rows(), d.accumulate = accumulate || o0 > 0, d.lda = q.out;
        d.a = dy.dtype, d.b = dy.dtype, d.c = dx.dtype;
        st_->gemm->run(st_->stream, d, dx, offset(dy, o0), w, Tensor{}, Tensor{});
    });
}

// DoRA's norms on a packed base: kDoraTileRows rows at a time dequantized to fp32 in the
// workspace, dora_norm over each tile (a tile of 4-bit or 2:4 weights starts on 8 elements:
// run/compat.cpp asks the inputs to be a multiple of 8).
void CudaBackend::dora_norm_packed(Tensor norm, const QuantDesc & q, Tensor packed, int64_t col0, Tensor a, Tensor b,
                                   float scale, Tensor workspace) {
    const int64_t cols = b.dim(0), r = b.dim(1);
    MF_ASSERT(norm.numel() == cols && col0 + cols <= q.out && workspace.nbytes() >= dora_norm_workspace(q, cols));
    for (int64_t t0 = 0; t0 < cols; t0 += kDoraTileRows) {
        const int64_t n = std::min(kDoraTileRows, cols - t0);
        Tensor w(-1, DType::f32, {n, q.in});
        w.data = workspace.data;
        cuda::dequantize(st_->stream, q, w, packed, col0 + t0);
        Tensor nt(-1, DType::f32, {n}), bt(-1, b.dtype, {n, r});
        nt.data = offset(norm, t0).data;
        bt.data = offset(b, t0 * r).data;
        cuda::dora_norm(st_->stream, nt, w, false, 0, a, bt, scale);
    }
}

void CudaBackend::quantize(const QuantDesc & q, void * packed, const float * W) const {
    auto * out = static_cast<uint8_t *>(packed);
    with_quant(q, [&](const auto & Q) { Q.quantize(out, W); });
}

void CudaBackend::dequantize(const QuantDesc & q, float * W, const void * packed) const {
    const auto * in = static_cast<const uint8_t *>(packed);
    with_quant(q, [&](const auto & Q) { Q.dequantize_rows(W, in, 0, q.out); });
}

// ---- the rest forward to their launchers ----
#define MF_FWD(op, ...) cuda::op(st_->stream, __VA_ARGS__)

void CudaBackend::copy(Tensor dst, Tensor src) { MF_FWD(copy, dst, src); }
void CudaBackend::bias_grad(Tensor dbias, Tensor dout) { MF_FWD(bias_grad, dbias, dout); }
void CudaBackend::encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start) {
    MF_FWD(encoder_fwd, out, tokens, wte, wpe, doc_start);
}
void CudaBackend::encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start) {
    MF_FWD(encoder_bwd, dwte, dwpe, dout, tokens, doc_start);
}
void CudaBackend::vocab_encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo) {
    MF_FWD(vocab_encoder_fwd, out, tokens, wte, wpe, vocab_lo);
}
void CudaBackend::vocab_encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo) {
    MF_FWD(vocab_encoder_bwd, dwte, dwpe, dout, tokens, vocab_lo);
}
void CudaBackend::layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
    MF_FWD(layernorm_fwd, out, mean, rstd, inp, w, b, eps);
}
void CudaBackend::layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                Tensor rstd) {
    MF_FWD(layernorm_bwd, dinp, dw, db, dout, inp, w, mean, rstd);
}
void CudaBackend::attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start) {
    MF_FWD(attention_fwd, out, att, qkv, NH, doc_start);
}
void CudaBackend::attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH,
                                Tensor doc_start) {
    MF_FWD(attention_bwd, dqkv, scratch, dout, qkv, att, NH, doc_start);
}
void CudaBackend::flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start) {
    MF_FWD(flash_attention_fwd, out, lse, qkv, NH, doc_start);
}
void CudaBackend::flash_attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse,
                                      int NH, Tensor doc_start) {
    MF_FWD(flash_attention_bwd, dqkv, scratch, dout, out, qkv, lse, NH, doc_start);
}
void CudaBackend::gelu_fwd(Tensor out, Tensor inp, Gelu kind) { MF_FWD(gelu_fwd, out, inp, kind); }
void CudaBackend::gelu_bwd(Tensor dinp, Tensor dout, Tensor inp, Gelu kind) { MF_FWD(gelu_bwd, dinp, dout, inp, kind); }
void CudaBackend::residual_fwd(Tensor out, Tensor a, Tensor b) { MF_FWD(residual_fwd, out, a, b); }
void CudaBackend::rmsnorm_fwd(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) {
    MF_FWD(rmsnorm_fwd, out, rstd, inp, w, eps);
}
void CudaBackend::rmsnorm_bwd(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) {
    MF_FWD(rmsnorm_bwd, dinp, dw, dout, inp, w, rstd);
}
void CudaBackend::qk_norm_fwd(Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps) {
    MF_FWD(qk_norm_fwd, qkv, raw, rstd, wq, wk, NH, KVH, eps);
}
void CudaBackend::qk_norm_bwd(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd,
                              int NH, int KVH) {
    MF_FWD(qk_norm_bwd, dqkv, dwq, dwk, raw, wq, wk, rstd, NH, KVH);
}
void CudaBackend::rope_fwd(Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    MF_FWD(rope_fwd, qkv, NH, KVH, rope, pos0, doc_start);
}
void CudaBackend::rope_bwd(Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    MF_FWD(rope_bwd, dqkv, NH, KVH, rope, pos0, doc_start);
}
void CudaBackend::swiglu_fwd(Tensor out, Tensor inp) { MF_FWD(swiglu_fwd, out, inp); }
void CudaBackend::swiglu_bwd(Tensor dinp, Tensor dout, Tensor inp) { MF_FWD(swiglu_bwd, dinp, dout, inp); }
void CudaBackend::geglu_fwd(Tensor out, Tensor inp) { MF_FWD(geglu_fwd, out, inp); }
void CudaBackend::geglu_bwd(Tensor dinp, Tensor dout, Tensor inp) { MF_FWD(geglu_bwd, dinp, dout, inp); }
void CudaBackend::repeat_kv_fwd(Tensor full, Tensor qkv, int NH, int KVH) { MF_FWD(repeat_kv_fwd, full, qkv, NH, KVH); }
void CudaBackend::repeat_kv_bwd(Tensor dqkv, Tensor dfull, int NH, int KVH) {
    MF_FWD(repeat_kv_bwd, dqkv, dfull, NH, KVH);
}
void CudaBackend::cached_attention_fwd(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH,
                                       int KVH, int window) {
    MF_FWD(cached_attention_fwd, out, qkv, kcache, vcache, pos0, NH, KVH, window);
}
void CudaBackend::paged_attention_fwd(Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta,
                                      const PagedKv & kv, int NH, int KVH, int window) {
    MF_FWD(paged_attention_fwd, out, qkv, kpool, vpool, meta, kv, NH, KVH, window);
}
void CudaBackend::cp_attention_fwd(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH) {
    MF_FWD(cp_attention_fwd, out, lse, qkv, kv, meta, NH, KVH);
}
void CudaBackend::cp_attention_bwd(Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv,
                                   Tensor kv, Tensor lse, Tensor meta, int NH, int KVH) {
    MF_FWD(cp_attention_bwd, dqkv, dkv, scratch, dout, out, qkv, kv, lse, meta, NH, KVH);
}
void CudaBackend::cp_block_fwd(Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH, int KVH,
                               bool first) {
    MF_FWD(cp_block_fwd, acc, lse, qkv, kv, kpos, meta, NH, KVH, first);
}
void CudaBackend::cp_block_bwd(Tensor dq, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor kv,
                               Tensor lse, Tensor kpos, Tensor meta, int NH, int KVH) {
    MF_FWD(cp_block_bwd, dq, dkv, scratch, dout, out, qkv, kv, lse, kpos, meta, NH, KVH);
}
void CudaBackend::cp_qkv_grad(Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH) { MF_FWD(cp_qkv_grad, dqkv, dq, dkv, NH, KVH); }
void CudaBackend::moe_route(Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d) {
    MF_FWD(moe_route, route, wts, stats, logits, d);
}
void CudaBackend::moe_route_bwd(Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts, Tensor stats_all,
                                const MoeDesc & d) {
    MF_FWD(moe_route_bwd, dlogits, dwts, logits, route, wts, stats_all, d);
}
void CudaBackend::moe_gather(Tensor out, Tensor x, Tensor route, const MoeDesc & d) { MF_FWD(moe_gather, out, x, route, d); }
void CudaBackend::moe_scatter(Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate) {
    MF_FWD(moe_scatter, dx, dxs, route, d, accumulate);
}
void CudaBackend::moe_combine(Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d) {
    MF_FWD(moe_combine, out, y, wts, route, d);
}
void CudaBackend::moe_weight_bwd(Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route,
                                 const MoeDesc & d) {
    MF_FWD(moe_weight_bwd, dwts, g, dys, act, wts, route, d);
}
void CudaBackend::moe_counts(Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d) {
    MF_FWD(moe_counts, counts, stats, route, wts, d);
}
void CudaBackend::sigmoid_gate_fwd(Tensor out, Tensor y, Tensor logit) { MF_FWD(sigmoid_gate_fwd, out, y, logit); }
void CudaBackend::sigmoid_gate_bwd(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit) {
    MF_FWD(sigmoid_gate_bwd, dy, dlogit, dout, y, logit);
}
void CudaBackend::dropout(Tensor out, Tensor in, float p, uint64_t seed) { MF_FWD(dropout, out, in, p, seed); }
void CudaBackend::add_columns(Tensor out, Tensor d, int64_t col0, float scale) {
    MF_FWD(add_columns, out, d, col0, scale);
}
void CudaBackend::take_columns(Tensor d, Tensor src, int64_t col0, float scale) {
    MF_FWD(take_columns, d, src, col0, scale);
}
void CudaBackend::dora_norm(Tensor norm, Tensor w, bool w_in_out, int64_t col0, Tensor a, Tensor b, float scale) {
    MF_FWD(dora_norm, norm, w, w_in_out, col0, a, b, scale);
}
void CudaBackend::dora_scale_fwd(Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0) {
    MF_FWD(dora_scale_fwd, out, z, bias, mag, norm, col0);
}
void CudaBackend::dora_scale_bwd(Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0) {
    MF_FWD(dora_scale_bwd, dout, dmag, z, mag, norm, col0);
}
void CudaBackend::xent_fwd(Tensor losses, Tensor logits, Tensor targets) { MF_FWD(xent_fwd, losses, logits, targets); }
void CudaBackend::xent_bwd(Tensor probs, Tensor targets, float dloss) { MF_FWD(xent_bwd, probs, targets, dloss); }
void CudaBackend::xent_fwd_bwd(Tensor losses, Tensor logits, Tensor targets, float dloss) {
    // The two kernels in turn (a fused kernel would save one read of the logits in HBM).
    xent_fwd(losses, logits, targets);
    xent_bwd(logits, targets, dloss);
}
void CudaBackend::xent_shard_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab) {
    MF_FWD(xent_shard_stats, stats, logits, targets, vocab_lo, vocab);
}
void CudaBackend::xent_shard_loss(Tensor losses, Tensor lse, Tensor gathered, Tensor targets) {
    MF_FWD(xent_shard_loss, losses, lse, gathered, targets);
}
void CudaBackend::xent_shard_bwd(Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab,
                                 float dloss) {
    MF_FWD(xent_shard_bwd, logits, targets, lse, vocab_lo, vocab, dloss);
}
void CudaBackend::distill_fwd(Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                              float temperature) {
    MF_FWD(distill_fwd, losses, stats, logits, teacher, targets, alpha, temperature);
}
void CudaBackend::distill_bwd(Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha,
                              float temperature, float dloss) {
    MF_FWD(distill_bwd, logits, stats, teacher_probs, targets, alpha, temperature, dloss);
}
void CudaBackend::row_logps(Tensor out, Tensor losses) { MF_FWD(row_logps, out, losses); }
void CudaBackend::dpo_loss(Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d) {
    MF_FWD(dpo_loss, losses, scale, logps, ref, targets, d);
}
void CudaBackend::xent_grad_rows(Tensor logits, Tensor targets, Tensor scale) {
    MF_FWD(xent_grad_rows, logits, targets, scale);
}
void CudaBackend::sum_squares(Tensor out, Tensor x) { MF_FWD(sum_squares, out, x); }
void CudaBackend::optimizer_step(Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states, Tensor norm_sq,
                                 Tensor param_copy, const OptimHyper & h) {
    MF_FWD(optimizer_step, o, param, grad, states, norm_sq, param_copy, h);
}

#undef MF_FWD

}  // namespace memfit
