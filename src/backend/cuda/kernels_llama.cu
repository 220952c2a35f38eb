// CUDA kernels of the LLaMA family: rotary position embeddings, SwiGLU / GeGLU and the grouped-query
// repeat of K/V heads (RMSNorm is in kernels_norm.cu). Contracts: backend.h; the CPU backend is
// the reference (backend/cpu/kernels_llama.cpp), followed operation for operation.
//
// SwiGLU and repeat_kv run through map_kernel: a grid-stride loop in which each thread handles a
// pack of V elements, moved with one 16-byte access when the pointers are 16-byte aligned and
// rows (heads) are whole packs, else V = 1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/common.cuh"
#include "backend/cuda/pack.cuh"
#include "backend/cuda/kernels.h"

namespace memfit::cuda {

namespace {

// ---- RoPE: block (128 threads) per row (grid-stride over rows). Row r has position
// pos = pos0 + r % T (minus doc[r], its document's start, with packed documents). The row's
// rotary_dims/2 angles a = pos * inv_freq[i] are computed in double from the host's inv_freq
// (std::pow in double, as the CPU), cos/sin in double then rounded to float and scaled by
// rope.magnitude(), as the CPU does; then each (head, i) pair of the NH + KVH rotated heads is
// turned by a (sign = -1: the inverse, for the backward). ----
constexpr int kRopeThreads = 128, kMaxHalf = 128;
struct RopeFreq { double f[kMaxHalf]; };

template <class T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(T * x, int64_t N, int64_t T_, int heads, int64_t width, int hd, int half, int pos0, float sign,
                float mag, RopeFreq fr, const int32_t * doc) {
    __shared__ float cosv[kMaxHalf], sinv[kMaxHalf];
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const int64_t t = r % T_;
        const double pos = double(pos0) + double(doc ? t - doc[r] : t);
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const double a = pos * fr.f[i];
            cosv[i] = mag * float(cos(a));
            sinv[i] = sign * mag * float(sin(a));
        }
        __syncthreads();
        T * row = x + r * width;
        for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
            const int h = p / half, i = p - h * half;
            T * lo = row + int64_t(h) * hd + i;
            T * hi = lo + half;
            const float x0 = ld(*lo), x1 = ld(*hi);
            *lo = st<T>(x0 * cosv[i] - x1 * sinv[i]);
            *hi = st<T>(x1 * cosv[i] + x0 * sinv[i]);
        }
        __syncthreads();   // cosv/sinv are rewritten for the next row
    }
}

void rope_rotate(cudaStream_t s, Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, float sign, Tensor doc_start) {
    MF_ASSERT(qkv.ndim == 3 && NH > 0 && KVH > 0 && NH % KVH == 0);
    const int64_t width = qkv.cols();
    MF_ASSERT(width % (NH + 2 * KVH) == 0 && "qkv width is not (NH + 2*KVH) heads");
    const int hd = int(width / (NH + 2 * KVH)), rot = rope.rotary_dims(hd);
    MF_ASSERT(rot > 0 && rot % 2 == 0 && rot <= hd && rot / 2 <= kMaxHalf &&
              "rope: rotary dims must be even and at most 256");
    const int half = rot / 2;
    const int64_t N = qkv.rows(), T = qkv.dim(1);
    const int32_t * doc = docs(doc_start, N);
    if (N == 0) return;
    RopeFreq fr{};
    for (int i = 0; i < half; ++i) fr.f[i] = rope.inv_freq(i, hd);
    dispatch_float(qkv.dtype, [&](auto z) {
        using E = decltype(z);
        rope_kernel<<<unsigned(std::min<int64_t>(N, 1 << 30)), kRopeThreads, 0, s>>>(
            ptr<E>(qkv), N, T, NH + KVH, width, hd, half, pos0, sign, rope.magnitude(), fr, doc);
        MF_CUDA_LAUNCHED();
    });
}

