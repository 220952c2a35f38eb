// CUDA kernels of context parallelism's attention (kernel_list.h's cp_attention_fwd / _bwd; the
// CPU's reference: backend/cpu/kernels_cp.cpp): this rank's query rows over every position's
// keys and values, grouped KV heads read directly. The simple path: one thread per (query row,
// head) for the output and dq, one per (position, KV head) for dk and dv, every sum in fp32 in a
// fixed order (deterministic), each element stored once. Correct first; the tiled kernel that
// overlaps the K/V exchange is for when a GPU can time it.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

constexpr int kMaxHd = 256;

struct CpDims {
    int B, Tl, T, NH, KVH, hd;
    __host__ __device__ int64_t qw() const { return int64_t(NH + 2 * KVH) * hd; }
    __host__ __device__ int64_t kvw() const { return int64_t(2 * KVH) * hd; }
};

template <class S> __device__ float dot_rows(const S * a, const S * b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += ld(a[i]) * ld(b[i]);
    return s;
}

template <class S>
__global__ void cp_fwd_kernel(S * out, float * lse, const S * qkv, const S * kv, const int32_t * meta, CpDims d,
                              float scale) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows = int64_t(d.B) * d.Tl;
    if (id >= rows * d.NH) return;
    const int64_t r = id / d.NH;
    const int h = int(id % d.NH), b = int(r / d.Tl), t = int(r % d.Tl), kvh = h / (d.NH / d.KVH);
    const S * q = qkv + r * d.qw() + int64_t(h) * d.hd;
    float acc[kMaxHd];
    for (int i = 0; i < d.hd; ++i) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = meta[rows + r]; j <= meta[r]; ++j) {
        const S * row = kv + (int64_t(b) * d.T + j) * d.kvw();
        const float s = dot_rows(q, row + int64_t(kvh) * d.hd, d.hd) * scale;
        const float nm = fmaxf(m, s), c = expf(m - nm), p = expf(s - nm);
        l = l * c + p;
        const S * v = row + int64_t(d.KVH + kvh) * d.hd;
        for (int i = 0; i < d.hd; ++i) acc[i] = acc[i] * c + p * ld(v[i]);
        m = nm;
    }
    S * o = out + (r * d.NH + h) * d.hd;
    for (int i = 0; i < d.hd; ++i) o[i] = st<S>(acc[i] / l);
    lse[(int64_t(b) * d.NH + h) * d.Tl + t] = m + logf(l);
}

// D = dout . out per query row and head.
template <class S>
__global__ void cp_delta_kernel(float * D, const S * dout, const S * out, int64_t n, int hd) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id < n) D[id] = dot_rows(dout + id * hd, out + id * hd, hd);
}

template <class S>
__global__ void cp_dq_kernel(S * dqkv, const S * dout, const S * qkv, const S * kv, const float * lse,
                             const float * D, const int32_t * meta, CpDims d, float scale) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows = int64_t(d.B) * d.Tl;
    if (id >= rows * d.NH) return;
    const int64_t r = id / d.NH;
    const int h = int(id % d.NH), b = int(r / d.Tl), t = int(r % d.Tl), kvh = h / (d.NH / d.KVH);
    const S * q = qkv + r * d.qw() + int64_t(h) * d.hd;
    const S * g = dout + (r * d.NH + h) * d.hd;
    const float L = lse[(int64_t(b) * d.NH + h) * d.Tl + t], Dr = D[id];
    float acc[kMaxHd];
    for (int i = 0; i < d.hd; ++i) acc[i] = 0.0f;
    for (int j = meta[rows + r]; j <= meta[r]; ++j) {
        const S * row = kv + (int64_t(b) * d.T + j) * d.kvw();
        const S * k = row + int64_t(kvh) * d.hd;
        const float p = expf(dot_rows(q, k, d.hd) * scale - L);
        const float ds = p * (dot_rows(g, row + int64_t(d.KVH + kvh) * d.hd, d.hd) - Dr) * scale;
        for (int i = 0; i < d.hd; ++i) acc[i] += ds * ld(k[i]);
    }
    S * dst = dqkv + r * d.qw();
    for (int i = 0; i < d.hd; ++i) dst[int64_t(h) * d.hd + i] = st<S>(acc[i]);
    if (h == 0)
        for (int64_t i = int64_t(d.NH) * d.hd; i < d.qw(); ++i) dst[i] = st<S>(0.0f);
}

