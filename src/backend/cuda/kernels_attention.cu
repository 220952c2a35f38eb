// CUDA kernels: the naive causal attention (T x T probabilities saved) and attention over a KV
// cache. Contracts in backend/backend.h; reference: backend/cpu/kernels_attention.cpp and
// kernels_decode.cpp. The simple path (tests, small T, generation): one block per row, plain
// CUDA cores, every accumulation in fp32, each output element stored (rounded) once.
//
// Layout: qkv[b,t,:] = [q | k | v], each C = NH*hs wide, head h at columns h*hs..(h+1)*hs.
// Row kernels use kThreads threads; a warp computes one dot product over hs at a time (lanes
// over the head dimension, coalesced), and a weighted sum of rows (out = sum_j w_j row_j) is
// split over ceil(kThreads/hs) groups of hs threads, reduced through shared memory.
#include <algorithm>
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// q . row over hs elements by one warp (q in shared memory, fp32); every lane gets the sum.
template <class S> __device__ __forceinline__ float warp_dot(const float * q, const S * row, int hs) {
    float d = 0.0f;
    for (int i = threadIdx.x % 32; i < hs; i += 32) d += q[i] * ld(row[i]);
    return warp_sum(d);
}

// f(i, sum_{j<n} w[j] * base[at(j) + i]) for i < hs, called by some thread for each i; at(j) is
// row j's element offset. w in shared memory; red: kThreads floats of shared memory. Call from
// every thread.
template <class S, class F, class At>
__device__ __forceinline__ void weighted_rows_at(const float * w, int n, const S * base, int hs, float * red, F && f,
                                                 At && at) {
    const int tid = threadIdx.x;
    const int G = hs <= kThreads ? kThreads / hs : 1;  // groups of hs threads, each over keys j = g mod G
    if (G == 1) {
        for (int i = tid; i < hs; i += kThreads) {
            float acc = 0.0f;
            for (int j = 0; j < n; ++j) acc += w[j] * ld(base[at(j) + i]);
            f(i, acc);
        }
        return;
    }
    const int i = tid % hs, g = tid / hs;
    float acc = 0.0f;
    if (g < G)
        for (int j = g; j < n; j += G) acc += w[j] * ld(base[at(j) + i]);
    red[tid] = acc;
    __syncthreads();
    if (tid < hs) {
        float s = 0.0f;
        for (int gg = 0; gg < G; ++gg) s += red[gg * hs + tid];
        f(tid, s);
    }
    __syncthreads();
}

// The same with row(j) = j, or (first + j) % ring for a ring of rows (ring > 0: a sliding
// window's KV cache), rows `stride` elements apart.
template <class S, class F>
__device__ __forceinline__ void weighted_rows(const float * w, int n, const S * base, size_t stride, int hs,
                                              float * red, F && f, int first = 0, int ring = 0) {
    weighted_rows_at(w, n, base, hs, red, f,
                     [&](int j) { return ring > 0 ? size_t((first + j) % ring) * stride : size_t(j) * stride; });
}

// One causal attention row per block: query t of head h of batch b (blockIdx.x = (b*NH+h)*Tq+t)
// scores keys lo .. pos0+t, softmax, and sums the values; lo = doc[b*Tq+t] (packed documents:
// the query's document start) or 0. Shared memory: q (hs floats), the score row (pos0+Tq
// floats), the reduction buffer (kThreads floats). att (optional): the probability row, T_att
// wide, zeros outside keys lo .. pos0+t.
struct RowArgs {
    const void * q; const void * k; const void * v; void * out; void * att;
    size_t q_b, q_t, kv_b, kv_t, o_b, o_t;  // element strides: per batch and per token
    int NH, group, hs, Tq, pos0, att_T;
    const int32_t * doc;                    // [B, Tq] or null
    // Generation under a sliding window: keys from pos0 + t - window + 1, key position p in cache
    // row p % ring (ring 0: row p).
    int window, ring;
};

