// CUDA kernels: LayerNorm and RMSNorm, forward and backward, and bias_grad (declared with the
// kernels_basic.cu launchers; it shares the column-sum kernel here). Contracts: backend.h; the CPU
// backend is the reference (backend/cpu/kernels_basic.cpp, kernels_llama.cpp), whose formulas
// are followed operation for operation (two-pass variance, divisions by C where it divides), so
// results differ from it by fp32 summation order only.
//
// Per-row work (forward, dinp) uses one warp per row, 8 rows per 256-thread block; each lane
// reads packs of V elements (16 bytes) when C is a multiple of V and every pointer is 16-byte
// aligned, else single elements. Passes after the first re-read the row (from L1).
// Weight/bias gradients are reductions over rows (colsum_kernel): a block per 32 columns, row
// lanes summing in fp32, partials combined in a fixed order, one rounded add per element:
// deterministic, no atomics.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pack.cuh"

namespace memfit::cuda {

namespace {

constexpr int kRowsPerBlock = 8, kThreads = 32 * kRowsPerBlock;

// ---- LayerNorm forward: warp per row. mean = sum / C; var = sum (x - mean)^2 / C;
// rstd = 1 / sqrt(var + eps); out = (x - mean) * rstd * w + b. ----
template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    layernorm_fwd_kernel(T * out, float * mean, float * rstd, const T * inp, const T * w, const T * b, int64_t N,
                         int C, float eps) {
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const T * x = inp + row * C;
    T * o = out + row * C;
    float s = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> p = ldp<V>(x + c);
#pragma unroll
        for (int k = 0; k < V; ++k) s += ld(p.v[k]);
    }
    const float m = warp_sum(s) / float(C);
    float var = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> p = ldp<V>(x + c);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float d = ld(p.v[k]) - m;
            var += d * d;
        }
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / float(C) + eps);
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> p = ldp<V>(x + c), pw = ldp<V>(w + c), pb = ldp<V>(b + c);
        Pack<T, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) y.v[k] = st<T>((ld(p.v[k]) - m) * r * ld(pw.v[k]) + ld(pb.v[k]));
        stp<V>(o + c, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// ---- RMSNorm forward: warp per row. rstd = 1 / sqrt(sum x^2 / C + eps); out = x * rstd * w. ----
template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_kernel(T * out, float * rstd, const T * inp, const T * w, int64_t N, int C, float eps) {
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const T * x = inp + row * C;
    T * o = out + row * C;
    float ss = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> p = ldp<V>(x + c);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float v = ld(p.v[k]);
            ss += v * v;
        }
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / float(C) + eps);
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> p = ldp<V>(x + c), pw = ldp<V>(w + c);
        Pack<T, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) y.v[k] = st<T>(ld(p.v[k]) * r * ld(pw.v[k]));
        stp<V>(o + c, y);
    }
    if (lane == 0) rstd[row] = r;
}

// ---- dinp += ..., warp per row, for both norms. n = (x - mean) * rstd (LayerNorm) or
// x * rstd (RMSNorm: mean == nullptr); dn = w * dout;
//   LayerNorm: dinp += rstd * (dn - mean(dn) - n * mean(dn * n))
//   RMSNorm:   dinp += rstd * (dn - n * mean(dn * n)) ----
template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    norm_dinp_kernel(T * dinp, const T * dout, const T * inp, const T * w, const float * mean, const float * rstd,
                     int64_t N, int C) {
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const int lane = threadIdx.x % 32;
    const int64_t off = row * C;
    const float inv_c = 1.0f / float(C);
    const float m = mean ? mean[row] : 0.0f, r = rstd[row];
    float sum_dn = 0.0f, sum_dnn = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> px = ldp<V>(inp + off + c), pg = ldp<V>(dout + off + c), pw = ldp<V>(w + c);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float n = mean ? (ld(px.v[k]) - m) * r : ld(px.v[k]) * r;
            const float dn = ld(pw.v[k]) * ld(pg.v[k]);
            sum_dn += dn;
            sum_dnn += dn * n;
        }
    }
    const float mean_dn = mean ? warp_sum(sum_dn) * inv_c : 0.0f;
    const float mean_dnn = warp_sum(sum_dnn) * inv_c;
    for (int c = lane * V; c < C; c += 32 * V) {
        const Pack<T, V> px = ldp<V>(inp + off + c), pg = ldp<V>(dout + off + c), pw = ldp<V>(w + c);
        Pack<T, V> dx = ldp<V>(dinp + off + c);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float n = mean ? (ld(px.v[k]) - m) * r : ld(px.v[k]) * r;
            const float dn = ld(pw.v[k]) * ld(pg.v[k]);
            dx.v[k] = st<T>(ld(dx.v[k]) + r * (dn - mean_dn - n * mean_dnn));
        }
        stp<V>(dinp + off + c, dx);
    }
}

