// CUDA kernels: softmax cross-entropy, full and vocabulary-parallel (contracts: backend.h; the
// reference is backend/cpu/kernels_xent.cpp). Logits are f32 [N, V] and every row-wise kernel runs
// one block of kRowThreads per row: a read pass keeps an online (max, sum of exp) per thread over
// float4 loads (a scalar head up to 16-byte alignment and a scalar tail make any V and any row
// start work), the pairs are merged across the block, then a write pass streams the row again
// (from L2, mostly). Sums are f32 per thread (the CPU's are double); lse and losses are formed in
// double as the CPU does. Differences from the CPU: summation order and expf's last bit.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

constexpr int kRowThreads = 1024;
constexpr int32_t kIgnoreIndex = -100;
constexpr float kNegInf = -__builtin_huge_valf();

// A running max m and sum s of exp(x - m); m == -inf means nothing seen (s == 0).
struct MaxSum {
    float m = kNegInf, s = 0.0f;

    __device__ __forceinline__ void raise_to(float mx) {
        if (mx > m) {
            s = m == kNegInf ? 0.0f : s * expf(m - mx);
            m = mx;
        }
    }
    __device__ __forceinline__ void push(float x) {
        raise_to(x);
        if (m != kNegInf) s += expf(x - m);
    }
    __device__ __forceinline__ void push(float4 v) {
        raise_to(fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        if (m != kNegInf) s += (expf(v.x - m) + expf(v.y - m)) + (expf(v.z - m) + expf(v.w - m));
    }
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    MaxSum r;
    r.m = fmaxf(a.m, b.m);
    if (r.m == kNegInf) return r;
    r.s = (a.m == kNegInf ? 0.0f : a.s * expf(a.m - r.m)) + (b.m == kNegInf ? 0.0f : b.s * expf(b.m - r.m));
    return r;
}

// The block's merged pair, in every thread. Call once per kernel, from every thread.
__device__ MaxSum block_merge(MaxSum v) {
    __shared__ float sm[32], ss[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum w;
        w.m = __shfl_xor_sync(0xffffffffu, v.m, o);
        w.s = __shfl_xor_sync(0xffffffffu, v.s, o);
        v = merge(v, w);
    }
    if (lane == 0) sm[warp] = v.m, ss[warp] = v.s;
    __syncthreads();
    if (warp == 0) {
        MaxSum u;
        if (lane < warps) u.m = sm[lane], u.s = ss[lane];
        for (int o = 16; o > 0; o >>= 1) {
            MaxSum w;
            w.m = __shfl_xor_sync(0xffffffffu, u.m, o);
            w.s = __shfl_xor_sync(0xffffffffu, u.s, o);
            u = merge(u, w);
        }
        if (lane == 0) sm[0] = u.m, ss[0] = u.s;
    }
    __syncthreads();
    MaxSum r;
    r.m = sm[0], r.s = ss[0];
    return r;
}

// Elements [0, head) are scalar up to the first 16-byte boundary, then nvec float4s, then a tail.
struct RowSplit {
    int head, nvec;
};
__device__ __forceinline__ RowSplit split_row(const float * p, int n) {
    const int head = min(n, int(((16u - (unsigned(reinterpret_cast<uintptr_t>(p)) & 15u)) & 15u) / 4u));
    return {head, (n - head) / 4};
}

// The block's online (max, sum) over p[0, n).
__device__ MaxSum row_max_sum(const float * p, int n) {
    const RowSplit sp = split_row(p, n);
    MaxSum acc;
    const float4 * v = reinterpret_cast<const float4 *>(p + sp.head);
#pragma unroll 4
    for (int k = threadIdx.x; k < sp.nvec; k += blockDim.x) acc.push(v[k]);
    for (int j = threadIdx.x; j < sp.head; j += blockDim.x) acc.push(p[j]);
    for (int j = sp.head + 4 * sp.nvec + threadIdx.x; j < n; j += blockDim.x) acc.push(p[j]);
    return block_merge(acc);
}

// p[j] = f(j, p[j]) for j < n, by the block (f need not read its second argument).
template <class F> __device__ __forceinline__ void row_map(float * p, int n, F f) {
    const RowSplit sp = split_row(p, n);
    float4 * v = reinterpret_cast<float4 *>(p + sp.head);
#pragma unroll 4
    for (int k = threadIdx.x; k < sp.nvec; k += blockDim.x) {
        float4 x = v[k];
        const int j = sp.head + 4 * k;
        x.x = f(j, x.x), x.y = f(j + 1, x.y), x.z = f(j + 2, x.z), x.w = f(j + 3, x.w);
        v[k] = x;
    }
    for (int j = threadIdx.x; j < sp.head; j += blockDim.x) p[j] = f(j, p[j]);
    for (int j = sp.head + 4 * sp.nvec + threadIdx.x; j < n; j += blockDim.x) p[j] = f(j, p[j]);
}

// The shard's column of target t, or -1 (not held, or ignored); nv = the shard's valid columns.
__device__ __forceinline__ int shard_column(int32_t t, int64_t vocab_lo, int nv) {
    const int64_t j = int64_t(t) - vocab_lo;
    return t != kIgnoreIndex && t >= 0 && j >= 0 && j < nv ? int(j) : -1;
}

// Grid N, block kRowThreads: row r -> probabilities in place, losses[r].
__global__ void __launch_bounds__(kRowThreads) xent_fwd_kernel(float * losses, float * logits,
                                                               const int32_t * targets, int V) {
    const int64_t r = blockIdx.x;
    float * row = logits + r * V;
    const int32_t t = targets[r];
    // The target logit, read before any thread can overwrite the row (block_merge syncs first).
    float target_logit = 0.0f;
    if (threadIdx.x == 0 && t != kIgnoreIndex) target_logit = t >= 0 && t < V ? row[t] : __int_as_float(0x7fc00000);
    const MaxSum ms = row_max_sum(row, V);
    if (threadIdx.x == 0) {
        const double lse = double(ms.m) + log(double(ms.s));
        losses[r] = t == kIgnoreIndex ? 0.0f : float(lse - double(target_logit));
    }
    const float inv = float(1.0 / double(ms.s)), mx = ms.m;
    row_map(row, V, [=](int, float x) { return expf(x - mx) * inv; });
}

// Grid N, block kRowThreads: probabilities -> dlogits in place.
__global__ void __launch_bounds__(kRowThreads) xent_bwd_kernel(float * probs, const int32_t * targets, float dloss,
                                                               int V) {
    const int64_t r = blockIdx.x;
    float * row = probs + r * V;
    const int32_t t = targets[r];
    if (t == kIgnoreIndex) row_map(row, V, [](int, float) { return 0.0f; });
    else row_map(row, V, [=](int j, float p) { return j == t ? (p - 1.0f) * dloss : p * dloss; });
}

// Grid N, block kRowThreads: stats[r] = lse over the nv valid columns, stats[N + r] = target logit.
__global__ void __launch_bounds__(kRowThreads) xent_shard_stats_kernel(float * stats, const float * logits,
                                                                       const int32_t * targets, int N, int Vl,
                                                                       int64_t vocab_lo, int nv) {
    const int64_t r = blockIdx.x;
    const float * row = logits + r * Vl;
    if (threadIdx.x == 0) {
        const int col = shard_column(targets[r], vocab_lo, nv);
        stats[N + r] = col < 0 ? 0.0f : row[col];
    }
    if (nv == 0) {   // uniform over the block
        if (threadIdx.x == 0) stats[r] = kNegInf;
        return;
    }
    const MaxSum ms = row_max_sum(row, nv);
    if (threadIdx.x == 0) stats[r] = float(double(ms.m) + log(double(ms.s)));
}

// Grid ceil(N / 256), block 256: one thread per row combines the R shards' stats (in double).
__global__ void xent_shard_loss_kernel(float * losses, float * lse, const float * gathered, const int32_t * targets,
                                       int N, int R) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;   // int would wrap for N near 2^31
    if (i >= N) return;
    const size_t stride = 2 * size_t(N);
    float maxv = kNegInf;
    for (int r = 0; r < R; ++r) maxv = fmaxf(maxv, gathered[r * stride + i]);
    double sum = 0.0, target_logit = 0.0;
    for (int r = 0; r < R; ++r) {
        const float s = gathered[r * stride + i];
        if (s != kNegInf) sum += exp(double(s) - double(maxv));
        target_logit += double(gathered[r * stride + size_t(N) + i]);
    }
    const double l = maxv == kNegInf ? -__builtin_huge_val() : double(maxv) + log(sum);
    lse[i] = float(l);
    losses[i] = targets[i] == kIgnoreIndex ? 0.0f : float(l - target_logit);
}