// sc[j] = softmax over keys j < nk of score(j) (each score computed by one warp; score must give
// every lane of the warp the same value, as warp_dot does): the probabilities, each written by
// the thread that exponentiated it. stat: 32 floats of shared memory. Call from every thread.
template <class F>
__device__ __forceinline__ void softmax_scores(float * sc, int nk, float * stat, F && score) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float mx = -INFINITY;
    for (int j = warp; j < nk; j += kWarps) {
        const float s = score(j);
        if (lane == 0) sc[j] = s;
        mx = fmaxf(mx, s);
    }
    if (lane == 0) stat[warp] = mx;  // mx is uniform in a warp
    __syncthreads();                  // also publishes the scores
    mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, stat[w]);
    float part = 0.0f;
    for (int j = threadIdx.x; j < nk; j += kThreads) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        part += e;
    }
    const float inv = 1.0f / block_sum(part, stat);
    for (int j = threadIdx.x; j < nk; j += kThreads) sc[j] *= inv;
}

template <class S> __global__ void __launch_bounds__(kThreads) attention_row_kernel(RowArgs a) {
    extern __shared__ float smem[];
    float * qs = smem;
    float * red = qs + a.hs;
    float * sc = red + kThreads;
    __shared__ float stat[32];
    const int task = blockIdx.x;
    const int t = task % a.Tq, h = (task / a.Tq) % a.NH, b = task / (a.Tq * a.NH);
    const S * q = static_cast<const S *>(a.q) + b * a.q_b + t * a.q_t + size_t(h) * a.hs;
    const size_t kvh = size_t(h / a.group) * a.hs;
    // keys lo .. pos0+t, at sc[j - lo]
    const int lo = a.window > 0 ? max(0, a.pos0 + t - a.window + 1) : a.doc ? a.doc[size_t(b) * a.Tq + t] : 0;
    const size_t first = a.ring > 0 ? 0 : size_t(lo);   // a ring's rows are found per key (weighted_rows)
    const S * kb = static_cast<const S *>(a.k) + b * a.kv_b + kvh + first * a.kv_t;
    const S * vb = static_cast<const S *>(a.v) + b * a.kv_b + kvh + first * a.kv_t;
    auto krow = [&](int j) { return a.ring > 0 ? size_t((lo + j) % a.ring) * a.kv_t : size_t(j) * a.kv_t; };
    const float scale = 1.0f / sqrtf(float(a.hs));
    const int nk = a.pos0 + t + 1 - lo;

    for (int i = threadIdx.x; i < a.hs; i += kThreads) qs[i] = ld(q[i]);
    __syncthreads();
    softmax_scores(sc, nk, stat, [&](int j) { return warp_dot(qs, kb + krow(j), a.hs) * scale; });
    if (a.att) {
        S * arow = static_cast<S *>(a.att) + size_t(task) * a.att_T;
        // Each thread stores the scores it normalized (sc[j] at key lo + j: no barrier needed).
        for (int j = threadIdx.x; j < nk; j += kThreads) arow[lo + j] = st<S>(sc[j]);
        for (int j = threadIdx.x; j < a.att_T; j += kThreads)
            if (j < lo || j - lo >= nk) arow[j] = st<S>(0.0f);
    }
    __syncthreads();
    S * o = static_cast<S *>(a.out) + b * a.o_b + t * a.o_t + size_t(h) * a.hs;
    weighted_rows(sc, nk, vb, a.kv_t, a.hs, red, [&](int i, float x) { o[i] = st<S>(x); }, lo, a.ring);
}