// ---- Column sums over rows, for dw/db of both norms and for bias_grad:
//   kBias: db += sum_i dout[i];  kRms: dw += sum_i dout[i] * x[i] * rstd[i];
//   kLn:   dw += sum_i dout[i] * (x[i] - mean[i]) * rstd[i],  db += sum_i dout[i].
// A block of 512 threads owns 32 columns: kCT = 32 / V threads per row, each with a pack of V
// columns, and kRL = 512 / kCT row lanes; lane y sums rows y, y + kRL, ... in fp32. Partials are
// combined in a fixed order (a shuffle butterfly over the rows of a warp, then the warps in
// order), and each element gets one rounded add. grid.x = column blocks. ----
enum class ColSum { kBias, kRms, kLn };
constexpr int kRedThreads = 512, kRedWarps = kRedThreads / 32, kRedCols = 32;

template <ColSum M, int V, class G, class T>
__global__ void __launch_bounds__(kRedThreads)
    colsum_kernel(G * dw, G * db, const T * dout, const T * inp, const float * mean, const float * rstd, int64_t N,
                  int64_t C) {
    constexpr int kCT = kRedCols / V, kRL = kRedThreads / kCT;
    __shared__ float part_w[kRedWarps][kRedCols + 1], part_b[kRedWarps][kRedCols + 1];
    const int ct = threadIdx.x % kCT, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t c0 = int64_t(blockIdx.x) * kRedCols + ct * V;
    float aw[V] = {}, ab[V] = {};
    if (c0 < C) {   // with V > 1, C is a multiple of V: the whole pack is inside the row
#pragma unroll 4
        for (int64_t i = threadIdx.x / kCT; i < N; i += kRL) {
            const Pack<T, V> g = ldp<V>(dout + i * C + c0);
            if constexpr (M == ColSum::kBias) {
#pragma unroll
                for (int k = 0; k < V; ++k) ab[k] += ld(g.v[k]);
            } else {
                const Pack<T, V> x = ldp<V>(inp + i * C + c0);
                const float r = rstd[i], m = M == ColSum::kLn ? mean[i] : 0.0f;
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    const float gk = ld(g.v[k]);
                    aw[k] += gk * (M == ColSum::kLn ? (ld(x.v[k]) - m) * r : ld(x.v[k]) * r);
                    if constexpr (M == ColSum::kLn) ab[k] += gk;
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
        for (int o = kCT; o < 32; o <<= 1) {   // the warp's rows, for each of its columns
            aw[k] += __shfl_xor_sync(0xffffffffu, aw[k], o);
            ab[k] += __shfl_xor_sync(0xffffffffu, ab[k], o);
        }
        if (lane < kCT) {
            part_w[warp][ct * V + k] = aw[k];
            part_b[warp][ct * V + k] = ab[k];
        }
    }
    __syncthreads();
    const int64_t c = int64_t(blockIdx.x) * kRedCols + threadIdx.x;
    if (threadIdx.x >= kRedCols || c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int w = 0; w < kRedWarps; ++w) {
        sw += part_w[w][threadIdx.x];
        sb += part_b[w][threadIdx.x];
    }
    if constexpr (M != ColSum::kBias) dw[c] = st<G>(ld(dw[c]) + sw);
    if constexpr (M != ColSum::kRms) db[c] = st<G>(ld(db[c]) + sb);
}

// Launches colsum_kernel for gradients of dtype gt (f32 or T's) over dout [N, C] (and inp).
template <ColSum M, class T>
void colsum(cudaStream_t s, Tensor dw, Tensor db, const T * dout, const T * inp, const float * mean,
            const float * rstd, int64_t N, int64_t C) {
    const DType gt = M == ColSum::kBias ? db.dtype : dw.dtype;
    constexpr int V = int(16 / sizeof(T));
    const bool vec = C % V == 0 && aligned16({dout, inp});
    const unsigned grid = grid_for(C, kRedCols);
    auto run = [&](auto g) {
        using G = decltype(g);
        G * w = M == ColSum::kBias ? nullptr : ptr<G>(dw);
        G * b = M == ColSum::kRms ? nullptr : ptr<G>(db);
        if (vec) colsum_kernel<M, V><<<grid, kRedThreads, 0, s>>>(w, b, dout, inp, mean, rstd, N, C);
        else colsum_kernel<M, 1><<<grid, kRedThreads, 0, s>>>(w, b, dout, inp, mean, rstd, N, C);
        MF_CUDA_LAUNCHED();
    };
    if (gt == DType::f32) run(float{}); else run(T{});
}

unsigned row_blocks(int64_t N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }

// Calls f(std::integral_constant<int, V>{}) with V = 16 / sizeof(T) when `vec`, else 1.
template <class T, class F> void with_vec(bool vec, F && f) {
    if (vec) f(std::integral_constant<int, int(16 / sizeof(T))>{});
    else f(std::integral_constant<int, 1>{});
}

// The backward of either norm (mean invalid: RMSNorm; db invalid: no bias).
void norm_bwd(cudaStream_t s, Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
              Tensor rstd) {
    MF_ASSERT(dinp.dtype == inp.dtype && dout.dtype == inp.dtype && w.dtype == inp.dtype);
    const int64_t N = inp.rows(), C = inp.cols();
    MF_ASSERT(dinp.numel() == inp.numel() && dout.numel() == inp.numel() && w.numel() == C && rstd.numel() == N);
    MF_ASSERT(rstd.dtype == DType::f32 && (!mean.valid() || (mean.dtype == DType::f32 && mean.numel() == N)));
    MF_ASSERT(!dw.valid() || (dw.numel() == C && (dw.dtype == DType::f32 || dw.dtype == inp.dtype)));
    MF_ASSERT(!db.valid() || (db.numel() == C && db.dtype == dw.dtype));
    if (N == 0 || C == 0) return;
    const float * mp = mean.valid() ? ptr<float>(mean) : nullptr;
    dispatch_float(inp.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = C % (16 / sizeof(T)) == 0 && aligned16({dinp.data, dout.data, inp.data, w.data});
        with_vec<T>(vec, [&](auto v) {
            norm_dinp_kernel<decltype(v)::value><<<row_blocks(N), kThreads, 0, s>>>(
                ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), ptr<T>(w), mp, ptr<float>(rstd), N, int(C));
            MF_CUDA_LAUNCHED();
        });
        if (!dw.valid()) return;
        if (mp) colsum<ColSum::kLn>(s, dw, db, ptr<T>(dout), ptr<T>(inp), mp, ptr<float>(rstd), N, C);
        else colsum<ColSum::kRms>(s, dw, db, ptr<T>(dout), ptr<T>(inp), mp, ptr<float>(rstd), N, C);
    });
}

