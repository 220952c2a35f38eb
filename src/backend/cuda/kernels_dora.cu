// DoRA's kernels (backend/kernel_list.h, model/lora.h): the adapted weight's row norms, and the
// per-column factor mag / norm on a projection's output slice and on its gradient. The small
// vectors (the adapters, magnitudes, bias, the magnitude gradient) are read and written through
// their dtype at run time; the [N, cols] tensors are templated. fp32 sums in a fixed order.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

__device__ __forceinline__ float ld_as(const void * p, DType t, int64_t i) {
    if (t == DType::f32) return static_cast<const float *>(p)[i];
    if (t == DType::bf16) return ld(static_cast<const __nv_bfloat16 *>(p)[i]);
    return ld(static_cast<const __half *>(p)[i]);
}
__device__ __forceinline__ void st_as(void * p, DType t, int64_t i, float v) {
    if (t == DType::f32) static_cast<float *>(p)[i] = v;
    else if (t == DType::bf16) static_cast<__nv_bfloat16 *>(p)[i] = st<__nv_bfloat16>(v);
    else static_cast<__half *>(p)[i] = st<__half>(v);
}

constexpr int kNormThreads = 256;

// One block per output j: the row of W + scale * B A, its squares summed by block_sum.
template <class W>
__global__ void __launch_bounds__(kNormThreads)
    dora_norm_kernel(float * norm, const W * w, bool in_out, int64_t ld_w, int64_t in, int64_t col0, const void * a,
                     const void * b, DType ab, int64_t r, float scale) {
    __shared__ float shared[32];
    const int64_t j = blockIdx.x;
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < in; i += blockDim.x) {
        float v = ld(in_out ? w[i * ld_w + col0 + j] : w[(col0 + j) * ld_w + i]);
        for (int64_t k = 0; k < r; ++k) v += scale * ld_as(b, ab, j * r + k) * ld_as(a, ab, k * in + i);
        sq += v * v;
    }
    sq = block_sum(sq, shared);
    if (threadIdx.x == 0) norm[j] = sqrtf(sq);
}

template <class O, class Z>
__global__ void dora_scale_fwd_kernel(O * out, Z * z, const void * bias, DType bt, const void * mag, DType mt,
                                      const float * norm, int64_t N, int64_t ldo, int64_t cols, int64_t col0) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= N * cols) return;
    const int64_t i = idx / cols, j = idx % cols;
    const float bj = bias ? ld_as(bias, bt, col0 + j) : 0.0f;
    const float v = ld(out[i * ldo + col0 + j]) - bj;
    z[idx] = st<Z>(v);
    out[i * ldo + col0 + j] = st<O>(ld_as(mag, mt, j) / norm[j] * v + bj);
}

// 32 columns per block, 8 row lanes: lane y sums rows y, y + 8, ...; the lanes are added in order.
constexpr int kColCols = 32, kColLanes = 8;

template <class D, class Z>
__global__ void __launch_bounds__(kColCols * kColLanes)
    dora_mag_grad_kernel(void * dmag, DType gt, const D * dout, const Z * z, const float * norm, int64_t N, int64_t ldd,
                         int64_t cols, int64_t col0) {
    __shared__ float part[kColLanes][kColCols + 1];
    const int c = threadIdx.x % kColCols, y = threadIdx.x / kColCols;
    const int64_t j = int64_t(blockIdx.x) * kColCols + c;
    float s = 0.0f;
    if (j < cols)
        for (int64_t i = y; i < N; i += kColLanes) s += ld(dout[i * ldd + col0 + j]) * ld(z[i * cols + j]);
    part[y][c] = s;
    __syncthreads();
    if (y != 0 || j >= cols) return;
    float total = 0.0f;
    for (int k = 0; k < kColLanes; ++k) total += part[k][c];
    st_as(dmag, gt, j, ld_as(dmag, gt, j) + total / norm[j]);
}

template <class D>
__global__ void dora_scale_grad_kernel(D * dout, const void * mag, DType mt, const float * norm, int64_t N,
                                       int64_t ldd, int64_t cols, int64_t col0) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= N * cols) return;
    const int64_t i = idx / cols, j = idx % cols;
    D & d = dout[i * ldd + col0 + j];
    d = st<D>(ld_as(mag, mt, j) / norm[j] * ld(d));
}

}  // namespace

void dora_norm(cudaStream_t s, Tensor norm, Tensor w, bool w_in_out, int64_t col0, Tensor a, Tensor b, float scale) {
    const int64_t cols = b.dim(0), r = b.dim(1), in = a.dim(1), ld_w = w.dim(1);
    MF_ASSERT(norm.dtype == DType::f32 && norm.numel() == cols && a.dim(0) == r && a.dtype == b.dtype);
    MF_ASSERT(w_in_out ? w.dim(0) == in && col0 + cols <= ld_w : ld_w == in && col0 + cols <= w.dim(0));
    if (cols == 0) return;
    dispatch_float(w.dtype, [&](auto wz) {
        using W = decltype(wz);
        dora_norm_kernel<W><<<unsigned(cols), kNormThreads, 0, s>>>(norm.f32(), ptr<W>(w), w_in_out, ld_w, in, col0,
                                                                   a.data, b.data, a.dtype, r, scale);
    });
    MF_CUDA_LAUNCHED();
}

void dora_scale_fwd(cudaStream_t s, Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0) {
    const int64_t cols = mag.numel(), N = out.rows();
    MF_ASSERT(z.rows() == N && z.cols() == cols && col0 + cols <= out.cols() && norm.numel() == cols);
    if (N * cols == 0) return;
    dispatch_float(out.dtype, [&](auto oz) {
        dispatch_float(z.dtype, [&](auto zz) {
            using O = decltype(oz);
            using Z = decltype(zz);
            dora_scale_fwd_kernel<O, Z><<<grid_for(N * cols, 256), 256, 0, s>>>(
                ptr<O>(out), ptr<Z>(z), bias.valid() ? bias.data : nullptr, bias.dtype, mag.data, mag.dtype,
                norm.f32(), N, out.cols(), cols, col0);
        });
    });
    MF_CUDA_LAUNCHED();
}

void dora_scale_bwd(cudaStream_t s, Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0) {
    const int64_t cols = mag.numel(), N = dout.rows();
    MF_ASSERT(z.rows() == N && z.cols() == cols && col0 + cols <= dout.cols() && dmag.numel() == cols);
    if (N * cols == 0) return;
    dispatch_float(dout.dtype, [&](auto dz) {
        using D = decltype(dz);
        dispatch_float(z.dtype, [&](auto zz) {
            using Z = decltype(zz);
            dora_mag_grad_kernel<D, Z><<<unsigned((cols + kColCols - 1) / kColCols), kColCols * kColLanes, 0, s>>>(
                dmag.data, dmag.dtype, ptr<D>(dout), ptr<Z>(z), norm.f32(), N, dout.cols(), cols, col0);
        });
        dora_scale_grad_kernel<D><<<grid_for(N * cols, 256), 256, 0, s>>>(ptr<D>(dout), mag.data, mag.dtype,
                                                                           norm.f32(), N, dout.cols(), cols, col0);
    });
    MF_CUDA_LAUNCHED();
}

}  // namespace memfit::cuda
