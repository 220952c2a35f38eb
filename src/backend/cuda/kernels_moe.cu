// CUDA kernels of the mixture of experts' routing (kernel_list.h's moe_*; the route's layout:
// backend/moe.h; the CPU's reference: backend/cpu/kernels_moe.cpp, followed operation for
// operation). The simple path: one thread per token row, per expert or per element, every sum in
// fp32 (the softmax's in double, as the CPU's) in the CPU's order, so results are deterministic
// and differ from the CPU's only by expf's rounding. Products that the CPU adds are rounded before
// the add (mul_rn: no fused multiply-add), so sums match the CPU's closely.
//
// moe_route: (1) per token, the softmax's max and 1 / sum, the top k (repeated scans of the
// row, ties to the lower expert) and their weights; the max and 1 / sum are parked in the route's
// order and slot parts (N floats each, N <= N*k), which the sort writes last. (2) per expert, the
// probabilities summed over the tokens in token order and the tokens sent to it (stats; counts
// into offsets). (3) per token, the squared log-sum-exp (into the order part). (4) one thread:
// the offsets' prefix sum and the log-sum-exps' sum (in double, token order). (5) per expert, the
// counting sort's placement: its choices in token order from its offset.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

constexpr int kThreads = 128;

// a * b rounded on its own (never fused into a following add), as the CPU computes it.
__device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

// A token row's max and sum of exp(x - max) (double), as the CPU's softmax_row.
template <class S> __device__ void row_softmax(const S * x, int E, float & m, double & sum) {
    m = ld(x[0]);
    for (int e = 1; e < E; ++e) {
        const float v = ld(x[e]);
        m = m < v ? v : m;
    }
    sum = 0;
    for (int e = 0; e < E; ++e) sum += double(expf(ld(x[e]) - m));
}

// Its probability e (rounded on its own: the sums of probabilities are the CPU's).
template <class S> __device__ __forceinline__ float prob(const S * x, int e, float m, float inv) {
    return mul_rn(expf(ld(x[e]) - m), inv);
}

// (1) One thread per token: the top k and their weights; the max and 1 / sum into m, inv.
template <class S>
__global__ void moe_topk_kernel(int32_t * expert, float * w, float * m_out, float * inv_out, const S * L, int64_t N,
                                int E, int k, bool norm) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const S * x = L + n * E;
    float m;
    double sum;
    row_softmax(x, E, m, sum);
    const float inv = float(1.0 / sum);
    int32_t * ex = expert + n * k;
    float * wn = w + n * k;
    float chosen = 0.0f;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        float pb = 0.0f;
        for (int e = 0; e < E; ++e) {
            bool taken = false;
            for (int i = 0; i < j && !taken; ++i) taken = ex[i] == e;
            if (taken) continue;
            const float p = prob(x, e, m, inv);
            if (best < 0 || p > pb) {
                best = e;
                pb = p;
            }
        }
        ex[j] = best;
        wn[j] = pb;
        chosen += pb;
    }
    if (norm)
        for (int j = 0; j < k; ++j) wn[j] /= chosen;
    m_out[n] = m;
    inv_out[n] = inv;
}

// (2) One thread per expert: its probabilities summed in token order (stats[E + e]) and the
// choices sent to it (stats[e] as a float, counts[e] = offsets[e + 1]).
template <class S>
__global__ void moe_expert_stats_kernel(float * stats, int32_t * counts, const S * L, const float * m,
                                        const float * inv, const int32_t * expert, int64_t N, int E, int k) {
    const int e = int(int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
    if (e >= E) return;
    float psum = 0.0f;
    for (int64_t n = 0; n < N; ++n) psum += prob(L + n * E, e, m[n], inv[n]);
    int32_t c = 0;
    for (int64_t i = 0; i < N * k; ++i) c += expert[i] == e;
    stats[e] = float(c);
    stats[E + e] = psum;
    counts[e] = c;
}

// (3) One thread per token: its log-sum-exp squared.
template <class S> __global__ void moe_lse2_kernel(float * lse2, const S * L, int64_t N, int E) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float m;
    double sum;
    row_softmax(L + n * E, E, m, sum);
    const float lse = m + float(log(sum));
    lse2[n] = lse * lse;
}