// ---- Qwen3's q/k norms: warp per head row i (token i / H, head i % H of H = NH + KVH; q heads
// take wq, k heads wk), the row at qkv + (i / H) * width + (i % H) * hd; RMSNorm's formulas with
// C = hd, in place. Forward saves the row to raw [i, hd] and its rstd; backward overwrites
// d(normed) with d(raw). ----
struct HeadRows {
    int64_t rows;   // N * H
    int H, NH, hd;
    int64_t width;  // (NH + 2 KVH) * hd
    __device__ int64_t at(int64_t i) const { return (i / H) * width + (i % H) * hd; }
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    qk_norm_fwd_kernel(T * qkv, T * raw, float * rstd, const T * wq, const T * wk, HeadRows hr, float eps) {
    const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    if (i >= hr.rows) return;
    const int lane = threadIdx.x % 32;
    T * x = qkv + hr.at(i);
    T * keep = raw + i * hr.hd;
    const T * w = i % hr.H < hr.NH ? wq : wk;
    float ss = 0.0f;
    for (int c = lane; c < hr.hd; c += 32) {
        const float v = ld(x[c]);
        ss += v * v;
        keep[c] = x[c];
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / float(hr.hd) + eps);
    for (int c = lane; c < hr.hd; c += 32) x[c] = st<T>(ld(keep[c]) * r * ld(w[c]));
    if (lane == 0) rstd[i] = r;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    qk_norm_dinp_kernel(T * dqkv, const T * raw, const float * rstd, const T * wq, const T * wk, HeadRows hr) {
    const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    if (i >= hr.rows) return;
    const int lane = threadIdx.x % 32;
    T * g = dqkv + hr.at(i);
    const T * x = raw + i * hr.hd;
    const T * w = i % hr.H < hr.NH ? wq : wk;
    const float r = rstd[i];
    float sum_dnn = 0.0f;
    for (int c = lane; c < hr.hd; c += 32) sum_dnn += ld(w[c]) * ld(g[c]) * (ld(x[c]) * r);
    const float mean_dnn = warp_sum(sum_dnn) / float(hr.hd);
    for (int c = lane; c < hr.hd; c += 32) {
        const float n = ld(x[c]) * r, dn = ld(w[c]) * ld(g[c]);
        g[c] = st<T>(r * (dn - n * mean_dnn));
    }
}

// dwq (blockIdx.y 0) or dwk (1) += sum over the norm's head rows of dy * x * rstd: a block per 32
// columns, 8 row lanes each summing rows lane, lane + 8, ... in fp32, combined in a fixed order;
// one rounded add per element. Runs before qk_norm_dinp_kernel overwrites dy.
template <class G, class T>
__global__ void __launch_bounds__(kThreads)
    qk_norm_dw_kernel(G * dwq, G * dwk, const T * dqkv, const T * raw, const float * rstd, HeadRows hr) {
    __shared__ float part[kRowsPerBlock][33];
    const int col = threadIdx.x % 32, lane = threadIdx.x / 32;
    const int c = int(blockIdx.x) * 32 + col;
    const bool k = blockIdx.y == 1;
    const int h0 = k ? hr.NH : 0, nh = k ? hr.H - hr.NH : hr.NH;
    const int64_t n_rows = hr.rows / hr.H * nh;
    float acc = 0.0f;
    if (c < hr.hd)
        for (int64_t j = lane; j < n_rows; j += kRowsPerBlock) {
            const int64_t i = (j / nh) * hr.H + h0 + j % nh;
            acc += ld(dqkv[hr.at(i) + c]) * (ld(raw[i * hr.hd + c]) * rstd[i]);
        }
    part[lane][col] = acc;
    __syncthreads();
    if (lane != 0 || c >= hr.hd) return;
    float sum = 0.0f;
    for (int l = 0; l < kRowsPerBlock; ++l) sum += part[l][col];
    G * dw = k ? dwk : dwq;
    dw[c] = st<G>(ld(dw[c]) + sum);
}

HeadRows head_rows(const Tensor & qkv, const Tensor & raw, const Tensor & rstd, const Tensor & wq, const Tensor & wk,
                   int NH, int KVH) {
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && qkv.cols() % (NH + 2 * KVH) == 0);
    const int hd = int(qkv.cols() / (NH + 2 * KVH));
    MF_ASSERT(raw.dtype == qkv.dtype && wq.dtype == qkv.dtype && wk.dtype == qkv.dtype && rstd.dtype == DType::f32);
    MF_ASSERT(raw.numel() == qkv.rows() * (NH + KVH) * hd && rstd.numel() == qkv.rows() * (NH + KVH));
    MF_ASSERT(wq.numel() == hd && wk.numel() == hd);
    return HeadRows{qkv.rows() * (NH + KVH), NH + KVH, NH, hd, qkv.cols()};
}

}  // namespace