// Backward, query side: one block per (b,h,t) row, over keys j = lo .. t (lo: doc[b*T+t] or 0).
// datt[j] = dout_t . v_j, s = sum_j att_j datt_j (saved in scratch[(b*NH+h)*T+t]), dpre_j = att_j
// (datt_j - s) scale, dq_t = sum_j dpre_j k_j. Shared: dout row (hs), reduction buffer
// (kThreads), dpre row (T).
template <class S>
__global__ void __launch_bounds__(kThreads)
attention_bwd_q_kernel(S * dqkv, float * scratch, const S * dout, const S * qkv, const S * att, int T, int C, int NH,
                       const int32_t * doc) {
    extern __shared__ float smem[];
    float * go = smem;
    const int hs = C / NH;
    float * red = go + hs;
    float * buf = red + kThreads;
    __shared__ float stat[32];
    const int task = blockIdx.x;
    const int t = task % T, h = (task / T) % NH, b = task / (T * NH);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t C3 = size_t(3) * C;
    const int lo = doc ? doc[size_t(b) * T + t] : 0;   // keys lo .. t, at index j - lo
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * hs;
    const S * kv = base + size_t(lo) * C3;
    const S * arow = att + size_t(task) * T + lo;
    const float scale = 1.0f / sqrtf(float(hs));
    const int nk = t + 1 - lo;
    for (int i = threadIdx.x; i < hs; i += kThreads) go[i] = ld(dout[(size_t(b) * T + t) * C + size_t(h) * hs + i]);
    __syncthreads();
    float part = 0.0f;
    for (int j = warp; j < nk; j += kWarps) {
        const float d = warp_dot(go, kv + 2 * size_t(C) + size_t(j) * C3, hs);
        if (lane == 0) {
            buf[j] = d;
            part += ld(arow[j]) * d;
        }
    }
    const float s = block_sum(part, stat);
    if (threadIdx.x == 0) scratch[task] = s;
    for (int j = threadIdx.x; j < nk; j += kThreads) buf[j] = ld(arow[j]) * (buf[j] - s) * scale;
    __syncthreads();
    S * dq = dqkv + (size_t(b) * T + t) * C3 + size_t(h) * hs;
    weighted_rows(buf, nk, kv + C, C3, hs, red, [&](int i, float x) { dq[i] = st<S>(x); });
}

// Backward, key side: one block per (b,h,j) key row; queries t = j .. e-1, e = T or, with packed
// documents, the end of key j's document (the first t with doc[b*T+t] > j: doc_start is
// non-decreasing along a row, so the queries that see key j are contiguous from j).
// dv_j = sum_t att[t,j] dout_t;  dk_j = sum_t att[t,j] (dout_t . v_j - s_t) scale q_t.
// Shared: v row (hs), reduction buffer (kThreads), att column and dpre column (T each).
template <class S>
__global__ void __launch_bounds__(kThreads)
attention_bwd_kv_kernel(S * dqkv, const float * scratch, const S * dout, const S * qkv, const S * att, int T, int C,
                        int NH, const int32_t * doc) {
    extern __shared__ float smem[];
    float * vs = smem;
    const int hs = C / NH;
    float * red = vs + hs;
    float * pa = red + kThreads;
    float * pd = pa + T;
    const int task = blockIdx.x;
    const int j = task % T, h = (task / T) % NH, b = task / (T * NH);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t C3 = size_t(3) * C;
    const S * base = qkv + size_t(b) * T * C3 + size_t(h) * hs;
    const size_t bh = size_t(b) * NH + h;
    const S * gbase = dout + size_t(b) * T * C + size_t(h) * hs;
    const float scale = 1.0f / sqrtf(float(hs));
    const int n = doc_end(doc, b, T, j) - j;  // queries j .. end-1, at index t - j
    for (int i = threadIdx.x; i < hs; i += kThreads) vs[i] = ld(base[2 * size_t(C) + size_t(j) * C3 + i]);
    __syncthreads();
    for (int r = warp; r < n; r += kWarps) {
        const int t = j + r;
        const float d = warp_dot(vs, gbase + size_t(t) * C, hs);
        if (lane == 0) {
            const float p = ld(att[(bh * T + t) * T + j]);
            pa[r] = p;
            pd[r] = p * (d - scratch[bh * T + t]) * scale;
        }
    }
    __syncthreads();
    S * drow = dqkv + (size_t(b) * T + j) * C3 + size_t(h) * hs;
    weighted_rows(pa, n, gbase + size_t(j) * C, size_t(C), hs, red,
                  [&](int i, float x) { drow[2 * size_t(C) + i] = st<S>(x); });
    weighted_rows(pd, n, base + size_t(j) * C3, C3, hs, red, [&](int i, float x) { drow[C + i] = st<S>(x); });
}

