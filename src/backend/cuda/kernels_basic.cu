// CUDA kernels: dtype copy, the token/position encoder and its backward, GELU,
// residual, dropout and LoRA's column slices. Contracts: backend.h; the CPU backend is the
// reference (backend/cpu/kernels_basic.cpp, kernels_gelu.cpp, kernels_lora.cpp).
//
// Elementwise ops run through map_kernel: a grid-stride loop in which each thread handles a pack
// of V elements, loaded and stored with one 8- or 16-byte access when every pointer is 16-byte
// aligned and rows are whole packs (else V = 1). The encoder backward's reductions over rows
// are deterministic: no atomics; each output element is summed by one thread in a
// fixed order. (bias_grad lives in kernels_norm.cu, with the norms' column sums.)
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/pack.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

constexpr int kThreads = 256;

// The wider of two storage types: its pack width is the one both tensors share.
template <class A, class B> using Wider = std::conditional_t<(sizeof(A) >= sizeof(B)), A, B>;

// ---- copy: dst = src converted (same dtype: a device-to-device memcpy) ----
template <class D, class S> struct CopyOp {
    D * dst; const S * src;
    template <int V> __device__ void run(int64_t i) const {
        const Pack<S, V> a = ldp<V>(src + i);
        Pack<D, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = st<D>(ld(a.v[k]));
        stp<V>(dst + i, o);
    }
};

// ---- encoder forward: out[r, c] = wte[tok - lo, c] + wpe[pos, c], pos = r % T (minus
// doc[r], the token's document start, with packed documents); a token outside rows
// [lo, lo + nrows) reads a zero row; a single term is copied exactly (as the CPU does). ----
template <class T> struct EncodeOp {
    T * out; const int32_t * tokens; const T * wte; const T * wpe; const int32_t * doc; int64_t seq, C, lo, nrows;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t r = i / C, c = i - r * C;
        const int64_t e = int64_t(tokens[r]) - lo;
        const bool has_w = tokens[r] >= 0 && e >= 0 && e < nrows;
        const int64_t pos = r % seq - (doc ? int64_t(doc[r]) : 0);
        Pack<T, V> o;
        if (has_w && wpe) {
            const Pack<T, V> w = ldp<V>(wte + e * C + c), p = ldp<V>(wpe + pos * C + c);
#pragma unroll
            for (int k = 0; k < V; ++k) o.v[k] = st<T>(ld(w.v[k]) + ld(p.v[k]));
        } else if (has_w || wpe) {
            o = has_w ? ldp<V>(wte + e * C + c) : ldp<V>(wpe + pos * C + c);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) o.v[k] = st<T>(0.0f);
        }
        stp<V>(out + i, o);
    }
};

