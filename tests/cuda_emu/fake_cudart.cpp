// The CUDA emulator's host side: the CUDA runtime and cuBLASLt calls memfit makes, on host
// memory. One device; device memory is host memory (cudaMalloc counts it against a fixed
// capacity, so cudaMemGetInfo is exact and running out is reproducible). Streams run kernels,
// memsets, matmuls and NCCL calls when they are issued, but defer every cudaMemcpyAsync as long
// as CUDA allows: until the next other work on its stream, a synchronization, or a stream that
// waits on an event recorded after it (cudaStreamWaitEvent); NCCL's point-to-point calls are
// posted when issued and their completion deferred the same way (fake_nccl.cpp). So a copy on a side stream that
// code forgets to wait for lands late, and the reader sees stale bytes, as it could on a GPU.
// cuBLASLt's matmul is computed from its descriptors (column-major, transposes, bias epilogue)
// as the library documents them, so gemm.cpp's mapping of row-major gemms onto it is checked.
// NCCL: fake_nccl.cpp.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>


namespace {

// Capacity and the context's share: MEMFIT_EMU_DEVICE_MIB (default 81920), of which 500 MiB (a
// quarter of a smaller device) are taken when the context is created (cudaFree(nullptr) or the
// first allocation).
constexpr size_t kContextBytes = size_t(500) << 20;

struct Device {
    std::mutex mu;
    std::map<uintptr_t, size_t> allocs;   // base -> bytes
    size_t used = 0;
    bool context = false;
    size_t capacity() const {
        const char * e = std::getenv("MEMFIT_EMU_DEVICE_MIB");
        return size_t(e ? std::strtoull(e, nullptr, 10) : 81920) << 20;
    }
    void ensure_context() {
        if (!context) {
            context = true;
            used += std::min(kContextBytes, capacity() / 4);
        }
    }
};
Device & dev() {
    static Device d;
    return d;
}
// A stream's deferred work, run in order: copies, and the completions of NCCL's point-to-point
// calls (fake_nccl.cpp: posted when issued, waited for here); `issued` counts every item queued,
// `executed` those run.
struct Stream {
    struct Item { std::function<void()> f; bool nccl; };
    std::deque<Item> queue;
    size_t issued = 0, executed = 0;
    void run_until(size_t upto) {
        while (executed < upto) {
            auto f = std::move(queue.front().f);
            queue.pop_front();
            ++executed;
            f();
        }
    }
    void drain() { run_until(issued); }
    // Everything up to the last copy: the NCCL completions queued after it stay pending.
    void drain_copies() {
        size_t last = 0;
        for (size_t i = 0; i < queue.size(); ++i)
            if (!queue[i].nccl) last = i + 1;
        run_until(executed + last);
    }
};
std::vector<Stream *> & streams() {
    static std::vector<Stream *> all{new Stream()};   // [0]: the legacy default stream (null)
    return all;
}
Stream & stream_of(cudaStream_t s) { return s ? *reinterpret_cast<Stream *>(s) : *streams().front(); }
void drain_all() {
    for (Stream * st : streams()) st->drain();
}

// An event: the copies of `stream` issued before it was recorded.
struct Event {
    Stream * stream = nullptr;
    size_t upto = 0;
};

}  // namespace

namespace emu {
void flush_stream(cudaStream_t s) { stream_of(s).drain(); }
void flush_copies(cudaStream_t s) { stream_of(s).drain_copies(); }
void defer_nccl(cudaStream_t s, std::function<void()> done) {
    Stream & st = stream_of(s);
    st.queue.push_back({std::move(done), true});
    ++st.issued;
}
}  // namespace emu

extern "C" {

cudaError_t cudaGetDeviceCount(int * n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char * cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        default: return "emulated error";
    }
}

cudaError_t cudaMalloc(void ** p, size_t bytes) {
    Device & d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    d.ensure_context();
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (d.used + bytes > d.capacity()) return cudaErrorMemoryAllocation;
    void * q = nullptr;
    if (posix_memalign(&q, 256, (bytes + 255) / 256 * 256) != 0) return cudaErrorMemoryAllocation;
    std::memset(q, 0xa5, bytes);   // not zero: code that relies on fresh memory being zero shows
    d.allocs[reinterpret_cast<uintptr_t>(q)] = bytes;
    d.used += bytes;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void * p) {
    drain_all();
    Device & d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    d.ensure_context();
    if (!p) return cudaSuccess;
    auto it = d.allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == d.allocs.end()) return cudaErrorInvalidValue;
    d.used -= it->second;
    d.allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}
