// Context parallelism's CPU attention (backend/cpu/kernels_cp.cpp) against flash attention over
// the whole sequence: for every rank of a context group in the mirrored layout, its rows' outputs,
// log-sum-exps and dq equal the whole attention's rows; the ranks' dk and dv, summed, equal the
// whole's; with packed documents (keys from each query's document start) too.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_flash.h"
#include "model/context_parallel.h"
#include "test_util.h"

namespace memfit::cpu {
namespace {

double rel(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

TEST(ContextParallelKernels, RanksTogetherAreTheWholeAttention) {
    const int B = 2, T = 32, NH = 4, hd = 16, C = NH * hd;
    for (const int R : {2, 4})
        for (const int doc : {0, 6}) {
            SCOPED_TRACE(testing::Message() << R << " ranks, documents of " << doc);
            std::mt19937 rng(11);
            const std::vector<float> qkv = test::randn(size_t(B) * T * 3 * C, rng), dout = test::randn(size_t(B) * T * C, rng);
            std::vector<int32_t> ds(size_t(B) * T);
            for (size_t i = 0; i < ds.size(); ++i) ds[i] = doc > 0 ? int32_t(i % T / doc * doc) : 0;
            std::vector<float> out(size_t(B) * T * C), lse(size_t(B) * NH * T), dqkv(qkv.size());
            flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, ds.data());
            std::vector<float> scratch(flash_attention_scratch_floats(B, T, C, NH, DType::f32));
            flash_attention_backward(dqkv.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(), B, T,
                                     C, NH, ds.data());
            // Every position's k | v, as the all-gather leaves them in position order.
            std::vector<float> kv(size_t(B) * T * 2 * C);
            for (size_t p = 0; p < size_t(B) * T; ++p)
                for (int i = 0; i < 2 * C; ++i) kv[p * 2 * C + i] = qkv[p * 3 * C + C + i];
            std::vector<float> dkv_sum(kv.size(), 0.0f);
            const int Tl = T / R;
            for (int r = 0; r < R; ++r) {
                const ContextParallel cp{R, r};
                std::vector<float> q(size_t(B) * Tl * 3 * C), g(size_t(B) * Tl * C);
                std::vector<int32_t> meta(size_t(2) * B * Tl);
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t) {
                        const size_t l = size_t(b) * Tl + t, w = size_t(b) * T + size_t(cp.position(t, T));
                        std::copy_n(qkv.begin() + long(w * 3 * C), 3 * C, q.begin() + long(l * 3 * C));
                        std::copy_n(dout.begin() + long(w * C), C, g.begin() + long(l * C));
                        meta[l] = cp.position(t, T);
                        meta[size_t(B) * Tl + l] = ds[w];
                    }
                std::vector<float> o(g.size()), L(size_t(B) * NH * Tl), dq(q.size()), dkv(kv.size()), D(size_t(B) * Tl * NH);
                cp_attention_forward(o.data(), L.data(), q.data(), kv.data(), meta.data(), B, Tl, T, NH, NH, hd);
                cp_attention_backward(dq.data(), dkv.data(), D.data(), g.data(), o.data(), q.data(), kv.data(), L.data(),
                                      meta.data(), B, Tl, T, NH, NH, hd);
                std::vector<float> want_o, want_L, want_dq, got_dq;
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t) {
                        const size_t l = size_t(b) * Tl + t, w = size_t(b) * T + size_t(cp.position(t, T));
                        want_o.insert(want_o.end(), out.begin() + long(w * C), out.begin() + long((w + 1) * C));
                        want_dq.insert(want_dq.end(), dqkv.begin() + long(w * 3 * C), dqkv.begin() + long(w * 3 * C + C));
                        got_dq.insert(got_dq.end(), dq.begin() + long(l * 3 * C), dq.begin() + long(l * 3 * C + C));
                        for (int h = 0; h < NH; ++h) {
                            want_L.push_back(lse[(size_t(b) * NH + h) * T + size_t(cp.position(t, T))]);
                            EXPECT_EQ(dq[l * 3 * C + C + size_t(h)], 0.0f);   // k | v columns zeroed
                        }
                    }
                std::vector<float> got_L;
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t)
                        for (int h = 0; h < NH; ++h) got_L.push_back(L[(size_t(b) * NH + h) * Tl + t]);
                EXPECT_LT(rel(o, want_o), 1e-5);
                EXPECT_LT(rel(got_L, want_L), 1e-6);
                EXPECT_LT(rel(got_dq, want_dq), 1e-5);
                for (size_t i = 0; i < kv.size(); ++i) dkv_sum[i] += dkv[i];
            }
            std::vector<float> want_dkv(kv.size());
            for (size_t p = 0; p < size_t(B) * T; ++p)
                for (int i = 0; i < 2 * C; ++i) want_dkv[p * 2 * C + i] = dqkv[p * 3 * C + C + i];
            EXPECT_LT(rel(dkv_sum, want_dkv), 1e-5);
        }
}