// Grid N, block kRowThreads: shard logits -> dlogits in place; padding columns and ignored rows -> 0.
__global__ void __launch_bounds__(kRowThreads) xent_shard_bwd_kernel(float * logits, const int32_t * targets,
                                                                     const float * lse, int Vl, int64_t vocab_lo,
                                                                     int nv, float dloss) {
    const int64_t r = blockIdx.x;
    float * row = logits + r * Vl;
    const int32_t t = targets[r];
    if (t == kIgnoreIndex) {
        row_map(row, Vl, [](int, float) { return 0.0f; });
        return;
    }
    const int col = shard_column(t, vocab_lo, nv);
    const float l = lse[r];
    row_map(row, Vl, [=](int j, float x) {
        if (j >= nv) return 0.0f;
        const float p = expf(x - l);
        return j == col ? (p - 1.0f) * dloss : p * dloss;
    });
}

// Distillation. Grid N, block kRowThreads: the student's (max, sum) at temperature 1, the
// teacher's max, then one pass of the three sums at temperature T (student's, teacher's, and the
// teacher-weighted difference that gives KL), then the teacher's row becomes q in place.
__global__ void __launch_bounds__(kRowThreads) distill_fwd_kernel(float * losses, float * stats, const float * z,
                                                                  float * t, const int32_t * targets, int N, int V,
                                                                  float alpha, float temperature) {
    __shared__ float sh[32], shm[32];
    const int64_t r = blockIdx.x;
    const float * zr = z + r * V;
    float * tr = t + r * V;
    const int32_t tgt = targets[r];
    const float inv_t = 1.0f / temperature;
    const MaxSum ms = row_max_sum(zr, V);
    float tm = kNegInf;
    for (int j = threadIdx.x; j < V; j += blockDim.x) tm = fmaxf(tm, tr[j]);
    tm = warp_max(tm);
    if (threadIdx.x % 32 == 0) shm[threadIdx.x / 32] = tm;
    __syncthreads();
    tm = threadIdx.x % 32 < blockDim.x / 32 ? shm[threadIdx.x % 32] : kNegInf;
    tm = warp_max(tm);
    float sz = 0.0f, se = 0.0f, cross = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float zj = zr[j], tj = tr[j], e = expf((tj - tm) * inv_t);
        sz += expf((zj - ms.m) * inv_t);
        se += e;
        cross += e * (tj - zj);
    }
    sz = block_sum(sz, sh);
    se = block_sum(se, sh);
    cross = block_sum(cross, sh);
    if (threadIdx.x == 0) {
        const double lse = double(ms.m) + log(double(ms.s)), lse_t = double(ms.m) * inv_t + log(double(sz));
        const double kl = double(cross) / double(se) * inv_t - (double(tm) * inv_t + log(double(se))) + lse_t;
        stats[r] = float(lse);
        stats[N + r] = float(lse_t);
        const double ce = tgt == kIgnoreIndex ? 0.0 : lse - double(zr[tgt]);
        losses[r] = tgt == kIgnoreIndex ? 0.0f
                                        : float((1.0 - alpha) * ce + double(alpha) * temperature * temperature * kl);
    }
    const float inv = 1.0f / se;
    row_map(tr, V, [=](int, float x) { return expf((x - tm) * inv_t) * inv; });
}