// Pinned host memory: host memory, not counted against the device's capacity.
cudaError_t cudaMallocHost(void ** p, size_t bytes) {
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (posix_memalign(p, 4096, (bytes + 4095) / 4096 * 4096) != 0) return cudaErrorMemoryAllocation;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void * p) {
    drain_all();
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t * free_b, size_t * total_b) {
    Device & d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    d.ensure_context();
    *total_b = d.capacity();
    *free_b = d.capacity() - d.used;
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes * a, const void * p) {
    Device & d = dev();
    std::lock_guard<std::mutex> lock(d.mu);
    std::memset(a, 0, sizeof *a);
    const auto u = reinterpret_cast<uintptr_t>(p);
    auto it = d.allocs.upper_bound(u);
    if (it != d.allocs.begin() && u < std::prev(it)->first + std::prev(it)->second) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = const_cast<void *>(p);
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->hostPointer = const_cast<void *>(p);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t n, cudaMemcpyKind, cudaStream_t s) {
    Stream & st = stream_of(s);
    st.queue.push_back({[dst, src, n] {
                            if (n) std::memmove(dst, src, n);
                        },
                        false});
    ++st.issued;
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void * p, int v, size_t n, cudaStream_t s) {
    stream_of(s).drain();
    if (n) std::memset(p, v, n);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t * s, unsigned) {
    streams().push_back(new Stream());
    *s = reinterpret_cast<cudaStream_t>(streams().back());
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    Stream * st = &stream_of(s);
    st->drain();
    auto & all = streams();
    if (st != all.front()) {
        all.erase(std::find(all.begin(), all.end(), st));
        delete st;
    }
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    stream_of(s).drain();
    return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t, int * d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    drain_all();
    return cudaSuccess;
}
// Events mark a stream's copies issued so far; waiting on one runs them (the waiting stream's
// later work comes after them).
cudaError_t cudaEventCreateWithFlags(cudaEvent_t * e, unsigned) {
    *e = reinterpret_cast<cudaEvent_t>(new Event());
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete reinterpret_cast<Event *>(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    Event & ev = *reinterpret_cast<Event *>(e);
    ev.stream = &stream_of(s);
    ev.upto = ev.stream->issued;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
    const Event & ev = *reinterpret_cast<const Event *>(e);
    if (ev.stream) ev.stream->run_until(ev.upto);
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && value > 232448) return cudaErrorInvalidValue;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char * bus, int len, int) {
    std::snprintf(bus, size_t(len), "0000:00:00.0");
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp * p, int) {
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, "memfit CUDA emulator");
    p->totalGlobalMem = dev().capacity();
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 232448;
    p->multiProcessorCount = 132;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->major = 9;
    return cudaSuccess;
}

}  // extern "C"

// ---- cuBLASLt ----
namespace {

struct Desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void * bias = nullptr;
    cudaDataType_t bias_type = CUDA_R_32F;
};
struct Layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));

int g_handle_tag;