// (4) One thread: offsets (the counts in offsets[1..E]) to their prefix sums; the squared
// log-sum-exps (as the bits of the order part's first N) summed in double into stats[2E].
__global__ void moe_offsets_kernel(int32_t * offsets, float * stats, const int32_t * lse2_bits, int64_t N, int E) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double z = 0;
    for (int64_t n = 0; n < N; ++n) z += __int_as_float(lse2_bits[n]);
    stats[2 * E] = float(z);
    stats[2 * E + 1] = 0.0f;   // dropped: moe_counts'
    offsets[0] = 0;
    for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
}

// (5) One thread per expert: its choices, in token order, to slots offsets[e] ...
__global__ void moe_place_kernel(int32_t * order, int32_t * slot, const int32_t * offsets, const int32_t * expert,
                                 int64_t NK, int E) {
    const int e = int(int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
    if (e >= E) return;
    int32_t s = offsets[e];
    for (int64_t c = 0; c < NK; ++c)
        if (expert[c] == e) {
            order[s] = int32_t(c);
            slot[c] = s;
            ++s;
        }
}

// One thread per token: dlogits from dwts through the weights, plus the auxiliary losses'.
struct RouteBwd {
    int64_t N;
    int E, k, layers, width;
    bool norm;
    double aux_scale, LN2;   // d.aux_scale, (layers x N)^2 x stat_ranks
    float zf;                // 2 z_scale / (layers x N)
};

// The load-balancing loss's gradient on p[., e] (the CPU's aux[e]).
__device__ __forceinline__ float aux_grad(const float * stats_all, int e, const RouteBwd & d) {
    double c = 0;
    for (int l = 0; l < d.layers; ++l) c += stats_all[int64_t(l) * d.width + e];
    return float(d.aux_scale * d.E * c / d.LN2);
}

template <class S>
__global__ void moe_route_bwd_kernel(S * D, const float * dwts, const S * L, const int32_t * expert, const float * wts,
                                     const float * stats_all, RouteBwd d) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (n >= d.N) return;
    const S * x = L + n * d.E;
    float m;
    double sum;
    row_softmax(x, d.E, m, sum);
    const float inv = float(1.0 / sum), lse = m + float(log(sum));
    const int32_t * ex = expert + n * d.k;
    const float * dw = dwts + n * d.k, * w = wts + n * d.k;
    float chosen = 0.0f, dot_w = 0.0f;
    for (int j = 0; j < d.k; ++j) {
        chosen += prob(x, ex[j], m, inv);
        dot_w += mul_rn(dw[j], w[j]);
    }
    // dp[e]: aux[e], plus the weights' gradient where e is one of the token's experts.
    auto dp = [&](int e) {
        float v = aux_grad(stats_all, e, d);
        for (int j = 0; j < d.k; ++j)
            if (ex[j] == e) v += d.norm ? (dw[j] - dot_w) / chosen : dw[j];
        return v;
    };
    float dot = 0.0f;
    for (int e = 0; e < d.E; ++e) dot += mul_rn(prob(x, e, m, inv), dp(e));
    const float zl = mul_rn(d.zf, lse);
    S * out = D + n * d.E;
    for (int e = 0; e < d.E; ++e) out[e] = st<S>(prob(x, e, m, inv) * (dp(e) - dot + zl));
}

// Each choice's routed row: its slot, or under a capacity its row of the capacity layout
// (backend/moe.h; -1: dropped).
struct Rows {
    const int32_t * slot, * offsets, * expert;
    int64_t cap;
    __device__ __forceinline__ int64_t at(int64_t c) const {
        if (cap == 0) return slot[c];
        const int32_t e = expert[c];
        const int64_t pos = slot[c] - offsets[e];
        return pos < cap ? int64_t(e) * cap + pos : -1;
    }
};

Rows rows_of(const MoeRoute & rt, const MoeDesc & d) { return Rows{rt.slot, rt.offsets, rt.expert, d.capacity}; }