// ---- encoder backward, dwte: one block (256 threads) per token row r. The block scans every
// token in chunks of 4096 (16 per thread): if an earlier row has the same token, another block
// owns that table row and this one exits; otherwise it sums its rows (r, then each later match,
// in row order) per column in fp32 shared memory and writes the table row once. The order of the
// additions is the CPU's: a float dwte starts from its value and adds row after row; a
// low-precision one gets the fp32 sum in one rounded add. Bitwise equal to the CPU backend.
// With packed documents, dwpe's rows collide too and are summed the same way (as the CPU does):
// K gives each row's table row: the tokens (an i32 array) or Positions (j % T - doc[j]). ----
struct Positions {
    const int32_t * doc; int64_t T;
    __device__ __forceinline__ int32_t operator[](int64_t j) const { return int32_t(j % T) - doc[j]; }
};
constexpr int kScanPer = 16, kScanChunk = kScanPer * kThreads, kWarps = kThreads / 32;
template <class GE, class S, class K>
__global__ void __launch_bounds__(kThreads)
    enc_bwd_wte_kernel(GE * dwte, const S * dout, K tokens, int64_t N, int64_t C, int64_t lo, int64_t nrows) {
    extern __shared__ float acc[];   // C floats; thread t owns columns t, t + 256, ...
    __shared__ uint32_t masks[kScanPer * kWarps];
    const int64_t r = blockIdx.x;
    const int32_t tok = tokens[r];
    const int64_t e = int64_t(tok) - lo;
    if (tok < 0 || e < 0 || e >= nrows) return;   // not in this table (shard): skipped
    GE * g = dwte + e * C;
    for (int64_t c = threadIdx.x; c < C; c += kThreads) {
        if constexpr (std::is_same_v<GE, float>) acc[c] = g[c] + ld(dout[r * C + c]);
        else acc[c] = 0.0f + ld(dout[r * C + c]);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t j0 = 0; j0 < N; j0 += kScanChunk) {
        bool before = false, after = false;
#pragma unroll
        for (int k = 0; k < kScanPer; ++k) {
            const int64_t j = j0 + k * kThreads + threadIdx.x;
            const bool m = j < N && j != r && tokens[j] == tok;
            before |= m && j < r;
            after |= m && j > r;
            const uint32_t bits = __ballot_sync(0xffffffffu, m && j > r);
            if (lane == 0) masks[k * kWarps + warp] = bits;
        }
        if (__syncthreads_or(before)) return;   // an earlier row owns this table row
        if (!__syncthreads_or(after)) continue;
        for (int q = 0; q < kScanPer * kWarps; ++q) {   // rows j0 + q * 32 + bit, ascending
            for (uint32_t mk = masks[q]; mk; mk &= mk - 1) {
                const int64_t row = j0 + int64_t(q) * 32 + (__ffs(int(mk)) - 1);
                for (int64_t c = threadIdx.x; c < C; c += kThreads) acc[c] += ld(dout[row * C + c]);
            }
        }
        __syncthreads();   // masks are rewritten by the next chunk
    }
    for (int64_t c = threadIdx.x; c < C; c += kThreads) {
        if constexpr (std::is_same_v<GE, float>) g[c] = acc[c];
        else g[c] = st<GE>(ld(g[c]) + acc[c]);
    }
}

// ---- encoder backward, dwpe: thread per (t, c), summing b = 0 .. B-1 in order (a float dwpe
// from its value, as the CPU's fused loop; a low-precision one in one rounded add).
// grid (C / 256, min(T, 65535)). ----
template <class GP, class S>
__global__ void enc_bwd_wpe_kernel(GP * dwpe, const S * dout, int64_t B, int64_t T, int64_t C) {
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        GP * g = dwpe + t * C + c;
        float acc = 0.0f;
        if constexpr (std::is_same_v<GP, float>) acc = *g;
#pragma unroll 4
        for (int64_t b = 0; b < B; ++b) acc += ld(dout[(b * T + t) * C + c]);
        if constexpr (std::is_same_v<GP, float>) *g = acc;
        else *g = st<GP>(ld(*g) + acc);
    }
}

// ---- GELU (tanh approximation) through 0.5 (1 + tanh(u)) = sigmoid(2u), as the CPU computes
// it, with exp's argument clamped to [-87, 87] like the CPU's exp_clamped. ----
constexpr float kGeluTwoBeta = 1.5957691216057308f;   // 2 sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;
__device__ __forceinline__ float exp_clamped(float y) { return expf(fminf(fmaxf(y, -87.0f), 87.0f)); }