void qk_norm_fwd(cudaStream_t s, Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps) {
    const HeadRows hr = head_rows(qkv, raw, rstd, wq, wk, NH, KVH);
    if (hr.rows == 0) return;
    dispatch_float(qkv.dtype, [&](auto z) {
        using T = decltype(z);
        qk_norm_fwd_kernel<<<row_blocks(hr.rows), kThreads, 0, s>>>(ptr<T>(qkv), ptr<T>(raw), ptr<float>(rstd),
                                                                   ptr<T>(wq), ptr<T>(wk), hr, eps);
        MF_CUDA_LAUNCHED();
    });
}

void qk_norm_bwd(cudaStream_t s, Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd,
                 int NH, int KVH) {
    const HeadRows hr = head_rows(dqkv, raw, rstd, wq, wk, NH, KVH);
    MF_ASSERT(dwq.valid() == dwk.valid());
    if (hr.rows == 0) return;
    dispatch_float(dqkv.dtype, [&](auto z) {
        using T = decltype(z);
        if (dwq.valid()) {
            MF_ASSERT(dwq.numel() == hr.hd && dwk.numel() == hr.hd && dwk.dtype == dwq.dtype &&
                      (dwq.dtype == DType::f32 || dwq.dtype == dqkv.dtype));
            const dim3 grid(unsigned((hr.hd + 31) / 32), 2);
            auto run = [&](auto g) {
                using G = decltype(g);
                qk_norm_dw_kernel<<<grid, kThreads, 0, s>>>(ptr<G>(dwq), ptr<G>(dwk), ptr<T>(dqkv), ptr<T>(raw),
                                                            ptr<float>(rstd), hr);
                MF_CUDA_LAUNCHED();
            };
            if (dwq.dtype == DType::f32) run(float{}); else run(T{});
        }
        qk_norm_dinp_kernel<<<row_blocks(hr.rows), kThreads, 0, s>>>(ptr<T>(dqkv), ptr<T>(raw), ptr<float>(rstd),
                                                                    ptr<T>(wq), ptr<T>(wk), hr);
        MF_CUDA_LAUNCHED();
    });
}

