// Packed documents in the CPU kernels (doc_start, backend/cpu/kernels.h): a row holding several
// documents must give each document what it would get alone in a row of its own.
//   - naive attention, forward and backward: bitwise equal to each document run alone (the same
//     products in the same order);
//   - flash attention (fp32, bf16, f16): equal to the naive kernels with the same documents, over
//     tile-crossing documents, one-token documents and documents that start on a tile boundary;
//   - RoPE and the GPT-2 position embedding: positions restart at each document (bitwise equal to
//     the documents alone), and dwpe sums every document's rows at their own positions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_flash.h"
#include "test_util.h"

namespace memfit::cpu {
namespace {

using memfit::test::randn;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Documents of the given lengths, one after the other in each row (the lengths of a row sum to T).
// With a sliding window W, the attention start of token t instead: max(t - W + 1, its document's).
struct Layout {
    int T = 0;
    std::vector<std::vector<int>> rows;   // per row: document lengths
    int window = 0;                       // sliding window (0: none)
    int B() const { return int(rows.size()); }
    std::vector<int32_t> doc_start() const {
        std::vector<int32_t> s;
        for (const auto & r : rows) {
            int at = 0;
            for (const int len : r) {
                for (int i = 0; i < len; ++i)
                    s.push_back(window > 0 ? std::max(at, int(s.size() % size_t(T)) - window + 1) : at);
                at += len;
            }
            EXPECT_EQ(at, T);
        }
        return s;
    }
};

// Rows of T: documents crossing 64-row tiles, of one token, starting on a tile boundary, whole rows.
const Layout kLayouts[] = {
    {7, {{3, 4}, {1, 1, 5}}},
    {130, {{64, 66}, {1, 70, 1, 58}, {130}}},
    {200, {{10, 54, 64, 1, 71}, {150, 50}}},
    {97, {{97}, {33, 33, 31}}},
};

// Row b's columns [c0, c0 + w) of tokens [t0, t0 + n) of a [B, T, width] array, as a [1, n, w] one.
std::vector<float> take(const std::vector<float> & a, int T, int width, int b, int t0, int n, int c0, int w) {
    std::vector<float> out;
    for (int t = t0; t < t0 + n; ++t) {
        const float * row = a.data() + (size_t(b) * T + t) * width + c0;
        out.insert(out.end(), row, row + w);
    }
    return out;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double rel_err(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    return std::sqrt(num / den);
}

TEST(DocumentKernels, NaiveAttentionOfEachDocumentIsItsAttentionAlone) {
    const int C = 24, NH = 3;
    for (const Layout & L : kLayouts) {
        const int B = L.B(), T = L.T;
        std::mt19937 rng(5);
        const auto qkv = randn(size_t(B) * T * 3 * C, rng, 1.5f);
        const auto dout = randn(size_t(B) * T * C, rng);
        const auto starts = L.doc_start();
        std::vector<float> out(size_t(B) * T * C, kNaN), att(size_t(B) * NH * T * T, kNaN), dqkv(qkv.size(), kNaN);
        std::vector<float> scratch(size_t(B) * NH * T);
        attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, starts.data());
        attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, starts.data());
        for (int b = 0; b < B; ++b) {
            int t0 = 0;
            for (const int n : L.rows[size_t(b)]) {
                const std::string at = "T=" + std::to_string(T) + " row " + std::to_string(b) + " doc at " +
                                       std::to_string(t0);
                const auto q1 = take(qkv, T, 3 * C, b, t0, n, 0, 3 * C);
                const auto g1 = take(dout, T, C, b, t0, n, 0, C);
                std::vector<float> o1(size_t(n) * C), a1(size_t(NH) * n * n), d1(q1.size()), s1(size_t(NH) * n);
                attention_forward(o1.data(), a1.data(), q1.data(), 1, n, C, NH);
                attention_backward(d1.data(), s1.data(), g1.data(), q1.data(), a1.data(), 1, n, C, NH);
                EXPECT_TRUE(same_bits(take(out, T, C, b, t0, n, 0, C), o1)) << at;
                EXPECT_TRUE(same_bits(take(dqkv, T, 3 * C, b, t0, n, 0, 3 * C), d1)) << at;
                // The saved probabilities: the document's own block, zero elsewhere in its rows.
                for (int h = 0; h < NH; ++h)
                    for (int i = 0; i < n; ++i)
                        for (int j = 0; j < T; ++j) {
                            const float p = att[((size_t(b) * NH + h) * T + t0 + i) * T + j];
                            const bool inside = j >= t0 && j <= t0 + i;
                            const float want = inside ? a1[(size_t(h) * n + i) * n + (j - t0)] : 0.0f;
                            ASSERT_EQ(p, want) << at << " h=" << h << " i=" << i << " j=" << j;
                        }
                t0 += n;
            }
        }
    }
}

// Sliding windows (each query's first key t - W + 1, and its document's start where later): of
// one key, inside a tile, a whole tile, crossing tiles, with documents.
const Layout kWindows[] = {
    {130, {{130}, {64, 66}}, 1},
    {130, {{130}, {1, 70, 1, 58}}, 5},
    {200, {{200}, {10, 54, 64, 1, 71}}, 64},
    {97, {{97}, {33, 33, 31}}, 40},
};

// Flash against naive, both with the documents, in storage type S (inputs rounded to S first).
template <class S>
void flash_matches_naive(double tol, const auto & layouts) {
    for (const Layout & L : layouts)
        for (const int C : {32, 80, 160}) {   // head sizes 8, 20 (with 4 heads) and 80 (2 heads)
            const int NH = C == 160 ? 2 : 4, B = L.B(), T = L.T;
            std::mt19937 rng(9);
            auto round = [](std::vector<float> v) {
                std::vector<S> s(v.size());
                from_f32_row(s.data(), v.data(), v.size());
                return s;
            };
            const auto qkv = round(randn(size_t(B) * T * 3 * C, rng, 2.0f));
            const auto dout = round(randn(size_t(B) * T * C, rng));
            const auto starts = L.doc_start();
            std::vector<S> out(size_t(B) * T * C), ref(out.size()), att(size_t(B) * NH * T * T), dq(qkv.size()),
                dref(qkv.size());
            std::vector<float> lse(size_t(B) * NH * T, kNaN), scratch(flash_attention_scratch_floats(B, T, C, NH, dtype_of<S>())),
                nscratch(size_t(B) * NH * T);
            flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, starts.data());
            attention_forward(ref.data(), att.data(), qkv.data(), B, T, C, NH, starts.data());
            flash_attention_backward(dq.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(), B, T,
                                     C, NH, starts.data());
            attention_backward(dref.data(), nscratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH,
                               starts.data());
            auto f32 = [](const std::vector<S> & v) {
                std::vector<float> f(v.size());
                to_f32_row(f.data(), v.data(), v.size());
                return f;
            };
            const std::string at = "T=" + std::to_string(T) + " C=" + std::to_string(C) + " W=" + std::to_string(L.window);
            EXPECT_LT(rel_err(f32(out), f32(ref)), tol) << at;
            EXPECT_LT(rel_err(f32(dq), f32(dref)), tol) << at;
            for (const float x : lse) ASSERT_TRUE(std::isfinite(x)) << at;
        }
}