// Appends the new tokens' k and v rows to the caches: one thread per element.
template <class S>
__global__ void append_kv_kernel(S * kc, S * vc, const S * qkv, int Tn, int pos0, int cap, size_t Q, size_t KV) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(Tn) * KV) return;
    const int b = blockIdx.y;  // gridDim.y = B
    const size_t t = i / KV, c = i % KV;
    const S * src = qkv + (size_t(b) * Tn + t) * (Q + 2 * KV);
    const size_t dst = (size_t(b) * cap + (pos0 + t) % cap) * KV + c;
    kc[dst] = src[Q + c];
    vc[dst] = src[Q + KV + c];
}

// Dynamic shared memory of a row kernel; opts in above the 48 KiB default.
template <class K> size_t smem_for(K kernel, size_t bytes) {
    MF_ASSERT(bytes <= size_t(200) << 10 && "attention row too long for the naive kernels (use flash attention)");
    if (bytes > (size_t(48) << 10))
        MF_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return bytes;
}

}  // namespace

void attention_fwd(cudaStream_t s, Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start) {
    MF_ASSERT(out.dtype == qkv.dtype && att.dtype == qkv.dtype);
    const int B = int(qkv.dim(0)), T = int(qkv.dim(1)), C = int(out.cols());
    MF_ASSERT(NH > 0 && C % NH == 0 && qkv.cols() == 3 * int64_t(C) && att.numel() == int64_t(B) * NH * T * T);
    const int32_t * doc = docs(doc_start, int64_t(B) * T);
    if (int64_t(B) * T == 0) return;
    const int hs = C / NH;
    const size_t C3 = size_t(3) * C;
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        const S * p = ptr<S>(qkv);
        RowArgs a{p, p + C, p + 2 * size_t(C), out.data, att.data, size_t(T) * C3, C3, size_t(T) * C3, C3,
                  size_t(T) * C, size_t(C), NH, 1, hs, T, 0, T, doc, 0, 0};
        const size_t sm = smem_for(attention_row_kernel<S>, (size_t(hs) + kThreads + T) * sizeof(float));
        attention_row_kernel<S><<<unsigned(B * NH * T), kThreads, sm, s>>>(a);
        MF_CUDA_LAUNCHED();
    });
}

void attention_bwd(cudaStream_t s, Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH,
                   Tensor doc_start) {
    MF_ASSERT(dqkv.dtype == qkv.dtype && dout.dtype == qkv.dtype && att.dtype == qkv.dtype);
    const int B = int(qkv.dim(0)), T = int(qkv.dim(1)), C = int(dout.cols());
    MF_ASSERT(NH > 0 && C % NH == 0 && qkv.cols() == 3 * int64_t(C) && dqkv.numel() == qkv.numel());
    MF_ASSERT(scratch.numel() >= int64_t(B) * NH * T);
    const int32_t * doc = docs(doc_start, int64_t(B) * T);
    if (int64_t(B) * T == 0) return;
    const int hs = C / NH;
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        const unsigned rows = unsigned(B * NH * T);
        const size_t smq = smem_for(attention_bwd_q_kernel<S>, (size_t(hs) + kThreads + T) * sizeof(float));
        attention_bwd_q_kernel<S><<<rows, kThreads, smq, s>>>(ptr<S>(dqkv), scratch.f32(), ptr<S>(dout), ptr<S>(qkv),
                                                              ptr<S>(att), T, C, NH, doc);
        MF_CUDA_LAUNCHED();
        const size_t smk =
            smem_for(attention_bwd_kv_kernel<S>, (size_t(hs) + kThreads + 2 * size_t(T)) * sizeof(float));
        attention_bwd_kv_kernel<S><<<rows, kThreads, smk, s>>>(ptr<S>(dqkv), scratch.f32(), ptr<S>(dout), ptr<S>(qkv),
                                                               ptr<S>(att), T, C, NH, doc);
        MF_CUDA_LAUNCHED();
    });
}