// Grid N, block kRowThreads: logits -> dlogits in place (distill_fwd's stats and q).
__global__ void __launch_bounds__(kRowThreads) distill_bwd_kernel(float * z, const float * stats, const float * q,
                                                                  const int32_t * targets, int N, int V, float alpha,
                                                                  float temperature, float dloss) {
    const int64_t r = blockIdx.x;
    float * row = z + r * V;
    const float * qr = q + r * V;
    const int32_t tgt = targets[r];
    if (tgt == kIgnoreIndex) {
        row_map(row, V, [](int, float) { return 0.0f; });
        return;
    }
    const float lse = stats[r], lse_t = stats[N + r], inv_t = 1.0f / temperature;
    const float w_ce = (1.0f - alpha) * dloss, w_kl = alpha * temperature * dloss;
    row_map(row, V, [=](int j, float x) {
        const float d = w_ce * expf(x - lse) + w_kl * (expf(x * inv_t - lse_t) - qr[j]);
        return j == tgt ? d - w_ce : d;
    });
}

int valid_columns(int64_t Vl, int64_t vocab_lo, int64_t vocab) {
    const int64_t nv = vocab - vocab_lo;
    return int(nv < 0 ? 0 : nv > Vl ? Vl : nv);
}

}  // namespace

void xent_fwd(cudaStream_t s, Tensor losses, Tensor logits, Tensor targets) {
    const int64_t N = logits.rows(), V = logits.cols();
    MF_ASSERT(logits.dtype == DType::f32 && losses.dtype == DType::f32 && targets.dtype == DType::i32);
    MF_ASSERT(losses.numel() == N && targets.numel() == N && V > 0 && V <= INT32_MAX && N <= INT32_MAX);
    if (N == 0) return;
    xent_fwd_kernel<<<unsigned(N), kRowThreads, 0, s>>>(losses.f32(), logits.f32(), targets.i32(), int(V));
    MF_CUDA_LAUNCHED();
}