void bias_grad(cudaStream_t s, Tensor dbias, Tensor dout) {
    const int64_t N = dout.rows(), OC = dout.cols();
    MF_ASSERT(dbias.numel() == OC && (dbias.dtype == DType::f32 || dbias.dtype == dout.dtype));
    if (N == 0 || OC == 0) return;
    dispatch_float(dout.dtype, [&](auto z) {
        using T = decltype(z);
        colsum<ColSum::kBias, T>(s, Tensor{}, dbias, ptr<T>(dout), nullptr, nullptr, nullptr, N, OC);
    });
}

void layernorm_fwd(cudaStream_t s, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
    MF_ASSERT(out.dtype == inp.dtype && w.dtype == inp.dtype && b.dtype == inp.dtype);
    const int64_t N = inp.rows(), C = inp.cols();
    MF_ASSERT(out.numel() == inp.numel() && w.numel() == C && b.numel() == C);
    MF_ASSERT(mean.dtype == DType::f32 && rstd.dtype == DType::f32 && mean.numel() == N && rstd.numel() == N);
    if (N == 0 || C == 0) return;
    dispatch_float(inp.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = C % (16 / sizeof(T)) == 0 && aligned16({out.data, inp.data, w.data, b.data});
        with_vec<T>(vec, [&](auto v) {
            layernorm_fwd_kernel<decltype(v)::value><<<row_blocks(N), kThreads, 0, s>>>(
                ptr<T>(out), ptr<float>(mean), ptr<float>(rstd), ptr<T>(inp), ptr<T>(w), ptr<T>(b), N, int(C), eps);
            MF_CUDA_LAUNCHED();
        });
    });
}

void layernorm_bwd(cudaStream_t s, Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                   Tensor rstd) {
    MF_ASSERT(dw.valid() == db.valid() && mean.valid());
    norm_bwd(s, dinp, dw, db, dout, inp, w, mean, rstd);
}

void rmsnorm_fwd(cudaStream_t s, Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) {
    MF_ASSERT(out.dtype == inp.dtype && w.dtype == inp.dtype);
    const int64_t N = inp.rows(), C = inp.cols();
    MF_ASSERT(out.numel() == inp.numel() && w.numel() == C && rstd.dtype == DType::f32 && rstd.numel() == N);
    if (N == 0 || C == 0) return;
    dispatch_float(inp.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = C % (16 / sizeof(T)) == 0 && aligned16({out.data, inp.data, w.data});
        with_vec<T>(vec, [&](auto v) {
            rmsnorm_fwd_kernel<decltype(v)::value><<<row_blocks(N), kThreads, 0, s>>>(ptr<T>(out), ptr<float>(rstd), ptr<T>(inp),
                                                                           ptr<T>(w), N, int(C), eps);
            MF_CUDA_LAUNCHED();
        });
    });
}

void rmsnorm_bwd(cudaStream_t s, Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) {
    norm_bwd(s, dinp, dw, Tensor{}, dout, inp, w, Tensor{}, rstd);
}

}  // namespace memfit::cuda