template <class S>
__global__ void cp_dkv_kernel(S * dkv, const S * dout, const S * qkv, const S * kv, const float * lse,
                              const float * D, const int32_t * meta, CpDims d, float scale) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows = int64_t(d.B) * d.Tl;
    if (id >= int64_t(d.B) * d.T * d.KVH) return;
    const int64_t p = id / d.KVH;
    const int kvh = int(id % d.KVH), b = int(p / d.T), j = int(p % d.T), G = d.NH / d.KVH;
    const S * k = kv + p * d.kvw() + int64_t(kvh) * d.hd;
    const S * v = kv + p * d.kvw() + int64_t(d.KVH + kvh) * d.hd;
    float dk[kMaxHd], dv[kMaxHd];
    for (int i = 0; i < d.hd; ++i) dk[i] = dv[i] = 0.0f;
    for (int t = 0; t < d.Tl; ++t) {
        const int64_t r = int64_t(b) * d.Tl + t;
        if (j < meta[rows + r] || j > meta[r]) continue;
        for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
            const S * q = qkv + r * d.qw() + int64_t(h) * d.hd;
            const S * g = dout + (r * d.NH + h) * d.hd;
            const float pr = expf(dot_rows(q, k, d.hd) * scale - lse[(int64_t(b) * d.NH + h) * d.Tl + t]);
            const float ds = pr * (dot_rows(g, v, d.hd) - D[r * d.NH + h]) * scale;
            for (int i = 0; i < d.hd; ++i) {
                dk[i] += ds * ld(q[i]);
                dv[i] += pr * ld(g[i]);
            }
        }
    }
    S * dst = dkv + p * d.kvw();
    for (int i = 0; i < d.hd; ++i) {
        dst[int64_t(kvh) * d.hd + i] = st<S>(dk[i]);
        dst[int64_t(d.KVH + kvh) * d.hd + i] = st<S>(dv[i]);
    }
}

// ---- The ring: a visiting block of Tl key rows with their positions, merged into fp32 accumulators.
template <class S>
__global__ void cp_block_fwd_kernel(float * acc, float * acc_lse, const S * qkv, const S * kv, const int32_t * kpos,
                                    const int32_t * meta, CpDims d, float scale, bool first) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows = int64_t(d.B) * d.Tl;
    if (id >= rows * d.NH) return;
    const int64_t r = id / d.NH;
    const int h = int(id % d.NH), b = int(r / d.Tl), t = int(r % d.Tl), kvh = h / (d.NH / d.KVH);
    const int pos = meta[r], lo = meta[rows + r];
    const S * q = qkv + r * d.qw() + int64_t(h) * d.hd;
    float o[kMaxHd];
    for (int i = 0; i < d.hd; ++i) o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < d.T; ++j) {   // the block's rows (d.T = Tl here)
        if (kpos[j] < lo || kpos[j] > pos) continue;
        const S * row = kv + (int64_t(b) * d.T + j) * d.kvw();
        const float s = dot_rows(q, row + int64_t(kvh) * d.hd, d.hd) * scale;
        const float nm = fmaxf(m, s), c = expf(m - nm), p = expf(s - nm);
        l = l * c + p;
        const S * v = row + int64_t(d.KVH + kvh) * d.hd;
        for (int i = 0; i < d.hd; ++i) o[i] = o[i] * c + p * ld(v[i]);
        m = nm;
    }
    float * L = acc_lse + (int64_t(b) * d.NH + h) * d.Tl + t;
    float * a = acc + id * d.hd;
    if (first) {
        for (int i = 0; i < d.hd; ++i) a[i] = l > 0.0f ? o[i] / l : 0.0f;
        *L = l > 0.0f ? m + logf(l) : -INFINITY;
        return;
    }
    if (l == 0.0f) return;
    const float lb = m + logf(l), la = *L, nl = la > lb ? la + log1pf(expf(lb - la)) : lb + log1pf(expf(la - lb));
    const float wa = expf(la - nl), wb = expf(lb - nl) / l;
    for (int i = 0; i < d.hd; ++i) a[i] = a[i] * wa + o[i] * wb;
    *L = nl;
}