TEST(DocumentKernels, FlashAttentionMatchesNaiveWithTheSameDocuments) {
    flash_matches_naive<float>(1e-5, kLayouts);
    flash_matches_naive<bf16_t>(2e-2, kLayouts);
    flash_matches_naive<f16_t>(4e-3, kLayouts);
}

// Sliding-window attention: the naive kernels with each query's first key (the window's start or
// its document's) give a softmax over exactly those keys (a float64 reference), zero probability
// elsewhere; flash equals naive with the same starts, forward and backward.
TEST(DocumentKernels, SlidingWindowAttention) {
    for (const Layout & L : kWindows) {
        const int C = 32, NH = 4, hd = 8, B = L.B(), T = L.T;
        std::mt19937 rng(5);
        const auto qkv = randn(size_t(B) * T * 3 * C, rng, 2.0f);
        const auto starts = L.doc_start();
        std::vector<float> out(size_t(B) * T * C), att(size_t(B) * NH * T * T);
        attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, starts.data());
        double worst = 0;
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < NH; ++h)
                for (int t = 0; t < T; ++t) {
                    const int lo = starts[size_t(b) * T + t];
                    ASSERT_GE(lo, std::max(0, t - L.window + 1));
                    const float * q = qkv.data() + (size_t(b) * T + t) * 3 * C + h * hd;
                    std::vector<double> w;
                    double mx = -1e300, sum = 0;
                    for (int k = lo; k <= t; ++k) {
                        const float * kk = qkv.data() + (size_t(b) * T + k) * 3 * C + C + h * hd;
                        double d = 0;
                        for (int i = 0; i < hd; ++i) d += double(q[i]) * kk[i];
                        w.push_back(d / std::sqrt(double(hd)));
                        mx = std::max(mx, w.back());
                    }
                    for (double & x : w) sum += (x = std::exp(x - mx));
                    for (int i = 0; i < hd; ++i) {
                        double o = 0;
                        for (int k = lo; k <= t; ++k)
                            o += w[size_t(k - lo)] / sum * qkv[(size_t(b) * T + k) * 3 * C + 2 * C + h * hd + i];
                        worst = std::max(worst, std::fabs(o - out[(size_t(b) * T + t) * C + h * hd + i]));
                    }
                    for (int k = 0; k < T; ++k) {
                        if (k >= lo && k <= t) continue;
                        ASSERT_EQ(att[((size_t(b) * NH + h) * T + t) * T + k], 0.0f) << t << " " << k;
                    }
                }
        EXPECT_LT(worst, 1e-5) << "T=" << T << " W=" << L.window;
    }
    flash_matches_naive<float>(1e-5, kWindows);
    flash_matches_naive<bf16_t>(2e-2, kWindows);
}