namespace {

// Preference tuning (backend/preference_loss.h): one thread per row, and per pair.
__global__ void row_logps_kernel(float * out, const float * losses, int B, int T) {
    const int b = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (b < B) out[b] = dpo_row_logp(losses, b, T);
}

__global__ void dpo_loss_kernel(float * losses, float * scale, float * logps, const float * ref,
                                const int32_t * targets, int pairs, int T, DpoDesc d) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < pairs) dpo_pair(i, losses, scale, logps, ref, targets, T, d);
}

// Grid N, block kRowThreads: logits -> (softmax - onehot(target)) * scale[r] in place, the
// arithmetic of xent_fwd_kernel then xent_bwd_kernel.
__global__ void __launch_bounds__(kRowThreads) xent_grad_rows_kernel(float * logits, const int32_t * targets,
                                                                     const float * scale, int V) {
    const int64_t r = blockIdx.x;
    float * row = logits + r * V;
    const int32_t t = targets[r];
    if (t == kIgnoreIndex) {
        row_map(row, V, [](int, float) { return 0.0f; });
        return;
    }
    const MaxSum ms = row_max_sum(row, V);
    const float inv = float(1.0 / double(ms.s)), mx = ms.m, f = scale[r];
    row_map(row, V, [=](int j, float x) {
        const float p = expf(x - mx) * inv;
        return j == t ? (p - 1.0f) * f : p * f;
    });
}

}  // namespace

void row_logps(cudaStream_t s, Tensor out, Tensor losses) {
    const int64_t B = losses.rows(), T = losses.cols();
    MF_ASSERT(out.dtype == DType::f32 && losses.dtype == DType::f32 && out.numel() == B && B * T <= INT32_MAX);
    if (B == 0) return;
    row_logps_kernel<<<unsigned((B + 127) / 128), 128, 0, s>>>(out.f32(), losses.f32(), int(B), int(T));
    MF_CUDA_LAUNCHED();
}

void dpo_loss(cudaStream_t s, Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d) {
    const int64_t B = losses.rows(), T = losses.cols();
    MF_ASSERT(B % 2 == 0 && scale.numel() == B * T && targets.numel() == B * T && logps.numel() == B &&
              ref.numel() == B && B * T <= INT32_MAX);
    if (B == 0) return;
    const int pairs = int(B / 2);
    dpo_loss_kernel<<<unsigned((pairs + 63) / 64), 64, 0, s>>>(losses.f32(), scale.f32(), logps.f32(), ref.f32(),
                                                               targets.i32(), pairs, int(T), d);
    MF_CUDA_LAUNCHED();
}

void xent_grad_rows(cudaStream_t s, Tensor logits, Tensor targets, Tensor scale) {
    const int64_t N = logits.rows(), V = logits.cols();
    MF_ASSERT(logits.dtype == DType::f32 && targets.numel() == N && scale.numel() == N);
    MF_ASSERT(V > 0 && V <= INT32_MAX && N <= INT32_MAX);
    if (N == 0) return;
    xent_grad_rows_kernel<<<unsigned(N), kRowThreads, 0, s>>>(logits.f32(), targets.i32(), scale.f32(), int(V));
    MF_CUDA_LAUNCHED();
}

void xent_bwd(cudaStream_t s, Tensor probs, Tensor targets, float dloss) {
    const int64_t N = probs.rows(), V = probs.cols();
    MF_ASSERT(probs.dtype == DType::f32 && targets.dtype == DType::i32 && targets.numel() == N);
    MF_ASSERT(V > 0 && V <= INT32_MAX && N <= INT32_MAX);
    if (N == 0) return;
    xent_bwd_kernel<<<unsigned(N), kRowThreads, 0, s>>>(probs.f32(), targets.i32(), dloss, int(V));
    MF_CUDA_LAUNCHED();
}