// out [N*k, C] rows: out[s] = x[order[s] / k] (T: the element's bits). Under a capacity (cap >
// 0): out [E*cap, C], row e*cap + i expert e's i-th routed row while it has one, else zeros.
template <class T>
__global__ void moe_gather_kernel(T * out, const T * x, const int32_t * order, const int32_t * offsets, int64_t rows,
                                  int64_t C, int k, int64_t cap) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= rows * C) return;
    const int64_t s = id / C, c = id % C;
    if (cap == 0) {
        out[id] = x[int64_t(order[s] / k) * C + c];
        return;
    }
    const int64_t e = s / cap, at = offsets[e] + s % cap;
    out[id] = at < offsets[e + 1] ? x[int64_t(order[at] / k) * C + c] : T(0);
}

// dx [N, C] (+)= the sum over each token's k slots of dxs (j order, as the CPU).
template <class G, class S>
__global__ void moe_scatter_kernel(G * dx, const S * dxs, Rows r, int64_t N, int64_t C, int k, bool accumulate) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= N * C) return;
    const int64_t n = id / C, c = id % C;
    float acc = accumulate ? ld(dx[id]) : 0.0f;
    for (int j = 0; j < k; ++j)
        if (const int64_t s = r.at(n * k + j); s >= 0) acc += ld(dxs[s * C + c]);
    dx[id] = st<G>(acc);
}

// out [N, C] = sum_j wts[n, j] y[slot(n, j)].
template <class S>
__global__ void moe_combine_kernel(S * out, const S * y, const float * wts, Rows r, int64_t N, int64_t C, int k) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= N * C) return;
    const int64_t n = id / C, c = id % C;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
        if (const int64_t s = r.at(n * k + j); s >= 0) acc += mul_rn(wts[n * k + j], ld(y[s * C + c]));
    out[id] = st<S>(acc);
}

// dwts[c] = g[row(c)] . act[row(c)] (0: dropped), one thread per choice.
template <class S>
__global__ void moe_wdot_kernel(float * dwts, const S * g, const S * act, Rows r, int64_t choices, int64_t F) {
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= choices) return;
    const int64_t s = r.at(c);
    float dot = 0.0f;
    for (int64_t i = 0; s >= 0 && i < F; ++i) dot += mul_rn(ld(g[s * F + i]), ld(act[s * F + i]));
    dwts[c] = dot;
}

// Then g [rows, F] and dys [rows, C] (null: none) times their choice's weight, one thread per
// element of a choice's two rows.
template <class S, class Y>
__global__ void moe_wscale_kernel(S * g, Y * dys, const float * wts, Rows r, int64_t choices, int64_t F, int64_t C) {
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= choices * (F + C)) return;
    const int64_t c = id / (F + C), i = id % (F + C), s = r.at(c);
    if (s < 0) return;
    const float w = wts[c];
    if (i < F) g[s * F + i] = st<S>(ld(g[s * F + i]) * w);
    else dys[s * C + (i - F)] = st<Y>(ld(dys[s * C + (i - F)]) * w);
}

// moe_counts' "probs" policy: one thread per expert over the capacity, its span sorted by weight
// (insertion sort: highest first, ties by the lower choice, the CPU's order) and its slots renewed.
__global__ void moe_order_by_weight_kernel(int32_t * order, int32_t * slot, const int32_t * offsets, const float * w,
                                           int E, int64_t cap) {
    const int e = int(int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
    if (e >= E || offsets[e + 1] - offsets[e] <= cap) return;
    for (int32_t i = offsets[e] + 1; i < offsets[e + 1]; ++i) {
        const int32_t c = order[i];
        int32_t j = i - 1;
        for (; j >= offsets[e] && (w[order[j]] < w[c] || (w[order[j]] == w[c] && order[j] > c)); --j)
            order[j + 1] = order[j];
        order[j + 1] = c;
    }
    for (int32_t s = offsets[e]; s < offsets[e + 1]; ++s) slot[order[s]] = s;
}

// moe_counts: one thread.
__global__ void moe_counts_kernel(int32_t * counts, float * stats, const int32_t * offsets, int E, int64_t cap) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double dropped = 0;
    for (int e = 0; e < E; ++e) {
        const int64_t n = offsets[e + 1] - offsets[e];
        counts[e] = int32_t(n < cap ? n : cap);
        if (n > cap) dropped += double(n - cap);
    }
    stats[2 * E + 1] = float(dropped);
}