template <class S>
__global__ void cp_block_dq_kernel(float * dq, const S * dout, const S * qkv, const S * kv, const float * lse,
                                   const float * D, const int32_t * kpos, const int32_t * meta, CpDims d, float scale) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows = int64_t(d.B) * d.Tl;
    if (id >= rows * d.NH) return;
    const int64_t r = id / d.NH;
    const int h = int(id % d.NH), b = int(r / d.Tl), t = int(r % d.Tl), kvh = h / (d.NH / d.KVH);
    const int pos = meta[r], lo = meta[rows + r];
    const S * q = qkv + r * d.qw() + int64_t(h) * d.hd;
    const S * g = dout + id * d.hd;
    const float L = lse[(int64_t(b) * d.NH + h) * d.Tl + t], Dr = D[id];
    float * acc = dq + id * d.hd;
    for (int j = 0; j < d.T; ++j) {
        if (kpos[j] < lo || kpos[j] > pos) continue;
        const S * row = kv + (int64_t(b) * d.T + j) * d.kvw();
        const S * k = row + int64_t(kvh) * d.hd;
        const float p = expf(dot_rows(q, k, d.hd) * scale - L);
        const float ds = p * (dot_rows(g, row + int64_t(d.KVH + kvh) * d.hd, d.hd) - Dr) * scale;
        for (int i = 0; i < d.hd; ++i) acc[i] += ds * ld(k[i]);
    }
}

template <class S>
__global__ void cp_block_dkv_kernel(float * dkv, const S * dout, const S * qkv, const S * kv, const float * lse,
                                    const float * D, const int32_t * kpos, const int32_t * meta, CpDims d, float scale) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows = int64_t(d.B) * d.Tl;
    if (id >= int64_t(d.B) * d.T * d.KVH) return;
    const int64_t p = id / d.KVH;
    const int kvh = int(id % d.KVH), b = int(p / d.T), j = int(p % d.T), G = d.NH / d.KVH;
    const S * k = kv + p * d.kvw() + int64_t(kvh) * d.hd;
    const S * v = kv + p * d.kvw() + int64_t(d.KVH + kvh) * d.hd;
    float * dk = dkv + p * d.kvw() + int64_t(kvh) * d.hd;
    float * dv = dkv + p * d.kvw() + int64_t(d.KVH + kvh) * d.hd;
    for (int t = 0; t < d.Tl; ++t) {
        const int64_t r = int64_t(b) * d.Tl + t;
        if (kpos[j] < meta[rows + r] || kpos[j] > meta[r]) continue;
        for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
            const S * q = qkv + r * d.qw() + int64_t(h) * d.hd;
            const S * g = dout + (r * d.NH + h) * d.hd;
            const float pr = expf(dot_rows(q, k, d.hd) * scale - lse[(int64_t(b) * d.NH + h) * d.Tl + t]);
            const float ds = pr * (dot_rows(g, v, d.hd) - D[r * d.NH + h]) * scale;
            for (int i = 0; i < d.hd; ++i) {
                dk[i] += ds * ld(q[i]);
                dv[i] += pr * ld(g[i]);
            }
        }
    }
}

template <class S>
__global__ void cp_qkv_grad_kernel(S * dqkv, const float * dq, const float * dkv, int64_t rows, int64_t q, int64_t kv) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= rows * (q + kv)) return;
    const int64_t r = id / (q + kv), c = id % (q + kv);
    dqkv[id] = st<S>(c < q ? dq[r * q + c] : dkv[r * kv + c - q]);
}

CpDims dims(const Tensor & qkv, const Tensor & kv, int NH, int KVH) {
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && qkv.ndim == 3 && kv.ndim == 3 && qkv.cols() % (NH + 2 * KVH) == 0);
    const int hd = int(qkv.cols() / (NH + 2 * KVH));
    MF_ASSERT(hd <= kMaxHd && kv.dim(0) == qkv.dim(0) && kv.cols() == int64_t(2) * KVH * hd);
    return CpDims{int(qkv.dim(0)), int(qkv.dim(1)), int(kv.dim(1)), NH, KVH, hd};
}

}  // namespace

void cp_attention_fwd(cudaStream_t s, Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH) {
    const CpDims d = dims(qkv, kv, NH, KVH);
    MF_ASSERT(out.dtype == qkv.dtype && kv.dtype == qkv.dtype && meta.numel() == int64_t(2) * d.B * d.Tl);
    const int64_t n = int64_t(d.B) * d.Tl * NH;
    if (n == 0) return;
    const float scale = 1.0f / std::sqrt(float(d.hd));
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        cp_fwd_kernel<S><<<grid_for(n, 64), 64, 0, s>>>(ptr<S>(out), lse.f32(), ptr<S>(qkv), ptr<S>(kv), meta.i32(), d,
                                                        scale);
        MF_CUDA_LAUNCHED();
    });
}