TEST(DocumentKernels, RopeAndPositionEmbeddingRestartAtEachDocument) {
    const int NH = 2, KVH = 1, hd = 8, W = (NH + 2 * KVH) * hd, C = 16;
    for (const Layout & L : kLayouts) {
        const int B = L.B(), T = L.T;
        std::mt19937 rng(3);
        const auto starts = L.doc_start();
        const auto qkv = randn(size_t(B) * T * W, rng);
        auto fwd = qkv, bwd = qkv;
        rope_forward(fwd.data(), B, T, NH, KVH, hd, 10000.0f, 0, starts.data());
        rope_backward(bwd.data(), B, T, NH, KVH, hd, 10000.0f, 0, starts.data());
        // GPT-2's embedding: tokens and positions.
        std::vector<int32_t> tokens(size_t(B) * T);
        for (auto & t : tokens) t = int32_t(rng() % 11);
        const auto wte = randn(size_t(11) * C, rng), wpe = randn(size_t(T) * C, rng);
        const auto dout = randn(size_t(B) * T * C, rng);
        std::vector<float> emb(size_t(B) * T * C), dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
        encoder_forward(emb.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, -1, starts.data());
        encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, 0, -1, starts.data());
        std::vector<double> want_dwpe(wpe.size(), 0.0);
        for (int b = 0; b < B; ++b) {
            int t0 = 0;
            for (const int n : L.rows[size_t(b)]) {
                const std::string at = "T=" + std::to_string(T) + " row " + std::to_string(b) + " doc at " +
                                       std::to_string(t0);
                auto f1 = take(qkv, T, W, b, t0, n, 0, W), b1 = f1;
                rope_forward(f1.data(), 1, n, NH, KVH, hd, 10000.0f, 0);
                rope_backward(b1.data(), 1, n, NH, KVH, hd, 10000.0f, 0);
                EXPECT_TRUE(same_bits(take(fwd, T, W, b, t0, n, 0, W), f1)) << at;
                EXPECT_TRUE(same_bits(take(bwd, T, W, b, t0, n, 0, W), b1)) << at;
                std::vector<float> e1(size_t(n) * C);
                encoder_forward(e1.data(), tokens.data() + size_t(b) * T + t0, wte.data(), wpe.data(), 1, n, C);
                EXPECT_TRUE(same_bits(take(emb, T, C, b, t0, n, 0, C), e1)) << at;
                for (int i = 0; i < n; ++i)
                    for (int c = 0; c < C; ++c) want_dwpe[size_t(i) * C + c] += dout[(size_t(b) * T + t0 + i) * C + c];
                t0 += n;
            }
        }
        double err = 0;
        for (size_t i = 0; i < wpe.size(); ++i) err = std::max(err, std::fabs(dwpe[i] - want_dwpe[i]));
        EXPECT_LT(err, 1e-5) << "dwpe, T=" << T;
        // dwte does not depend on positions: the same as without documents.
        std::vector<float> dwte0(wte.size(), 0.0f), dwpe0(wpe.size(), 0.0f);
        encoder_backward(dwte0.data(), dwpe0.data(), dout.data(), tokens.data(), B, T, C);
        for (size_t i = 0; i < wte.size(); ++i) ASSERT_NEAR(dwte[i], dwte0[i], 1e-5) << "dwte, T=" << T;
    }
}

}  // namespace
}  // namespace memfit::cpu