double load(cudaDataType_t t, const void * p, size_t i) {
    switch (t) {
        case CUDA_R_32F: return static_cast<const float *>(p)[i];
        case CUDA_R_16BF: return double(__bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]));
        case CUDA_R_16F: return double(__half2float(static_cast<const __half *>(p)[i]));
        default: std::fprintf(stderr, "cuda emulator: cuBLASLt type %d not emulated\n", int(t)); std::abort();
    }
}
void store(cudaDataType_t t, void * p, size_t i, double v) {
    switch (t) {
        case CUDA_R_32F: static_cast<float *>(p)[i] = float(v); return;
        case CUDA_R_16BF: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(float(v)); return;
        case CUDA_R_16F: static_cast<__half *>(p)[i] = __float2half_rn(float(v)); return;
        default: std::fprintf(stderr, "cuda emulator: cuBLASLt type %d not emulated\n", int(t)); std::abort();
    }
}
bool float_type(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t * h) {
    *h = reinterpret_cast<cublasLtHandle_t>(&g_handle_tag);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char * cublasLtGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulated failure"; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s) {
    auto * o = new cublasLtMatmulDescOpaque_t{};
    new (o->data) Desc{c, s};
    *d = o;
    return c == CUBLAS_COMPUTE_32F && s == CUDA_R_32F ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void * v,
                                              size_t n) {
    Desc & x = *reinterpret_cast<Desc *>(d->data);
    auto take = [&](auto & field) {
        if (n != sizeof field) return CUBLAS_STATUS_INVALID_VALUE;
        std::memcpy(&field, v, n);
        return CUBLAS_STATUS_SUCCESS;
    };
    switch (a) {
        case CUBLASLT_MATMUL_DESC_TRANSA: return take(x.ta);
        case CUBLASLT_MATMUL_DESC_TRANSB: return take(x.tb);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(x.epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(x.bias);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return take(x.bias_type);
        default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    auto * o = new cublasLtMatrixLayoutOpaque_t{};
    new (o->data) Layout{t, rows, cols, ld};
    *l = o;
    return ld >= int64_t(rows) || cols <= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t * p) {
    *p = new cublasLtMatmulPreferenceOpaque_t{};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}

// Checks the shapes as cuBLASLt would: D (m x n) = op(A) (m x k) op(B) (k x n).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t * result, int * found) {
    const Desc & x = *reinterpret_cast<const Desc *>(d->data);
    const Layout & A = *reinterpret_cast<const Layout *>(a->data);
    const Layout & B = *reinterpret_cast<const Layout *>(b->data);
    const Layout & C = *reinterpret_cast<const Layout *>(c->data);
    const Layout & D = *reinterpret_cast<const Layout *>(dl->data);
    *found = 0;
    const uint64_t m = x.ta == CUBLAS_OP_N ? A.rows : A.cols, k = x.ta == CUBLAS_OP_N ? A.cols : A.rows;
    const uint64_t kb = x.tb == CUBLAS_OP_N ? B.rows : B.cols, n = x.tb == CUBLAS_OP_N ? B.cols : B.rows;
    if (k != kb || C.rows != m || C.cols != n || D.rows != m || D.cols != n || A.type != B.type || C.type != D.type ||
        !float_type(A.type) || !float_type(C.type))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    std::memset(result, 0, sizeof *result);
    result->state = CUBLAS_STATUS_SUCCESS;
    result->wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void * alpha, const void * a,
                              cublasLtMatrixLayout_t al, const void * b, cublasLtMatrixLayout_t bl, const void * beta,
                              const void * c, cublasLtMatrixLayout_t cl, void * out, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t stream) {
    stream_of(stream).drain();
    const Desc & x = *reinterpret_cast<const Desc *>(d->data);
    const Layout & A = *reinterpret_cast<const Layout *>(al->data);
    const Layout & B = *reinterpret_cast<const Layout *>(bl->data);
    const Layout & C = *reinterpret_cast<const Layout *>(cl->data);
    const Layout & D = *reinterpret_cast<const Layout *>(dl->data);
    const uint64_t m = D.rows, n = D.cols, k = x.ta == CUBLAS_OP_N ? A.cols : A.rows;
    const bool bias = x.epilogue == CUBLASLT_EPILOGUE_BIAS;
    if (x.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !bias) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (bias && (!x.bias || x.bias_type != D.type)) return CUBLAS_STATUS_INVALID_VALUE;
    const double al_v = *static_cast<const float *>(alpha), be_v = *static_cast<const float *>(beta);
    // D(i, j) = alpha sum_p op(A)(i, p) op(B)(p, j) in double, p in order. Rows of op(A) (kRows at
    // a time) and each column of op(B) are first converted to doubles, so that the sum is a
    // contiguous loop: the same sums as the plain triple loop, about 10x sooner.
    constexpr uint64_t kRows = 256;
    std::vector<double> rows_a;
    for (uint64_t i0 = 0; i0 < m; i0 += kRows) {
        const uint64_t rows = std::min(kRows, m - i0);
        rows_a.resize(rows * k);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < int64_t(rows); ++r)
            for (uint64_t p = 0; p < k; ++p) {
                const uint64_t i = i0 + uint64_t(r);
                rows_a[uint64_t(r) * k + p] = load(A.type, a, x.ta == CUBLAS_OP_N ? i + p * uint64_t(A.ld) : p + i * uint64_t(A.ld));
            }
#pragma omp parallel
        {
            std::vector<double> col(k);
#pragma omp for schedule(static)
            for (int64_t j = 0; j < int64_t(n); ++j) {
                for (uint64_t p = 0; p < k; ++p)
                    col[p] = load(B.type, b, x.tb == CUBLAS_OP_N ? p + uint64_t(j) * uint64_t(B.ld) : uint64_t(j) + p * uint64_t(B.ld));
                for (uint64_t r = 0; r < rows; ++r) {
                    const double * ar = rows_a.data() + r * k;
                    double s = 0.0;
                    for (uint64_t p = 0; p < k; ++p) s += ar[p] * col[p];
                    const uint64_t i = i0 + r;
                    double v = al_v * s;
                    if (be_v != 0.0) v += be_v * load(C.type, c, i + uint64_t(j) * uint64_t(C.ld));
                    if (bias) v += load(x.bias_type, x.bias, i);
                    store(D.type, out, i + uint64_t(j) * uint64_t(D.ld), v);
                }
            }
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