void xent_shard_stats(cudaStream_t s, Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab) {
    const int64_t N = logits.rows(), Vl = logits.cols();
    MF_ASSERT(stats.dtype == DType::f32 && logits.dtype == DType::f32 && targets.dtype == DType::i32);
    MF_ASSERT(stats.numel() == 2 * N && targets.numel() == N && vocab_lo >= 0 && Vl > 0 && Vl <= INT32_MAX);
    MF_ASSERT(2 * N <= INT32_MAX);
    if (N == 0) return;
    xent_shard_stats_kernel<<<unsigned(N), kRowThreads, 0, s>>>(stats.f32(), logits.f32(), targets.i32(), int(N),
                                                                int(Vl), vocab_lo, valid_columns(Vl, vocab_lo, vocab));
    MF_CUDA_LAUNCHED();
}

void xent_shard_loss(cudaStream_t s, Tensor losses, Tensor lse, Tensor gathered, Tensor targets) {
    const int64_t N = losses.numel();
    MF_ASSERT(losses.dtype == DType::f32 && lse.dtype == DType::f32 && gathered.dtype == DType::f32);
    MF_ASSERT(targets.dtype == DType::i32 && lse.numel() == N && targets.numel() == N);
    if (N == 0) return;
    MF_ASSERT(gathered.numel() % (2 * N) == 0 && N <= INT32_MAX);
    const int64_t R = gathered.numel() / (2 * N);
    xent_shard_loss_kernel<<<grid_for(N, 256), 256, 0, s>>>(losses.f32(), lse.f32(), gathered.f32(), targets.i32(),
                                                           int(N), int(R));
    MF_CUDA_LAUNCHED();
}

void xent_shard_bwd(cudaStream_t s, Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab,
                    float dloss) {
    const int64_t N = logits.rows(), Vl = logits.cols();
    MF_ASSERT(logits.dtype == DType::f32 && targets.dtype == DType::i32 && lse.dtype == DType::f32);
    MF_ASSERT(targets.numel() == N && lse.numel() == N && vocab_lo >= 0 && Vl > 0 && Vl <= INT32_MAX);
    MF_ASSERT(N <= INT32_MAX);
    if (N == 0) return;
    xent_shard_bwd_kernel<<<unsigned(N), kRowThreads, 0, s>>>(logits.f32(), targets.i32(), lse.f32(), int(Vl),
                                                              vocab_lo, valid_columns(Vl, vocab_lo, vocab), dloss);
    MF_CUDA_LAUNCHED();
}

void distill_fwd(cudaStream_t s, Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                 float temperature) {
    const int64_t N = logits.rows(), V = logits.cols();
    MF_ASSERT(logits.dtype == DType::f32 && teacher.dtype == DType::f32 && losses.dtype == DType::f32 &&
              stats.dtype == DType::f32 && targets.dtype == DType::i32);
    MF_ASSERT(teacher.rows() == N && teacher.cols() == V && stats.numel() == 2 * N && losses.numel() == N &&
              targets.numel() == N && V > 0 && V <= INT32_MAX && 2 * N <= INT32_MAX);
    MF_ASSERT(temperature > 0.0f && alpha >= 0.0f && alpha <= 1.0f);
    if (N == 0) return;
    distill_fwd_kernel<<<unsigned(N), kRowThreads, 0, s>>>(losses.f32(), stats.f32(), logits.f32(), teacher.f32(),
                                                           targets.i32(), int(N), int(V), alpha, temperature);
    MF_CUDA_LAUNCHED();
}

void distill_bwd(cudaStream_t s, Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha,
                 float temperature, float dloss) {
    const int64_t N = logits.rows(), V = logits.cols();
    MF_ASSERT(logits.dtype == DType::f32 && teacher_probs.dtype == DType::f32 && stats.dtype == DType::f32 &&
              targets.dtype == DType::i32);
    MF_ASSERT(teacher_probs.rows() == N && teacher_probs.cols() == V && stats.numel() == 2 * N && targets.numel() == N &&
              V > 0 && V <= INT32_MAX && 2 * N <= INT32_MAX);
    if (N == 0) return;
    distill_bwd_kernel<<<unsigned(N), kRowThreads, 0, s>>>(logits.f32(), stats.f32(), teacher_probs.f32(),
                                                           targets.i32(), int(N), int(V), alpha, temperature, dloss);
    MF_CUDA_LAUNCHED();
}

}  // namespace memfit::cuda
