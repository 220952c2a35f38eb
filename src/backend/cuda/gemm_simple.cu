// The fallback gemm: one thread per element of C, fp32 accumulation, any float dtypes (read
// and written through a dtype switch: one kernel, not one per dtype triple). Slow; it runs only
// for dtype mixes cuBLASLt does not take (gemm.cpp says which).
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.h"

namespace memfit::cuda {

namespace {

__device__ __forceinline__ float load_any(const void * p, DType t, int64_t i) {
    if (t == DType::bf16) return ld(static_cast<const __nv_bfloat16 *>(p)[i]);
    if (t == DType::f16) return ld(static_cast<const __half *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

__device__ __forceinline__ void store_any(void * p, DType t, int64_t i, float f) {
    if (t == DType::bf16) static_cast<__nv_bfloat16 *>(p)[i] = st<__nv_bfloat16>(f);
    else if (t == DType::f16) static_cast<__half *>(p)[i] = st<__half>(f);
    else static_cast<float *>(p)[i] = f;
}

__global__ void gemm_simple_kernel(void * c, const void * a, const void * b, const void * bias, GemmDesc d,
                                   int64_t lda, int64_t ldc) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (n >= d.N) return;
    for (int64_t m = blockIdx.y; m < d.M; m += gridDim.y) {
        float sum = 0.0f;
        for (int64_t k = 0; k < d.K; ++k) {
            const float x = load_any(a, d.a, d.trans_a ? k * lda + m : m * lda + k);
            const float y = load_any(b, d.b, d.trans_b ? n * d.K + k : k * d.N + n);
            sum += x * y;
        }
        if (bias) sum += load_any(bias, d.b, n);
        const int64_t at = m * ldc + n;
        store_any(c, d.c, at, d.accumulate ? load_any(c, d.c, at) + sum : sum);
    }
}

__global__ void narrow_kernel(void * dst, DType to, int64_t ld_dst, const float * src, int64_t ld_src, int64_t rows,
                              int64_t cols) {
    for (int64_t i = blockIdx.y; i < rows; i += gridDim.y)
        for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x)
            store_any(dst, to, i * ld_dst + j, src[i * ld_src + j]);
}

}  // namespace

void narrow_block(cudaStream_t s, void * dst, DType to, int64_t ld_dst, const float * src, int64_t ld_src,
                  int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    const dim3 grid(grid_for(cols, 256) < 64 ? grid_for(cols, 256) : 64u, unsigned(rows < 65535 ? rows : 65535));
    narrow_kernel<<<grid, 256, 0, s>>>(dst, to, ld_dst, src, ld_src, rows, cols);
    MF_CUDA_LAUNCHED();
}

void gemm_simple(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, int64_t ldc) {
    const dim3 grid(grid_for(d.N, 128), unsigned(d.M < 65535 ? d.M : 65535));
    gemm_simple_kernel<<<grid, 128, 0, s>>>(c.data, a.data, b.data, d.bias ? bias.data : nullptr, d, gemm_lda(d),
                                            ldc ? ldc : d.N);
    MF_CUDA_LAUNCHED();
}

}  // namespace memfit::cuda