struct GeluFwd {
    __device__ float operator()(float x, float) const {
        const float two_u = kGeluTwoBeta * (x + kGeluKappa * x * x * x);
        return x * (1.0f / (1.0f + exp_clamped(-two_u)));
    }
};
struct GeluBwd {   // (inp, dout) -> dinp
    __device__ float operator()(float x, float dy) const {
        const float x2 = x * x;
        const float two_u = kGeluTwoBeta * (x + kGeluKappa * x2 * x);
        const float two_du = kGeluTwoBeta * (1.0f + 3.0f * kGeluKappa * x2);
        const float ex = exp_clamped(-two_u);
        const float s = 1.0f / (1.0f + ex);
        return dy * (s + x * ((ex * s) * s) * two_du);
    }
};
// The exact GELU, x Phi(x), Phi(x) = erfc(-x / sqrt(2)) / 2 (no cancellation for negative x);
// its derivative Phi(x) + x phi(x), phi the standard normal density.
struct GeluErfFwd {
    __device__ float operator()(float x, float) const { return x * (0.5f * erfcf(-x * 0.70710678118654752f)); }
};
struct GeluErfBwd {   // (inp, dout) -> dinp
    __device__ float operator()(float x, float dy) const {
        const float phi = 0.39894228040143268f * expf(-0.5f * x * x);
        return dy * (0.5f * erfcf(-x * 0.70710678118654752f) + x * phi);
    }
};
struct Add {
    __device__ float operator()(float x, float y) const { return x + y; }
};
// out = fn(a, b) per element, one dtype (b == nullptr: fn(a, 0)).
template <class T, class Fn> struct BinaryOp {
    T * out; const T * a; const T * b;
    template <int V> __device__ void run(int64_t i) const {
        const Pack<T, V> x = ldp<V>(a + i);
        Pack<T, V> y{}, o;
        if (b) y = ldp<V>(b + i);
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = st<T>(Fn{}(ld(x.v[k]), b ? ld(y.v[k]) : 0.0f));
        stp<V>(out + i, o);
    }
};
template <class Fn> void binary(cudaStream_t s, Tensor out, Tensor a, Tensor b) {
    MF_ASSERT(a.dtype == out.dtype && a.numel() == out.numel());
    MF_ASSERT(!b.valid() || (b.dtype == out.dtype && b.numel() == out.numel()));
    const void * bp = b.valid() ? b.data : nullptr;
    dispatch_float(out.dtype, [&](auto z) {
        using T = decltype(z);
        launch_map<T>(s, out.numel(), aligned16({out.data, a.data, bp}),
                      BinaryOp<T, Fn>{ptr<T>(out), ptr<T>(a), static_cast<const T *>(bp)});
    });
}

// ---- dropout: the CPU's mask (cpu::dropout_keep, kernels.h), bit for bit ----
__host__ __device__ __forceinline__ bool dropout_keep(uint64_t seed, uint64_t i, float p) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return float(z >> 40) * (1.0f / 16777216.0f) >= p;
}
template <class T> struct DropoutOp {
    T * out; const T * in; float p, keep_scale; uint64_t seed;
    template <int V> __device__ void run(int64_t i) const {
        const Pack<T, V> x = ldp<V>(in + i);
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k)
            o.v[k] = st<T>(dropout_keep(seed, uint64_t(i + k), p) ? ld(x.v[k]) * keep_scale : 0.0f);
        stp<V>(out + i, o);
    }
};

// ---- LoRA column slices over the N x cols elements of d ----
template <class O, class D> struct AddColumnsOp {
    O * out; const D * d; int64_t ldo, cols, col0; float scale;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t r = i / cols, j = i - r * cols;
        O * o = out + r * ldo + col0 + j;
        const Pack<O, V> a = ldp<V>(o);
        const Pack<D, V> b = ldp<V>(d + i);
        Pack<O, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) y.v[k] = st<O>(ld(a.v[k]) + scale * ld(b.v[k]));
        stp<V>(o, y);
    }
};
template <class D, class S> struct TakeColumnsOp {
    D * d; const S * src; int64_t lds, cols, col0; float scale;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t r = i / cols, j = i - r * cols;
        const Pack<S, V> a = ldp<V>(src + r * lds + col0 + j);
        Pack<D, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) y.v[k] = st<D>(scale * ld(a.v[k]));
        stp<V>(d + i, y);
    }
};

