// CUDA kernels: dequantization of the packed frozen-weight formats (backend/quant_format.h: the
// layouts, and the host reference, quant_format.cpp's dequantize_rows). W' [out, in], or a tile
// of its rows (qgemm's), is written in w's dtype: the CPU's fp32 value of every element, rounded once.
//   int8:   one block per output row; scale * q (4 codes per thread-step when in % 4 == 0).
//   nf4(+dq): one thread per 8 elements (one 32-bit word of codes; 8 divides the 64-blocks, so
//           all 8 share one absmax); level[code] * absmax, absmax = q * s + mean with double
//           quantization (fmaf: the CPU build contracts that line to an FMA on x86 with FMA).
//   sparse24: one thread per 8 elements (two groups of 4: one byte of positions, four bf16 values);
//           zeros, then the two kept values of each group at their positions.
//   gptq:   one thread per code word (32/bits inputs of one output row); scale * (code - zero)
//           with the group of each input from g_idx (act-order's groups need not be contiguous).
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/quant_format.h"
#include "backend/stochastic_round.h"   // bf16_bits_to_f32

namespace memfit::cuda {

namespace {

// The NF4 levels (quant_format.h's kNf4Levels), passed by value: a host constant array cannot be
// indexed on the device.
struct Nf4Levels { float v[16]; };

// A little-endian fp32 at any byte address (the packed formats store scales unaligned).
__device__ __forceinline__ float load_f32(const uint8_t * p) {
    if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return *reinterpret_cast<const float *>(p);
    const uint32_t u = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    return __uint_as_float(u);
}

// Grid rows, block 256: row o = row0 + blockIdx.x of W' = q[o, :] * scale[o], into w's row
// blockIdx.x. Vec: in % 4 == 0 and w aligned to 4 elements, so 4 codes are one 32-bit load and 4
// outputs one store.
template <class T, bool Vec>
__global__ void __launch_bounds__(256) int8_dequant_kernel(T * w, const uint8_t * packed, int64_t out, int64_t in,
                                                           int64_t row0) {
    const int64_t o = row0 + blockIdx.x;
    const float scale = load_f32(packed + size_t(out) * size_t(in) + size_t(o) * 4);
    const int8_t * q = reinterpret_cast<const int8_t *>(packed) + o * in;
    T * d = w + int64_t(blockIdx.x) * in;
    if constexpr (Vec) {
        for (int64_t k = threadIdx.x; k < in / 4; k += blockDim.x) {
            const char4 c = reinterpret_cast<const char4 *>(q)[k];
            if constexpr (std::is_same_v<T, float>) {
                reinterpret_cast<float4 *>(d)[k] =
                    make_float4(float(c.x) * scale, float(c.y) * scale, float(c.z) * scale, float(c.w) * scale);
            } else {
                uint2 u;
                T * e = reinterpret_cast<T *>(&u);
                e[0] = st<T>(float(c.x) * scale), e[1] = st<T>(float(c.y) * scale);
                e[2] = st<T>(float(c.z) * scale), e[3] = st<T>(float(c.w) * scale);
                reinterpret_cast<uint2 *>(d)[k] = u;
            }
        }
    } else {
        for (int64_t k = threadIdx.x; k < in; k += blockDim.x) d[k] = st<T>(float(q[k]) * scale);
    }
}

// Grid ceil(m / 8 / 256), block 256: thread j writes elements 8j .. 8j+7 of w from code word
// k = k0 + j of the n-element matrix (w holds its elements 8 k0 .. 8 k0 + m - 1). Vec: w aligned to
// 16 bytes, so the 8 outputs are one or two 16-byte stores.
template <class T, bool DQ, bool Vec>
__global__ void __launch_bounds__(256) nf4_dequant_kernel(T * w, const uint8_t * packed, int64_t n, int64_t k0,
                                                          int64_t m, Nf4Levels lv) {
    __shared__ float levels[16];
    if (threadIdx.x < 16) levels[threadIdx.x] = lv.v[threadIdx.x];
    __syncthreads();
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j >= m / 8) return;
    const int64_t k = k0 + j;
    const int64_t b = k / (kNf4Block / 8), nb = n / kNf4Block;
    const uint8_t * absmax = packed + n / 2;
    float a;
    if constexpr (DQ) {
        const auto q = static_cast<int8_t>(absmax[b]);
        const float s = load_f32(absmax + nb + (b / kNf4ScaleBlock) * 4);
        const float mean = load_f32(absmax + nb + ((nb + kNf4ScaleBlock - 1) / kNf4ScaleBlock) * 4);
        a = fmaf(float(q), s, mean);
    } else {
        a = load_f32(absmax + b * 4);
    }
    const uint32_t word = reinterpret_cast<const uint32_t *>(packed)[k];
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = levels[(word >> (4 * e)) & 15u] * a;
    if constexpr (Vec && std::is_same_v<T, float>) {
        reinterpret_cast<float4 *>(w)[2 * j] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4 *>(w)[2 * j + 1] = make_float4(f[4], f[5], f[6], f[7]);
    } else if constexpr (Vec) {
        uint4 u;
        T * e = reinterpret_cast<T *>(&u);
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = st<T>(f[i]);
        reinterpret_cast<uint4 *>(w)[j] = u;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[8 * j + i] = st<T>(f[i]);
    }
}

// Grid ceil(m / 8 / 256), block 256: thread j writes elements 8j .. 8j+7 of w from groups 2k and
// 2k+1, k = k0 + j, of the n-element matrix (values 4k .. 4k+3, position byte k after the n bytes
// of values).
template <class T>
__global__ void __launch_bounds__(256) sparse24_dequant_kernel(T * w, const uint8_t * packed, int64_t n, int64_t k0,
                                                               int64_t m) {
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j >= m / 8) return;
    const int64_t k = k0 + j;
    const uint16_t * vals = reinterpret_cast<const uint16_t *>(packed) + 4 * k;
    const unsigned byte = packed[n + k];
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned fields = (byte >> (4 * h)) & 15u;
        f[4 * h + (fields & 3u)] = bf16_bits_to_f32(vals[2 * h]);
        f[4 * h + ((fields >> 2) & 3u)] = bf16_bits_to_f32(vals[2 * h + 1]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) w[8 * j + i] = st<T>(f[i]);
}