void check_route(const Tensor & route, int64_t N, const MoeDesc & d) {
    MF_ASSERT(route.dtype == DType::i32 && route.numel() == moe_route_elems(N, d));
    MF_ASSERT(d.top_k > 0 && d.top_k <= d.experts);
}

// Calls f(T{}) with T an unsigned integer of dtype t's size (a copy of the element's bits).
template <class F> void dispatch_bits(DType t, F && f) {
    switch (dtype_size(t)) {
        case 1: f(uint8_t{}); return;
        case 2: f(uint16_t{}); return;
        case 4: f(uint32_t{}); return;
        default: MF_ASSERT(false && "element of 1, 2 or 4 bytes expected");
    }
}

}  // namespace

void moe_route(cudaStream_t s, Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d) {
    const int64_t N = logits.rows();
    const int E = d.experts, k = d.top_k;
    MF_ASSERT(logits.cols() == E && wts.dtype == DType::f32 && wts.numel() == N * k);
    MF_ASSERT(stats.dtype == DType::f32 && stats.numel() == moe_stats_width(d));
    check_route(route, N, d);
    int32_t * offsets = route.i32();
    int32_t * order = offsets + (E + 1);
    int32_t * slot = order + N * k;
    int32_t * expert = slot + N * k;
    // Scratch until (5): the max into order's first N, 1 / sum into slot's, then the squared
    // log-sum-exps into order's.
    float * m = reinterpret_cast<float *>(order);
    float * inv = reinterpret_cast<float *>(slot);
    dispatch_float(logits.dtype, [&](auto z) {
        using S = decltype(z);
        const S * L = ptr<S>(logits);
        if (N > 0) {
            moe_topk_kernel<S><<<grid_for(N, kThreads), kThreads, 0, s>>>(expert, wts.f32(), m, inv, L, N, E, k,
                                                                         d.norm_topk);
            MF_CUDA_LAUNCHED();
        }
        moe_expert_stats_kernel<S><<<grid_for(E, kThreads), kThreads, 0, s>>>(stats.f32(), offsets + 1, L, m, inv,
                                                                              expert, N, E, k);
        MF_CUDA_LAUNCHED();
        if (N > 0) {
            moe_lse2_kernel<S><<<grid_for(N, kThreads), kThreads, 0, s>>>(m, L, N, E);
            MF_CUDA_LAUNCHED();
        }
    });
    moe_offsets_kernel<<<1, 1, 0, s>>>(offsets, stats.f32(), order, N, E);
    MF_CUDA_LAUNCHED();
    moe_place_kernel<<<grid_for(E, kThreads), kThreads, 0, s>>>(order, slot, offsets, expert, N * k, E);
    MF_CUDA_LAUNCHED();
}

void moe_route_bwd(cudaStream_t s, Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts,
                   Tensor stats_all, const MoeDesc & d) {
    const int64_t N = logits.rows();
    const int E = d.experts, k = d.top_k;
    MF_ASSERT(dlogits.dtype == logits.dtype && dlogits.numel() == logits.numel() && logits.cols() == E);
    MF_ASSERT(dwts.dtype == DType::f32 && wts.dtype == DType::f32 && dwts.numel() == N * k);
    MF_ASSERT(stats_all.dtype == DType::f32 && stats_all.numel() == d.layers * moe_stats_width(d));
    check_route(route, N, d);
    if (N == 0) return;
    const MoeRoute rt(route.i32(), N, d);
    const double LN = double(d.layers) * double(N);
    const RouteBwd a{N, E, k, d.layers, int(moe_stats_width(d)), d.norm_topk, double(d.aux_scale),
                     LN * LN * double(d.stat_ranks),
                     float(2.0 * double(d.z_scale) / LN)};
    dispatch_float(logits.dtype, [&](auto z) {
        using S = decltype(z);
        moe_route_bwd_kernel<S><<<grid_for(N, kThreads), kThreads, 0, s>>>(
            ptr<S>(dlogits), dwts.f32(), ptr<S>(logits), rt.expert, wts.f32(), stats_all.f32(), a);
        MF_CUDA_LAUNCHED();
    });
}

