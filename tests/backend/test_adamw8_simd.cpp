// The 8-bit AdamW kernel (kernels_adamw8.cpp), vectorized for the build's ISA, against the scalar
// definition in backend/moments8.h: every code, scale and weight bitwise equal, over blocks with
// every kind of content (mixed signs, all zeros, kept zeros, denormal-small second moments, a
// partial last block) and three steps, so the second and third decode what the first encoded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/moments8.h"

namespace memfit {
namespace {

struct State {
    std::vector<float> w, m_scale, v_scale;
    std::vector<uint8_t> m, v;
};

// Element by element with moments8.h's scalar encode/decode, as the kernel defines the update.
void scalar_update(State & s, const std::vector<float> & g, float lr, float b1, float b2, float eps, float wd, int t,
                   bool keep_zeros) {
    const size_t n = s.w.size();
    const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(b1), t)));
    const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(b2), t)));
    const float decay = float(1.0 - double(lr) * wd);
    for (size_t b = 0; b < moments8_blocks(n); ++b) {
        const size_t lo = b * kMoments8Block, hi = std::min(n, lo + kMoments8Block);
        std::vector<float> mf(hi - lo), vf(hi - lo);
        float m_max = 0, v_max = 0;
        for (size_t i = lo; i < hi; ++i) {
            const float w = s.w[i];
            const bool frozen = keep_zeros && w == 0.0f;
            const float mi = frozen ? 0.0f : b1 * decode_m8(s.m[i], s.m_scale[b]) + (1.0f - b1) * g[i];
            const float vi = frozen ? 0.0f : b2 * decode_v8(s.v[i], s.v_scale[b]) + (1.0f - b2) * g[i] * g[i];
            mf[i - lo] = mi, vf[i - lo] = vi;
            m_max = std::max(m_max, std::fabs(mi));
            v_max = std::max(v_max, vi);
            s.w[i] = frozen ? w : w * decay - lr * (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
        }
        s.m_scale[b] = m_max, s.v_scale[b] = v_max;
        for (size_t i = lo; i < hi; ++i) {
            s.m[i] = encode_m8(mf[i - lo], m_max);
            s.v[i] = encode_v8(vf[i - lo], v_max);
        }
    }
}

TEST(Moments8, TheVectorizedUpdateIsTheScalarOneBitwise) {
    const size_t n = 6 * kMoments8Block + 77;
    std::mt19937 rng(41);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    State kern;
    kern.w.resize(n);
    for (float & x : kern.w) x = 0.02f * nd(rng);
    for (size_t i = 2 * kMoments8Block; i < 3 * kMoments8Block; i += 3) kern.w[i] = 0.0f;   // kept zeros
    kern.m.assign(n, 0), kern.v.assign(n, 0);
    kern.m_scale.assign(moments8_blocks(n), 0.0f), kern.v_scale.assign(moments8_blocks(n), 0.0f);
    for (const bool keep_zeros : {false, true}) {
        State ref = kern;
        for (int t = 1; t <= 3; ++t) {
            std::vector<float> g(n);
            for (size_t i = 0; i < n; ++i) {
                const size_t block = i / kMoments8Block;
                g[i] = block == 1 ? 0.0f                       // a block of zero gradients
                     : block == 3 ? 1e-20f * nd(rng)           // second moments near the denormals
                     : block == 4 ? 30.0f * nd(rng)            // a large one beside...
                                  : nd(rng);
            }
            g[4 * kMoments8Block + 5] = 1e-3f;                 // ...a small one in its block
            OptimHyper h;
            h.lr = 1e-3f, h.beta1 = 0.9f, h.beta2 = 0.999f, h.eps = 1e-8f, h.weight_decay = 0.1f, h.t = t;
            h.keep_zeros = keep_zeros;
            cpu::adamw_update_8bit<float, float, float>(kern.w.data(), nullptr, g.data(), kern.m.data(), kern.v.data(),
                                                       kern.m_scale.data(), kern.v_scale.data(), n, update_consts(h));
            scalar_update(ref, g, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, t, keep_zeros);
            ASSERT_EQ(0, std::memcmp(kern.m.data(), ref.m.data(), n)) << "m codes, step " << t;
            ASSERT_EQ(0, std::memcmp(kern.v.data(), ref.v.data(), n)) << "v codes, step " << t;
            ASSERT_EQ(0, std::memcmp(kern.m_scale.data(), ref.m_scale.data(), ref.m_scale.size() * 4)) << t;
            ASSERT_EQ(0, std::memcmp(kern.v_scale.data(), ref.v_scale.data(), ref.v_scale.size() * 4)) << t;
            ASSERT_EQ(0, std::memcmp(kern.w.data(), ref.w.data(), n * 4)) << "weights, step " << t;
        }
    }
}

}  // namespace
}  // namespace memfit