// ---- Gated MLP activations over the N x I elements of out: g = inp[r, c], u = inp[r, I + c],
// out = act(g) u, with exp's argument clamped to [-87, 87] (the CPU's exp_clamped). A Gate gives
// act(g) and act'(g), the CPU's formulas: silu g s, s = 1 / (1 + e), e = exp(-g), derivative
// s + g e s^2; GELU's tanh form g s2, s2 = 1 / (1 + e2), e2 = exp(-2u), 2u = 2 sqrt(2/pi) (g +
// 0.044715 g^3), derivative s2 + g e2 s2^2 2u'. ----
__device__ __forceinline__ float exp_clamped(float y) { return expf(fminf(fmaxf(y, -87.0f), 87.0f)); }

struct SiluGate {
    __device__ static float act(float g) { return g * (1.0f / (1.0f + exp_clamped(-g))); }
    __device__ static float deriv(float g) {
        const float e = exp_clamped(-g), sg = 1.0f / (1.0f + e);
        return sg + g * ((e * sg) * sg);
    }
};
struct GeluTanhGate {
    static constexpr float kTwoBeta = 1.5957691216057308f, kKappa = 0.044715f;   // 2 sqrt(2/pi)
    __device__ static float act(float g) {
        return g * (1.0f / (1.0f + exp_clamped(-kTwoBeta * (g + kKappa * g * g * g))));
    }
    __device__ static float deriv(float g) {
        const float g2 = g * g, e = exp_clamped(-kTwoBeta * (g + kKappa * g2 * g));
        const float sg = 1.0f / (1.0f + e);
        return sg + g * ((e * sg) * sg) * (kTwoBeta * (1.0f + 3.0f * kKappa * g2));
    }
};

template <class T, class Gate> struct GluFwdOp {
    T * out; const T * inp; int64_t I;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t r = i / I, c = i - r * I;
        const Pack<T, V> pg = ldp<V>(inp + r * 2 * I + c), pu = ldp<V>(inp + r * 2 * I + I + c);
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = st<T>(Gate::act(ld(pg.v[k])) * ld(pu.v[k]));
        stp<V>(out + i, o);
    }
};
// dgate = dy * u * act'(g), dup = dy * act(g).
template <class T, class Gate> struct GluBwdOp {
    T * dinp; const T * dout; const T * inp; int64_t I;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t r = i / I, c = i - r * I;
        const Pack<T, V> pg = ldp<V>(inp + r * 2 * I + c), pu = ldp<V>(inp + r * 2 * I + I + c);
        const Pack<T, V> pd = ldp<V>(dout + i);
        Pack<T, V> dg, du;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float g = ld(pg.v[k]), dy = ld(pd.v[k]);
            dg.v[k] = st<T>(dy * ld(pu.v[k]) * Gate::deriv(g));
            du.v[k] = st<T>(dy * Gate::act(g));
        }
        stp<V>(dinp + r * 2 * I + c, dg);
        stp<V>(dinp + r * 2 * I + I + c, du);
    }
};

template <class Gate> void glu_fwd(cudaStream_t s, Tensor out, Tensor inp) {
    MF_ASSERT(out.dtype == inp.dtype && inp.cols() == 2 * out.cols() && inp.rows() == out.rows());
    const int64_t I = out.cols();
    dispatch_float(inp.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = I % (16 / sizeof(T)) == 0 && aligned16({out.data, inp.data});
        launch_map<T>(s, out.numel(), vec, GluFwdOp<T, Gate>{ptr<T>(out), ptr<T>(inp), I});
    });
}
template <class Gate> void glu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp) {
    MF_ASSERT(dinp.dtype == inp.dtype && dout.dtype == inp.dtype);
    MF_ASSERT(inp.cols() == 2 * dout.cols() && inp.rows() == dout.rows() && dinp.numel() == inp.numel());
    const int64_t I = dout.cols();
    dispatch_float(inp.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = I % (16 / sizeof(T)) == 0 && aligned16({dinp.data, dout.data, inp.data});
        launch_map<T>(s, dout.numel(), vec, GluBwdOp<T, Gate>{ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), I});
    });
}