void moe_gather(cudaStream_t s, Tensor out, Tensor x, Tensor route, const MoeDesc & d) {
    const int64_t N = x.rows(), C = x.cols(), k = d.top_k;
    const int64_t rows = moe_rows(N, d);
    MF_ASSERT(out.dtype == x.dtype && out.rows() == rows && out.cols() == C);
    check_route(route, N, d);
    if (rows * C == 0) return;
    const MoeRoute rt(route.i32(), N, d);
    dispatch_bits(x.dtype, [&](auto z) {
        using T = decltype(z);
        moe_gather_kernel<T><<<grid_for(rows * C, 256), 256, 0, s>>>(ptr<T>(out), ptr<T>(x), rt.order, rt.offsets,
                                                                     rows, C, int(k), d.capacity);
        MF_CUDA_LAUNCHED();
    });
}

void moe_counts(cudaStream_t s, Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d) {
    const int64_t N = wts.numel() / d.top_k;
    MF_ASSERT(d.capacity > 0 && counts.dtype == DType::i32 && counts.numel() == d.experts && wts.dtype == DType::f32);
    MF_ASSERT(stats.dtype == DType::f32 && stats.numel() == moe_stats_width(d));
    check_route(route, N, d);
    if (d.drop_probs && N > 0) {
        int32_t * order = route.i32() + d.experts + 1;
        moe_order_by_weight_kernel<<<grid_for(d.experts, kThreads), kThreads, 0, s>>>(
            order, order + N * d.top_k, route.i32(), wts.f32(), d.experts, d.capacity);
        MF_CUDA_LAUNCHED();
    }
    moe_counts_kernel<<<1, 1, 0, s>>>(counts.i32(), stats.f32(), route.i32(), d.experts, d.capacity);
    MF_CUDA_LAUNCHED();
}

void moe_scatter(cudaStream_t s, Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate) {
    const int64_t N = dx.rows(), C = dx.cols(), k = d.top_k;
    MF_ASSERT(dxs.rows() == moe_rows(N, d) && dxs.cols() == C);
    check_route(route, N, d);
    if (N * C == 0) return;
    const MoeRoute rt(route.i32(), N, d);
    dispatch_float(dx.dtype, [&](auto zd) {
        using G = decltype(zd);
        dispatch_float(dxs.dtype, [&](auto zs) {
            using S = decltype(zs);
            moe_scatter_kernel<G, S><<<grid_for(N * C, 256), 256, 0, s>>>(ptr<G>(dx), ptr<S>(dxs), rows_of(rt, d), N,
                                                                          C, int(k), accumulate);
            MF_CUDA_LAUNCHED();
        });
    });
}

void moe_combine(cudaStream_t s, Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d) {
    const int64_t N = out.rows(), C = out.cols(), k = d.top_k;
    MF_ASSERT(y.dtype == out.dtype && y.rows() == moe_rows(N, d) &&
              y.cols() == C && wts.numel() == N * k);
    MF_ASSERT(wts.dtype == DType::f32);
    check_route(route, N, d);
    if (N * C == 0) return;
    const MoeRoute rt(route.i32(), N, d);
    dispatch_float(out.dtype, [&](auto z) {
        using S = decltype(z);
        moe_combine_kernel<S><<<grid_for(N * C, 256), 256, 0, s>>>(ptr<S>(out), ptr<S>(y), wts.f32(), rows_of(rt, d),
                                                                   N, C, int(k));
        MF_CUDA_LAUNCHED();
    });
}