void cached_attention_fwd(cudaStream_t s, Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH,
                          int KVH, int window) {
    MF_ASSERT(out.dtype == qkv.dtype && kcache.dtype == qkv.dtype && vcache.dtype == qkv.dtype);
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && qkv.cols() % (NH + 2 * KVH) == 0);
    const int hd = int(qkv.cols() / (NH + 2 * KVH));
    const int B = int(qkv.dim(0)), Tn = int(qkv.dim(1)), cap = int(kcache.dim(1));
    MF_ASSERT(out.numel() == int64_t(B) * Tn * NH * hd && kcache.numel() == int64_t(B) * cap * KVH * hd);
    MF_ASSERT(vcache.numel() == kcache.numel() && pos0 >= 0 && window >= 0);
    MF_ASSERT((pos0 + Tn <= cap || (window > 0 && Tn + window - 1 <= cap)) && "the KV cache cannot hold the window");
    const bool ring = window > 0 && pos0 + Tn > cap;
    if (int64_t(B) * Tn == 0) return;
    const size_t KV = size_t(KVH) * hd, Q = size_t(NH) * hd, row = Q + 2 * KV;
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        append_kv_kernel<S><<<dim3(grid_for(int64_t(Tn) * int64_t(KV), 256), unsigned(B)), 256, 0, s>>>(
            ptr<S>(kcache), ptr<S>(vcache), ptr<S>(qkv), Tn, pos0, cap, Q, KV);
        MF_CUDA_LAUNCHED();
        RowArgs a{qkv.data, kcache.data, vcache.data, out.data, nullptr, size_t(Tn) * row, row, size_t(cap) * KV, KV,
                  size_t(Tn) * Q, Q, NH, NH / KVH, hd, Tn, pos0, 0, nullptr, window, ring ? cap : 0};
        const int keys = window > 0 ? std::min(pos0 + Tn, window) : pos0 + Tn;
        const size_t sm = smem_for(attention_row_kernel<S>, (size_t(hd) + kThreads + size_t(keys)) * sizeof(float));
        attention_row_kernel<S><<<unsigned(B * NH * Tn), kThreads, sm, s>>>(a);
        MF_CUDA_LAUNCHED();
    });
}

namespace {

// Paged KV cache (backend/paged_kv.h). Writes each token row's key and value to its pool row:
// one thread per element of the n rows (pools of rows of `row_bytes`, in the compute dtype).
template <class S>
__global__ void paged_append_kernel(uint8_t * kp, uint8_t * vp, const S * qkv, const int32_t * meta, PagedKv kv, int n,
                                    size_t Q, size_t KV, int64_t row_bytes) {
    const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= size_t(n) * KV) return;
    const int i = int(e / KV);
    const size_t c = e % KV;
    const int seq = meta[kv.seq_at() + i];
    if (seq < 0) return;
    const int64_t slot = paged_slot(meta + kv.table_at() + int64_t(seq) * kv.max_blocks, kv.block, meta[kv.pos_at() + i]);
    const S * src = qkv + size_t(i) * (Q + 2 * KV);
    reinterpret_cast<S *>(kp + slot * row_bytes)[c] = src[Q + c];
    reinterpret_cast<S *>(vp + slot * row_bytes)[c] = src[Q + KV + c];
}