// ---- repeat_kv over the elements of full [N, 3*qw] (forward, exact copies) or of dqkv
// [N, qw + 2*kvw] (backward: q copied; a KV head's element summed over its G query heads in
// fp32, in head order, rounded once). qw = NH*hd, kvw = KVH*hd, G = NH/KVH. ----
template <class T> struct RepeatKvFwdOp {
    T * full; const T * qkv; int64_t hd, G, qw, kvw;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t r = i / (3 * qw), c = i - r * 3 * qw;
        const int64_t part = c / qw, cc = c - part * qw;
        const int64_t src = part == 0 ? cc : qw + (part - 1) * kvw + (cc / hd / G) * hd + cc % hd;
        stp<V>(full + i, ldp<V>(qkv + r * (qw + 2 * kvw) + src));
    }
};
template <class T> struct RepeatKvBwdOp {
    T * dqkv; const T * dfull; int64_t hd, G, qw, kvw;
    template <int V> __device__ void run(int64_t i) const {
        const int64_t w = qw + 2 * kvw, r = i / w, c = i - r * w;
        const T * src = dfull + r * 3 * qw;
        if (c < qw) {
            stp<V>(dqkv + i, ldp<V>(src + c));
            return;
        }
        const int64_t part = (c - qw) / kvw, cc = c - qw - part * kvw;   // part 0: k, 1: v
        const int64_t j = cc / hd, e = cc % hd;
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = 0.0f;
        for (int64_t g = 0; g < G; ++g) {
            const Pack<T, V> p = ldp<V>(src + (part + 1) * qw + (j * G + g) * hd + e);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += ld(p.v[k]);
        }
        Pack<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = st<T>(acc[k]);
        stp<V>(dqkv + i, o);
    }
};

// The head dim of qkv [N, (NH + 2*KVH) * hd], checked against full's [N, 3*NH*hd].
int kv_head_dim(const Tensor & qkv, const Tensor & full, int NH, int KVH) {
    MF_ASSERT(NH > 0 && KVH > 0 && NH % KVH == 0 && qkv.dtype == full.dtype);
    MF_ASSERT(qkv.cols() % (NH + 2 * KVH) == 0 && "qkv width is not (NH + 2*KVH) heads");
    const int hd = int(qkv.cols() / (NH + 2 * KVH));
    MF_ASSERT(full.rows() == qkv.rows() && full.cols() == 3 * int64_t(NH) * hd);
    return hd;
}

}  // namespace

void rope_fwd(cudaStream_t s, Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    rope_rotate(s, qkv, NH, KVH, rope, pos0, 1.0f, doc_start);
}
void rope_bwd(cudaStream_t s, Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    rope_rotate(s, dqkv, NH, KVH, rope, pos0, -1.0f, doc_start);
}

void swiglu_fwd(cudaStream_t s, Tensor out, Tensor inp) { glu_fwd<SiluGate>(s, out, inp); }
void swiglu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp) { glu_bwd<SiluGate>(s, dinp, dout, inp); }
void geglu_fwd(cudaStream_t s, Tensor out, Tensor inp) { glu_fwd<GeluTanhGate>(s, out, inp); }
void geglu_bwd(cudaStream_t s, Tensor dinp, Tensor dout, Tensor inp) { glu_bwd<GeluTanhGate>(s, dinp, dout, inp); }

void repeat_kv_fwd(cudaStream_t s, Tensor full, Tensor qkv, int NH, int KVH) {
    const int64_t hd = kv_head_dim(qkv, full, NH, KVH);
    dispatch_float(qkv.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = hd % (16 / sizeof(T)) == 0 && aligned16({full.data, qkv.data});
        launch_map<T>(s, full.numel(), vec,
                      RepeatKvFwdOp<T>{ptr<T>(full), ptr<T>(qkv), hd, NH / KVH, NH * hd, KVH * hd});
    });
}
void repeat_kv_bwd(cudaStream_t s, Tensor dqkv, Tensor dfull, int NH, int KVH) {
    const int64_t hd = kv_head_dim(dqkv, dfull, NH, KVH);
    dispatch_float(dqkv.dtype, [&](auto z) {
        using T = decltype(z);
        const bool vec = hd % (16 / sizeof(T)) == 0 && aligned16({dqkv.data, dfull.data});
        launch_map<T>(s, dqkv.numel(), vec,
                      RepeatKvBwdOp<T>{ptr<T>(dqkv), ptr<T>(dfull), hd, NH / KVH, NH * hd, KVH * hd});
    });
}

}  // namespace memfit::cuda