void moe_weight_bwd(cudaStream_t s, Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route,
                    const MoeDesc & d) {
    const int64_t k = d.top_k, choices = wts.numel(), N = choices / k, F = g.cols(), C = dys.valid() ? dys.cols() : 0;
    const int64_t rows = moe_rows(N, d);
    MF_ASSERT(act.dtype == g.dtype && act.rows() == rows && g.rows() == rows && act.cols() == F);
    MF_ASSERT(!dys.valid() || dys.rows() == rows);
    MF_ASSERT(dwts.dtype == DType::f32 && dwts.numel() == choices && wts.dtype == DType::f32);
    check_route(route, N, d);
    if (choices == 0) return;
    const MoeRoute rt(route.i32(), N, d);
    const Rows r = rows_of(rt, d);
    dispatch_float(g.dtype, [&](auto zg) {
        using S = decltype(zg);
        moe_wdot_kernel<S><<<grid_for(choices, kThreads), kThreads, 0, s>>>(dwts.f32(), ptr<S>(g), ptr<S>(act), r,
                                                                            choices, F);
        MF_CUDA_LAUNCHED();
        dispatch_float(dys.valid() ? dys.dtype : g.dtype, [&](auto zy) {
            using Y = decltype(zy);
            moe_wscale_kernel<S, Y><<<grid_for(choices * (F + C), 256), 256, 0, s>>>(
                ptr<S>(g), dys.valid() ? ptr<Y>(dys) : nullptr, wts.f32(), r, choices, F, C);
            MF_CUDA_LAUNCHED();
        });
    });
}

namespace {

// One thread per row: the gate's sigmoid, then the row (fp32 sums in column order, as the CPU).
template <class S>
__global__ void sigmoid_gate_fwd_kernel(S * out, const S * y, const S * logit, int64_t N, int64_t C) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float g = 1.0f / (1.0f + expf(-ld(logit[n])));
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = st<S>(ld(out[n * C + c]) + mul_rn(g, ld(y[n * C + c])));
}

template <class S>
__global__ void sigmoid_gate_bwd_kernel(S * dy, S * dlogit, const S * dout, const S * y, const S * logit, int64_t N,
                                        int64_t C) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float sg = 1.0f / (1.0f + expf(-ld(logit[n])));
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
        const float go = ld(dout[n * C + c]);
        dot += mul_rn(go, ld(y[n * C + c]));
        dy[n * C + c] = st<S>(mul_rn(sg, go));
    }
    dlogit[n] = st<S>(sg * (1.0f - sg) * dot);
}

}  // namespace

void sigmoid_gate_fwd(cudaStream_t s, Tensor out, Tensor y, Tensor logit) {
    const int64_t N = out.rows(), C = out.cols();
    MF_ASSERT(y.dtype == out.dtype && logit.dtype == out.dtype && y.numel() == N * C && logit.numel() == N);
    if (N == 0) return;
    dispatch_float(out.dtype, [&](auto z) {
        using S = decltype(z);
        sigmoid_gate_fwd_kernel<S><<<grid_for(N, 128), 128, 0, s>>>(ptr<S>(out), ptr<S>(y), ptr<S>(logit), N, C);
        MF_CUDA_LAUNCHED();
    });
}

void sigmoid_gate_bwd(cudaStream_t s, Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit) {
    const int64_t N = dout.rows(), C = dout.cols();
    MF_ASSERT(dy.dtype == dout.dtype && y.dtype == dout.dtype && logit.dtype == dout.dtype && dlogit.dtype == dout.dtype);
    MF_ASSERT(dy.numel() == N * C && y.numel() == N * C && logit.numel() == N && dlogit.numel() == N);
    if (N == 0) return;
    dispatch_float(dout.dtype, [&](auto z) {
        using S = decltype(z);
        sigmoid_gate_bwd_kernel<S><<<grid_for(N, 128), 128, 0, s>>>(ptr<S>(dy), ptr<S>(dlogit), ptr<S>(dout),
                                                                    ptr<S>(y), ptr<S>(logit), N, C);
        MF_CUDA_LAUNCHED();
    });
}

}  // namespace memfit::cuda