// The ring: every rank's blocks visiting in ring order, merged into its queries' accumulators,
// give the whole attention's out and lse; backward, dq summed over the blocks and each block's dk
// and dv summed over the ranks it visits give the whole's gradients.
TEST(ContextParallelKernels, TheRingsBlocksMergeIntoTheWholeAttention) {
    const int B = 2, T = 32, NH = 4, KVH = 2, hd = 16, C = NH * hd, W = (NH + 2 * KVH) * hd, KV = 2 * KVH * hd;
    for (const int R : {2, 4})
        for (const int doc : {0, 6}) {
            SCOPED_TRACE(testing::Message() << R << " ranks, documents of " << doc);
            std::mt19937 rng(13);
            const std::vector<float> qkv = test::randn(size_t(B) * T * W, rng), dout = test::randn(size_t(B) * T * C, rng);
            std::vector<int32_t> ds(size_t(B) * T);
            for (size_t i = 0; i < ds.size(); ++i) ds[i] = doc > 0 ? int32_t(i % T / doc * doc) : 0;
            // The reference: the all-gather kernel over the whole sequence, all rows at once (rank 0 of 1).
            std::vector<int32_t> all_meta(size_t(2) * B * T);
            for (int i = 0; i < B * T; ++i) all_meta[size_t(i)] = i % T, all_meta[size_t(B * T + i)] = ds[size_t(i)];
            std::vector<float> whole_kv(size_t(B) * T * KV);
            for (size_t p = 0; p < size_t(B) * T; ++p)
                for (int i = 0; i < KV; ++i) whole_kv[p * KV + i] = qkv[p * W + C + i];
            std::vector<float> out(size_t(B) * T * C), lse(size_t(B) * NH * T), dqkv(qkv.size()), dkv(whole_kv.size()),
                D(size_t(B) * T * NH);
            cp_attention_forward(out.data(), lse.data(), qkv.data(), whole_kv.data(), all_meta.data(), B, T, T, NH, KVH, hd);
            cp_attention_backward(dqkv.data(), dkv.data(), D.data(), dout.data(), out.data(), qkv.data(), whole_kv.data(),
                                  lse.data(), all_meta.data(), B, T, T, NH, KVH, hd);
            const int Tl = T / R;
            // Each rank's rows: q|k|v, dout, meta, and its block's positions.
            const size_t nr = static_cast<size_t>(R);
            std::vector<std::vector<float>> q(nr), g(nr), kvb(nr);
            std::vector<std::vector<int32_t>> meta(nr), kpos(nr);
            for (int r = 0; r < R; ++r) {
                const ContextParallel cp{R, r};
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t) {
                        const size_t w = size_t(b) * T + size_t(cp.position(t, T));
                        q[size_t(r)].insert(q[size_t(r)].end(), qkv.begin() + long(w * W), qkv.begin() + long((w + 1) * W));
                        g[size_t(r)].insert(g[size_t(r)].end(), dout.begin() + long(w * C), dout.begin() + long((w + 1) * C));
                        kvb[size_t(r)].insert(kvb[size_t(r)].end(), whole_kv.begin() + long(w * KV),
                                              whole_kv.begin() + long((w + 1) * KV));
                    }
                meta[size_t(r)].resize(size_t(2) * B * Tl);
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t) {
                        meta[size_t(r)][size_t(b * Tl + t)] = cp.position(t, T);
                        meta[size_t(r)][size_t(B * Tl + b * Tl + t)] = ds[size_t(b) * T + size_t(cp.position(t, T))];
                    }
                for (int t = 0; t < Tl; ++t) kpos[size_t(r)].push_back(cp.position(t, T));
            }
            std::vector<std::vector<float>> dkv_blocks(nr, std::vector<float>(size_t(B) * Tl * KV, 0.0f));
            for (int r = 0; r < R; ++r) {
                std::vector<float> acc(size_t(B) * Tl * C), L(size_t(B) * NH * Tl), dq(acc.size(), 0.0f), scratch(size_t(B) * Tl * NH);
                for (int s = 0; s < R; ++s) {
                    const int j = (r - s + R) % R;
                    cp_block_forward(acc.data(), L.data(), q[size_t(r)].data(), kvb[size_t(j)].data(), kpos[size_t(j)].data(),
                                     meta[size_t(r)].data(), B, Tl, NH, KVH, hd, s == 0);
                }
                std::vector<float> o(acc.size());
                for (size_t i = 0; i < o.size(); ++i) o[i] = acc[i];
                for (int s = 0; s < R; ++s) {
                    const int j = (r - s + R) % R;
                    cp_block_backward(dq.data(), dkv_blocks[size_t(j)].data(), scratch.data(), g[size_t(r)].data(), o.data(),
                                      q[size_t(r)].data(), kvb[size_t(j)].data(), L.data(), kpos[size_t(j)].data(),
                                      meta[size_t(r)].data(), B, Tl, NH, KVH, hd);
                }
                const ContextParallel cp{R, r};
                std::vector<float> want_o, want_L, want_dq, got_L;
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t) {
                        const size_t w = size_t(b) * T + size_t(cp.position(t, T));
                        want_o.insert(want_o.end(), out.begin() + long(w * C), out.begin() + long((w + 1) * C));
                        want_dq.insert(want_dq.end(), dqkv.begin() + long(w * W), dqkv.begin() + long(w * W + C));
                        for (int h = 0; h < NH; ++h) {
                            want_L.push_back(lse[(size_t(b) * NH + h) * T + size_t(cp.position(t, T))]);
                            got_L.push_back(L[(size_t(b) * NH + h) * Tl + size_t(t)]);
                        }
                    }
                EXPECT_LT(rel(o, want_o), 1e-5);
                EXPECT_LT(rel(got_L, want_L), 1e-6);
                EXPECT_LT(rel(dq, want_dq), 1e-5);
            }
            std::vector<float> got, want;
            for (int r = 0; r < R; ++r) {
                const ContextParallel cp{R, r};
                got.insert(got.end(), dkv_blocks[size_t(r)].begin(), dkv_blocks[size_t(r)].end());
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < Tl; ++t) {
                        const size_t w = size_t(b) * T + size_t(cp.position(t, T));
                        want.insert(want.end(), dkv.begin() + long(w * KV), dkv.begin() + long((w + 1) * KV));
                    }
            }
            EXPECT_LT(rel(got, want), 1e-5);
        }
}

}  // namespace
}  // namespace memfit::cpu