void cp_attention_bwd(cudaStream_t s, Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv,
                      Tensor kv, Tensor lse, Tensor meta, int NH, int KVH) {
    const CpDims d = dims(qkv, kv, NH, KVH);
    MF_ASSERT(scratch.dtype == DType::f32 && scratch.numel() >= int64_t(d.B) * d.Tl * NH);
    float * delta = scratch.f32();
    MF_ASSERT(dqkv.numel() == qkv.numel() && dkv.numel() == kv.numel() && meta.numel() == int64_t(2) * d.B * d.Tl);
    const int64_t n = int64_t(d.B) * d.Tl * NH, nk = int64_t(d.B) * d.T * KVH;
    const float scale = 1.0f / std::sqrt(float(d.hd));
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        if (n > 0) {
            cp_delta_kernel<S><<<grid_for(n, 128), 128, 0, s>>>(delta, ptr<S>(dout), ptr<S>(out), n, d.hd);
            MF_CUDA_LAUNCHED();
            cp_dq_kernel<S><<<grid_for(n, 64), 64, 0, s>>>(ptr<S>(dqkv), ptr<S>(dout), ptr<S>(qkv), ptr<S>(kv),
                                                           lse.f32(), delta, meta.i32(), d, scale);
            MF_CUDA_LAUNCHED();
        }
        if (nk > 0) {
            cp_dkv_kernel<S><<<grid_for(nk, 64), 64, 0, s>>>(ptr<S>(dkv), ptr<S>(dout), ptr<S>(qkv), ptr<S>(kv),
                                                             lse.f32(), delta, meta.i32(), d, scale);
            MF_CUDA_LAUNCHED();
        }
    });
}

void cp_block_fwd(cudaStream_t s, Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH,
                  int KVH, bool first) {
    const CpDims d = dims(qkv, kv, NH, KVH);   // kv holds one rank's Tl rows: d.T is Tl
    MF_ASSERT(kv.dim(1) == qkv.dim(1) && kpos.numel() == d.Tl && meta.numel() == int64_t(2) * d.B * d.Tl);
    const int64_t n = int64_t(d.B) * d.Tl * NH;
    if (n == 0) return;
    const float scale = 1.0f / std::sqrt(float(d.hd));
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        cp_block_fwd_kernel<S><<<grid_for(n, 64), 64, 0, s>>>(acc.f32(), lse.f32(), ptr<S>(qkv), ptr<S>(kv), kpos.i32(),
                                                              meta.i32(), d, scale, first);
        MF_CUDA_LAUNCHED();
    });
}

void cp_block_bwd(cudaStream_t s, Tensor dq, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor kv,
                  Tensor lse, Tensor kpos, Tensor meta, int NH, int KVH) {
    const CpDims d = dims(qkv, kv, NH, KVH);
    MF_ASSERT(kv.dim(1) == qkv.dim(1) && scratch.numel() >= int64_t(d.B) * d.Tl * NH && dkv.numel() == kv.numel());
    const int64_t n = int64_t(d.B) * d.Tl * NH, nk = int64_t(d.B) * d.T * KVH;
    if (n == 0) return;
    const float scale = 1.0f / std::sqrt(float(d.hd));
    float * delta = scratch.f32();
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        cp_delta_kernel<S><<<grid_for(n, 128), 128, 0, s>>>(delta, ptr<S>(dout), ptr<S>(out), n, d.hd);
        MF_CUDA_LAUNCHED();
        cp_block_dq_kernel<S><<<grid_for(n, 64), 64, 0, s>>>(dq.f32(), ptr<S>(dout), ptr<S>(qkv), ptr<S>(kv), lse.f32(),
                                                             delta, kpos.i32(), meta.i32(), d, scale);
        MF_CUDA_LAUNCHED();
        cp_block_dkv_kernel<S><<<grid_for(nk, 64), 64, 0, s>>>(dkv.f32(), ptr<S>(dout), ptr<S>(qkv), ptr<S>(kv),
                                                               lse.f32(), delta, kpos.i32(), meta.i32(), d, scale);
        MF_CUDA_LAUNCHED();
    });
}

void cp_qkv_grad(cudaStream_t s, Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH) {
    const int64_t rows = dqkv.rows(), q = dq.numel() / std::max<int64_t>(rows, 1), kv = dkv.numel() / std::max<int64_t>(rows, 1);
    MF_ASSERT(dqkv.cols() == q + kv && q % NH == 0 && kv % (2 * KVH) == 0);
    if (rows == 0) return;
    dispatch_float(dqkv.dtype, [&](auto z) {
        using S = decltype(z);
        cp_qkv_grad_kernel<S><<<grid_for(rows * (q + kv), 256), 256, 0, s>>>(ptr<S>(dqkv), dq.f32(), dkv.f32(), rows, q, kv);
        MF_CUDA_LAUNCHED();
    });
}

}  // namespace memfit::cuda