// The embedding over table rows [lo, lo + nrows) and its backward (invalid wpe/dwte/dwpe skipped).
void encode(cudaStream_t s, Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t lo, int64_t nrows,
            const int32_t * doc = nullptr) {
    MF_ASSERT(out.ndim == 3 && tokens.dtype == DType::i32 && tokens.numel() == out.rows());
    MF_ASSERT(wte.dtype == out.dtype && (!wpe.valid() || wpe.dtype == out.dtype));
    const int64_t T = out.dim(1), C = out.cols();
    dispatch_float(out.dtype, [&](auto z) {
        using E = decltype(z);
        constexpr int V = int(16 / sizeof(E));
        const bool vec = C % V == 0 && aligned16({out.data, wte.data, wpe.valid() ? wpe.data : nullptr});
        launch_map<E>(s, out.numel(), vec,
                       EncodeOp<E>{ptr<E>(out), ptr<int32_t>(tokens), ptr<E>(wte),
                                    wpe.valid() ? ptr<E>(wpe) : nullptr, doc, T, C, lo, nrows});
    });
}

// The table gradient kernel over N rows keyed by `keys` into table rows [lo, lo + nrows); g is
// f32 or S (checked by the caller).
template <class S, class K>
void table_grad(cudaStream_t s, Tensor g, const S * dout, K keys, int64_t N, int64_t C, int64_t lo, int64_t nrows) {
    const size_t smem = size_t(C) * sizeof(float);
    auto run = [&](auto * gp) {
        using G = std::remove_pointer_t<decltype(gp)>;
        auto * k = enc_bwd_wte_kernel<G, S, K>;
        // The 48 KiB default covers static + dynamic shared memory (masks[] is static).
        if (smem + sizeof(uint32_t) * kScanPer * kWarps > 48 * 1024)
            MF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        k<<<unsigned(N), kThreads, smem, s>>>(gp, dout, keys, N, C, lo, nrows);
        MF_CUDA_LAUNCHED();
    };
    if (g.dtype == DType::f32) run(ptr<float>(g)); else run(ptr<S>(g));
}

void encode_bwd(cudaStream_t s, Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t lo, int64_t nrows,
                const int32_t * doc = nullptr) {
    MF_ASSERT(dout.ndim == 3 && tokens.dtype == DType::i32 && tokens.numel() == dout.rows());
    const int64_t B = dout.dim(0), T = dout.dim(1), C = dout.cols(), N = B * T;
    if (N == 0 || C == 0) return;
    dispatch_float(dout.dtype, [&](auto z) {
        using S = decltype(z);
        if (dwpe.valid()) {
            MF_ASSERT(dwpe.dtype == DType::f32 || dwpe.dtype == dout.dtype);
            if (doc) {   // positions repeat within a row: dwpe's rows collide like dwte's
                // (any of the table's rows: under context parallelism a row's positions pass T)
                table_grad(s, dwpe, ptr<S>(dout), Positions{doc, T}, N, C, 0, dwpe.numel() / C);
            } else {
                const dim3 grid(grid_for(C, kThreads), unsigned(std::min<int64_t>(T, 65535)));
                if (dwpe.dtype == DType::f32)
                    enc_bwd_wpe_kernel<<<grid, kThreads, 0, s>>>(ptr<float>(dwpe), ptr<S>(dout), B, T, C);
                else enc_bwd_wpe_kernel<<<grid, kThreads, 0, s>>>(ptr<S>(dwpe), ptr<S>(dout), B, T, C);
                MF_CUDA_LAUNCHED();
            }
        }
        if (!dwte.valid() || nrows == 0) return;
        MF_ASSERT(dwte.dtype == DType::f32 || dwte.dtype == dout.dtype);
        table_grad(s, dwte, ptr<S>(dout), ptr<int32_t>(tokens), N, C, lo, nrows);
    });
}

}  // namespace

void copy(cudaStream_t s, Tensor dst, Tensor src) {
    MF_ASSERT(dst.numel() == src.numel());
    if (dst.dtype == src.dtype) {
        if (src.nbytes() && dst.data != src.data) MF_CUDA(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, s));
        return;
    }
    dispatch_float(dst.dtype, [&](auto dz) {
        dispatch_float(src.dtype, [&](auto sz) {
            using D = decltype(dz);
            using S = decltype(sz);
            launch_map<Wider<D, S>>(s, src.numel(), aligned16({dst.data, src.data}),
                                    CopyOp<D, S>{ptr<D>(dst), ptr<S>(src)});
        });
    });
}

