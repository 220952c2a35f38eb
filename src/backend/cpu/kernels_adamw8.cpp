// AdamW with 8-bit moments (backend/moments8.h): each block of kMoments8Block elements is decoded,
// updated in f32 by adamw_rule (backend/update_rules.h), and encoded with its new scales.
// Blocks are parallel tasks; within one, the order is fixed.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cpu/kernels.h"
#include "backend/moments8.h"
#include "backend/stochastic_round.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

// encode_m8 and encode_v8 (backend/moments8.h) over one block, with the same operations in the
// same order, so the same codes, written so that GCC vectorizes them on AVX2 as well as AVX-512:
// the block-wide scale test hoisted, min and max as selects of values (std::min returns a
// reference, which GCC's AVX2 if-conversion gave up on), the test of v > 0 a select. Needs
// -fno-trapping-math (this file's compile options, CMakeLists.txt) for nearbyint to vectorize
// under AVX2; that flag changes no value.
void encode_block(uint8_t * m, uint8_t * v, const float * mf, const float * vf, size_t n, float m_max, float v_max) {
    if (m_max > 0) {
#pragma omp simd
        for (size_t i = 0; i < n; ++i) {
            const float x = std::fabs(mf[i]) / m_max;
            const float q = std::nearbyint(127.0f * std::sqrt(x < 1.0f ? x : 1.0f));
            m[i] = uint8_t(int8_t(int(mf[i] < 0 ? -q : q)));
        }
    } else {
        std::fill(m, m + n, uint8_t(0));
    }
    if (v_max > 0) {
#pragma omp simd
        for (size_t i = 0; i < n; ++i) {
            const float y = vf[i] / v_max;
            const float x = y > 0.0f ? y : 0.0f;   // v <= 0 (code 0 below): keeps the sqrt finite
            const float q = std::nearbyint(255.0f * std::sqrt(std::sqrt(x < 1.0f ? x : 1.0f)));
            v[i] = uint8_t(int(vf[i] > 0 ? (q < 1.0f ? 1.0f : q) : 0.0f));
        }
    } else {
        std::fill(v, v + n, uint8_t(0));
    }
}

}  // namespace

template <class G, class P, class W>
void adamw_update_8bit(W * param, [[maybe_unused]] P * param_copy, const G * grad, uint8_t * m, uint8_t * v,
                       float * m_scale, float * v_scale, size_t n, const UpdateConsts & cref) {
    const UpdateConsts c = cref;   // a local: read through a reference, GCC kept the loops scalar
    if constexpr (std::is_same_v<P, float>) MF_ASSERT(param_copy == nullptr);
    const size_t blocks = moments8_blocks(n);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < blocks; ++b) {
        const size_t lo = b * kMoments8Block, len = std::min(n, lo + kMoments8Block) - lo;
        float mf[kMoments8Block], vf[kMoments8Block];
        float m_max = 0, v_max = 0;
        const float ms = m_scale[b], vs = v_scale[b];
        W * pw = param + lo;
        const G * pg = grad + lo;
        const uint8_t * pm = m + lo, * pv = v + lo;
        // Vectorized for the build's ISA (AVX2 or AVX-512): the loads and decodes, the update, the
        // stores and both block maxima (a max is exact in any order). The block's pointers and
        // scales are locals (read through the arguments inside the loop, GCC kept it scalar), and
        // keep_zeros is a compile-time case (its selects beside the decodes kept AVX2 scalar).
        auto update = [&](auto keep) {
#pragma omp simd reduction(max : m_max, v_max)
            for (size_t i = 0; i < len; ++i) {
                const float w = to_f32(pw[i]);
                float mi = decode_m8(pm[i], ms), vi = decode_v8(pv[i], vs);
                const float p = adamw_rule(c, w, to_f32(pg[i]) * c.scale, mi, vi, decltype(keep)::value && w == 0.0f);
                mf[i] = mi, vf[i] = vi;
                m_max = std::max(m_max, std::fabs(mi));
                v_max = std::max(v_max, vi);
                if constexpr (std::is_same_v<W, float>) pw[i] = p;
                else pw[i] = bf16_t{sr_bf16_bits(p, c.sr_seed, c.sr_at + lo + i)};
                if constexpr (!std::is_same_v<P, float>) param_copy[lo + i] = from_f32<P>(p);
            }
        };
        if (c.keep_zeros) update(std::true_type{});
        else update(std::false_type{});
        m_scale[b] = m_max, v_scale[b] = v_max;
        encode_block(m + lo, v + lo, mf, vf, len, m_max, v_max);
    }
}

#define MF_INST_ADAMW8(G, P, W)                                                                        \
    template void adamw_update_8bit<G, P, W>(W *, P *, const G *, uint8_t *, uint8_t *, float *, float *, \
                                             size_t, const UpdateConsts &);
#define MF_INST_ADAMW8_G(G) \
    MF_INST_ADAMW8(G, float, float) MF_INST_ADAMW8(G, bf16_t, float) MF_INST_ADAMW8(G, f16_t, float) \
    MF_INST_ADAMW8(G, float, bf16_t)
MF_INST_ADAMW8_G(float)
MF_INST_ADAMW8_G(bf16_t)
MF_INST_ADAMW8_G(f16_t)
#undef MF_INST_ADAMW8_G
#undef MF_INST_ADAMW8

}  // namespace memfit::cpu