// Grid ceil(rows * in / p / 256), block 256: thread t writes inputs p k .. p k + p - 1 of row
// row0 + r of W', t = r * (in / p) + k, from qweight word [k][row0 + r] (GptqQuant's layout).
// The layout's numbers, as plain values (GptqQuant's member functions are host code).
struct GptqDims { int bits = 4; int64_t out = 0, in = 0; size_t zeros = 0, scales = 0, g_idx = 0; };

template <class T>
__global__ void __launch_bounds__(256) gptq_dequant_kernel(T * w, const uint8_t * packed, GptqDims q, int64_t row0,
                                                           int64_t rows) {
    const int p = 32 / q.bits;
    const int64_t words = q.in / p, t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * words) return;
    const int64_t r = t / words, k = t % words, o = row0 + r;
    const uint32_t mask = (1u << q.bits) - 1;
    const uint32_t word = reinterpret_cast<const uint32_t *>(packed)[k * q.out + o];
    const auto * zeros = reinterpret_cast<const uint32_t *>(packed + q.zeros);
    const auto * scales = reinterpret_cast<const __half *>(packed + q.scales);
    const auto * g_idx = reinterpret_cast<const int32_t *>(packed + q.g_idx);
    for (int j = 0; j < p; ++j) {
        const int64_t i = k * p + j, g = g_idx[i];
        const uint32_t code = (word >> (q.bits * j)) & mask;
        const uint32_t z = ((zeros[g * (q.out / p) + o / p] >> (q.bits * int(o % p))) & mask) + 1;
        w[r * q.in + i] = st<T>(__half2float(scales[g * q.out + o]) * float(int32_t(code) - int32_t(z)));
    }
}