// The same into int8 pools: one thread per (row, KV head, k or v), its hd codes and scale as the
// CPU rounds them (kernels_decode.cpp: s = max |x| / 127, code = round-to-even(x / s)).
template <class S>
__global__ void paged_append_int8_kernel(uint8_t * kp, uint8_t * vp, const S * qkv, const int32_t * meta, PagedKv kv,
                                         int n, int NH, int KVH, int hd, int64_t row_bytes) {
    const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= int64_t(n) * KVH * 2) return;
    const int i = int(e / (2 * KVH)), h = int(e / 2 % KVH), which = int(e % 2);
    const int seq = meta[kv.seq_at() + i];
    if (seq < 0) return;
    const int64_t slot = paged_slot(meta + kv.table_at() + int64_t(seq) * kv.max_blocks, kv.block, meta[kv.pos_at() + i]);
    const size_t KV = size_t(KVH) * hd, Q = size_t(NH) * hd;
    const S * src = qkv + size_t(i) * (Q + 2 * KV) + Q + size_t(which) * KV + size_t(h) * hd;
    uint8_t * row = (which ? vp : kp) + slot * row_bytes;
    float amax = 0.0f;
    for (int c = 0; c < hd; ++c) amax = fmaxf(amax, fabsf(ld(src[c])));
    const float s = amax / 127.0f;
    for (int c = 0; c < hd; ++c) {
        const float code = s > 0.0f ? rintf(ld(src[c]) / s) : 0.0f;
        reinterpret_cast<int8_t *>(row)[size_t(h) * hd + c] = int8_t(fminf(127.0f, fmaxf(-127.0f, code)));
    }
    memcpy(row + KV + 4 * h, &s, 4);
}

// One (token row, head) per block (blockIdx.x = i * NH + h): the query scores its sequence's keys
// lo .. pos through the block table, in position order, as attention_row_kernel does; P is the
// pools' element (S, or int8_t codes with a scale per KV head after each row's codes).
template <class S, class P>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(S * out, const S * qkv, const uint8_t * kp,
                                                                   const uint8_t * vp, const int32_t * meta, PagedKv kv,
                                                                   int NH, int group, int hs, int window,
                                                                   int64_t row_bytes) {
    extern __shared__ float smem[];
    float * qs = smem;
    float * red = qs + hs;
    float * sc = red + kThreads;
    __shared__ float stat[32];
    const int i = blockIdx.x / NH, h = blockIdx.x % NH;
    const int KVH = NH / group;
    const size_t Q = size_t(NH) * hs, KV = size_t(KVH) * hs;
    S * o = out + size_t(i) * Q + size_t(h) * hs;
    const int seq = meta[kv.seq_at() + i];
    if (seq < 0) {   // a padding row (uniform over the block: no barrier is skipped by some threads only)
        for (int c = threadIdx.x; c < hs; c += kThreads) o[c] = st<S>(0.0f);
        return;
    }
    const int pos = meta[kv.pos_at() + i];
    const int32_t * blocks = meta + kv.table_at() + int64_t(seq) * kv.max_blocks;
    const int lo = window > 0 ? max(0, pos - window + 1) : 0, nk = pos + 1 - lo;
    const int kvh = h / group;
    auto slot = [&](int j) { return paged_slot(blocks, kv.block, lo + j); };
    auto scale_of = [&](const uint8_t * pool, int j) {   // an int8 row's scale of this KV head; 1 otherwise
        if (!kv.int8) return 1.0f;
        float s;
        memcpy(&s, pool + slot(j) * row_bytes + KV + 4 * kvh, 4);
        return s;
    };
    const S * q = qkv + size_t(i) * (Q + 2 * KV) + size_t(h) * hs;
    for (int c = threadIdx.x; c < hs; c += kThreads) qs[c] = ld(q[c]);
    __syncthreads();
    const float scale = 1.0f / sqrtf(float(hs));
    softmax_scores(sc, nk, stat, [&](int j) {
        const P * krow = reinterpret_cast<const P *>(kp + slot(j) * row_bytes) + size_t(kvh) * hs;
        return warp_dot(qs, krow, hs) * scale_of(kp, j) * scale;
    });
    if (kv.int8)   // the value's scale folded into its weight (each thread its own keys)
        for (int j = threadIdx.x; j < nk; j += kThreads) sc[j] *= scale_of(vp, j);
    __syncthreads();
    const P * vbase = reinterpret_cast<const P *>(vp) + size_t(kvh) * hs;
    weighted_rows_at(sc, nk, vbase, hs, red, [&](int c, float x) { o[c] = st<S>(x); },
                     [&](int j) { return size_t(slot(j) * row_bytes) / sizeof(P); });
}

}  // namespace