void encoder_fwd(cudaStream_t s, Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start) {
    encode(s, out, tokens, wte, wpe, 0, wte.numel() / out.cols(), docs(doc_start, out.rows()));
}
void encoder_bwd(cudaStream_t s, Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start) {
    encode_bwd(s, dwte, dwpe, dout, tokens, 0, dwte.valid() ? dwte.numel() / dout.cols() : 0,
               docs(doc_start, dout.rows()));
}
void vocab_encoder_fwd(cudaStream_t s, Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo) {
    MF_ASSERT(vocab_lo >= 0 && wte.numel() % out.cols() == 0);
    encode(s, out, tokens, wte, wpe, vocab_lo, wte.numel() / out.cols());
}
void vocab_encoder_bwd(cudaStream_t s, Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo) {
    MF_ASSERT(vocab_lo >= 0 && (!dwte.valid() || dwte.numel() % dout.cols() == 0));
    encode_bwd(s, dwte, dwpe, dout, tokens, vocab_lo, dwte.valid() ? dwte.numel() / dout.cols() : 0);
}

void gelu_fwd(cudaStream_t s, Tensor out, Tensor inp, Gelu kind) {
    if (kind == Gelu::erf) binary<GeluErfFwd>(s, out, inp, Tensor{});
    else binary<GeluFwd>(s, out, inp, Tensor{});
}
void gelu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp, Gelu kind) {
    if (kind == Gelu::erf) binary<GeluErfBwd>(s, dinp, inp, dout);
    else binary<GeluBwd>(s, dinp, inp, dout);
}
void residual_fwd(cudaStream_t s, Tensor out, Tensor a, Tensor b) { binary<Add>(s, out, a, b); }
void dropout(cudaStream_t s, Tensor out, Tensor in, float p, uint64_t seed) {
    MF_ASSERT(out.numel() == in.numel() && out.dtype == in.dtype && p >= 0.0f && p < 1.0f);
    const float keep_scale = 1.0f / (1.0f - p);
    dispatch_float(in.dtype, [&](auto z) {
        using T = decltype(z);
        launch_map<T>(s, in.numel(), aligned16({out.data, in.data}),
                      DropoutOp<T>{ptr<T>(out), ptr<T>(in), p, keep_scale, seed});
    });
}

void add_columns(cudaStream_t s, Tensor out, Tensor d, int64_t col0, float scale) {
    const int64_t ldo = out.cols(), cols = d.cols();
    MF_ASSERT(out.rows() == d.rows() && col0 >= 0 && col0 + cols <= ldo);
    if (cols == 0) return;
    dispatch_float(out.dtype, [&](auto oz) {
        dispatch_float(d.dtype, [&](auto dz) {
            using O = decltype(oz);
            using D = decltype(dz);
            constexpr int V = int(16 / sizeof(Wider<O, D>));
            const bool vec = cols % V == 0 && ldo % V == 0 && col0 % V == 0 && aligned16({out.data, d.data});
            launch_map<Wider<O, D>>(s, d.numel(), vec, AddColumnsOp<O, D>{ptr<O>(out), ptr<D>(d), ldo, cols, col0, scale});
        });
    });
}
void take_columns(cudaStream_t s, Tensor d, Tensor src, int64_t col0, float scale) {
    const int64_t lds = src.cols(), cols = d.cols();
    MF_ASSERT(src.rows() == d.rows() && col0 >= 0 && col0 + cols <= lds);
    if (cols == 0) return;
    dispatch_float(d.dtype, [&](auto dz) {
        dispatch_float(src.dtype, [&](auto sz) {
            using D = decltype(dz);
            using S = decltype(sz);
            constexpr int V = int(16 / sizeof(Wider<D, S>));
            const bool vec = cols % V == 0 && lds % V == 0 && col0 % V == 0 && aligned16({d.data, src.data});
            launch_map<Wider<D, S>>(s, d.numel(), vec, TakeColumnsOp<D, S>{ptr<D>(d), ptr<S>(src), lds, cols, col0, scale});
        });
    });
}

}  // namespace memfit::cuda