bool aligned(const void * p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void dequantize(cudaStream_t s, const QuantDesc & q, Tensor w, Tensor packed, int64_t row0) {
    const int64_t n = q.out * q.in, m = w.numel(), rows = m / q.in;
    MF_ASSERT(q.out > 0 && q.in > 0 && m % q.in == 0 && row0 >= 0 && row0 + rows <= q.out && packed.data != nullptr);
    const int64_t k0 = row0 * q.in / 8;   // the first code word (nf4) or group pair (sparse24)
    MF_ASSERT((q.format == QuantFormat::int8 || q.format == QuantFormat::gptq || ((row0 * q.in) % 8 == 0 && m % 8 == 0)) &&
              "a tile of packed 4-bit or 2:4 weights starts and ends on 8 elements");
    MF_ASSERT(!packed.valid() || packed.nbytes() >= quant_bytes(q));
    MF_ASSERT(aligned(packed.data, 4) && "packed weights must be 4-byte aligned");
    const auto * pk = static_cast<const uint8_t *>(packed.data);
    dispatch_float(w.dtype, [&](auto z) {
        using T = decltype(z);
        T * out = ptr<T>(w);
        if (q.format == QuantFormat::gptq) {
            const GptqQuant g{q.out, q.in, q.bits, q.group};
            MF_ASSERT(g.bytes() == quant_bytes(q) && q.in % g.per_word() == 0 && q.out % g.per_word() == 0 &&
                      q.in % q.group == 0 && "a gptq matrix's shape (check_gptq_shape)");
            const GptqDims d{q.bits, q.out, q.in, g.qzeros_at(), g.scales_at(), g.g_idx_at()};
            gptq_dequant_kernel<T><<<grid_for(rows * (q.in / g.per_word()), 256), 256, 0, s>>>(out, pk, d, row0, rows);
        } else if (q.format == QuantFormat::sparse24) {
            MF_ASSERT(q.in % 4 == 0 && n % 8 == 0 && "sparse24 needs groups of 4 inputs");
            sparse24_dequant_kernel<T><<<grid_for(m / 8, 256), 256, 0, s>>>(out, pk, n, k0, m);
        } else if (q.format == QuantFormat::int8) {
            MF_ASSERT(rows <= INT32_MAX);
            if (q.in % 4 == 0 && aligned(out, 4 * sizeof(T)))
                int8_dequant_kernel<T, true><<<unsigned(rows), 256, 0, s>>>(out, pk, q.out, q.in, row0);
            else
                int8_dequant_kernel<T, false><<<unsigned(rows), 256, 0, s>>>(out, pk, q.out, q.in, row0);
        } else {
            MF_ASSERT(n % kNf4Block == 0 && "NF4 needs out*in to be a multiple of 64");
            const unsigned grid = grid_for(m / 8, 256);
            const bool vec = aligned(out, 16);
            Nf4Levels lv;
            for (int i = 0; i < 16; ++i) lv.v[i] = kNf4Levels[i];
            if (q.format == QuantFormat::nf4_dq) {
                if (vec) nf4_dequant_kernel<T, true, true><<<grid, 256, 0, s>>>(out, pk, n, k0, m, lv);
                else nf4_dequant_kernel<T, true, false><<<grid, 256, 0, s>>>(out, pk, n, k0, m, lv);
            } else {
                if (vec) nf4_dequant_kernel<T, false, true><<<grid, 256, 0, s>>>(out, pk, n, k0, m, lv);
                else nf4_dequant_kernel<T, false, false><<<grid, 256, 0, s>>>(out, pk, n, k0, m, lv);
            }
        }
        MF_CUDA_LAUNCHED();
    });
}

}  // namespace memfit::cuda