void paged_attention_fwd(cudaStream_t s, Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta,
                         const PagedKv & kv, int NH, int KVH, int window) {
    MF_ASSERT(out.dtype == qkv.dtype && kpool.dtype == (kv.int8 ? DType::u8 : qkv.dtype) && vpool.dtype == kpool.dtype);
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && qkv.cols() % (NH + 2 * KVH) == 0 && kv.enabled());
    const int hd = int(qkv.cols() / (NH + 2 * KVH)), n = int(qkv.rows());
    const int64_t row_bytes = paged_row_bytes(kv, KVH, hd, int64_t(dtype_size(qkv.dtype)));
    MF_ASSERT(out.numel() == int64_t(n) * NH * hd && kpool.nbytes() == size_t(kv.pool_rows() * row_bytes));
    MF_ASSERT(vpool.nbytes() == kpool.nbytes() && meta.dtype == DType::i32 && meta.numel() == kv.meta_words());
    if (n == 0) return;
    const size_t KV = size_t(KVH) * hd, Q = size_t(NH) * hd;
    // The scores of the longest context a row can reach (the positions are on the device).
    const int64_t ctx = int64_t(kv.max_blocks) * kv.block, keys = window > 0 ? std::min<int64_t>(ctx, window) : ctx;
    auto * kp = static_cast<uint8_t *>(kpool.data);
    auto * vp = static_cast<uint8_t *>(vpool.data);
    dispatch_float(qkv.dtype, [&](auto z) {
        using S = decltype(z);
        if (kv.int8) {
            paged_append_int8_kernel<S><<<grid_for(int64_t(n) * KVH * 2, 128), 128, 0, s>>>(
                kp, vp, ptr<S>(qkv), meta.i32(), kv, n, NH, KVH, hd, row_bytes);
        } else {
            paged_append_kernel<S><<<grid_for(int64_t(n) * int64_t(KV), 256), 256, 0, s>>>(
                kp, vp, ptr<S>(qkv), meta.i32(), kv, n, Q, KV, row_bytes);
        }
        MF_CUDA_LAUNCHED();
        const size_t sm_bytes = (size_t(hd) + kThreads + size_t(keys)) * sizeof(float);
        if (kv.int8) {
            const size_t sm = smem_for(paged_attention_kernel<S, int8_t>, sm_bytes);
            paged_attention_kernel<S, int8_t><<<unsigned(n * NH), kThreads, sm, s>>>(
                ptr<S>(out), ptr<S>(qkv), kp, vp, meta.i32(), kv, NH, NH / KVH, hd, window, row_bytes);
        } else {
            const size_t sm = smem_for(paged_attention_kernel<S, S>, sm_bytes);
            paged_attention_kernel<S, S><<<unsigned(n * NH), kThreads, sm, s>>>(
                ptr<S>(out), ptr<S>(qkv), kp, vp, meta.i32(), kv, NH, NH / KVH, hd, window, row_bytes);
        }
        MF_CUDA_LAUNCHED();
    });
}

}  // namespace memfit::cuda
