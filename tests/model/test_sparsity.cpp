// N:M magnitude pruning (model/sparsity.h): which weights it prunes (the block projections, along
// their input dimension: rows of LLaMA's [out, in], columns of GPT-2's [in, out]), which it keeps
// (the N largest |w| of every group, ties to the lower index), that it is idempotent, and the
// refusals of patterns a model cannot hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/sparsity.h"
#include "test_util.h"

using namespace memfit;

namespace {

std::vector<float> random_weights(const ParamLayout & layout, uint32_t seed) {
    std::mt19937 rng(seed);
    return test::randn(layout.total, rng, 0.02f);
}

}  // namespace

TEST(Sparsity, ParsesAndRefusesPatterns) {
    const NmSparsity s = parse_sparsity("2:4");
    EXPECT_EQ(s.n, 2);
    EXPECT_EQ(s.m, 4);
    EXPECT_EQ(s.name(), "2:4");
    EXPECT_FALSE(parse_sparsity("off").enabled());
    EXPECT_FALSE(parse_sparsity("").enabled());
    EXPECT_EQ(parse_sparsity("1:8").m, 8);
    for (const char * bad : {"3:2", "2:2", "0:4", "2:4x", "4", "a:b", "2:128"}) {
        try {
            parse_sparsity(bad);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
        }
    }
}

TEST(Sparsity, TargetsAreTheBlockProjections) {
    for (const bool llama : {false, true}) {
        const ModelConfig cfg = test::small_family(llama, 64, 32, 2, 4, 48);
        std::vector<std::string> targets;
        for (const auto & p : make_param_layout(cfg).params)
            if (sparse_target(p.name)) targets.push_back(p.name);
        EXPECT_EQ(targets.size(), llama ? 14u : 8u);   // 7 (4) projections x 2 layers
        for (const auto & n : targets) {
            EXPECT_GE(param_block(n), 0) << n;
            EXPECT_TRUE(n.ends_with(".weight")) << n;
        }
    }
    EXPECT_FALSE(sparse_target("wte.weight"));
    EXPECT_FALSE(sparse_target("lm_head.weight"));
    EXPECT_FALSE(sparse_target("h.0.attn.c_attn.bias"));
    EXPECT_FALSE(sparse_target("h.0.ln_1.weight"));
    EXPECT_FALSE(sparse_target("model.layers.1.input_layernorm.weight"));
}

// Every group of a pruned projection keeps its N largest magnitudes and nothing else changes.
TEST(Sparsity, PruningKeepsTheLargestMagnitudes) {
    for (const bool llama : {false, true})
        for (const NmSparsity s : {NmSparsity{2, 4}, NmSparsity{1, 4}, NmSparsity{3, 8}}) {
            SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + s.name());
            const ModelConfig cfg = test::small_family(llama, 64, 32, 2, 4, 48);
            const ParamLayout layout = make_param_layout(cfg);
            const std::vector<float> dense = random_weights(layout, 3);
            std::vector<float> w = dense;
            EXPECT_GT(nm_violations(cfg, layout, w.data(), s), 0u);
            const size_t zeroed = prune_nm(cfg, layout, w.data(), s);
            EXPECT_EQ(nm_violations(cfg, layout, w.data(), s), 0u);
            size_t target_elems = 0;
            for (const auto & p : layout.params) {
                if (!sparse_target(p.name)) {   // untouched
                    EXPECT_TRUE(std::equal(dense.begin() + long(p.offset), dense.begin() + long(p.offset + p.numel),
                                           w.begin() + long(p.offset))) << p.name;
                    continue;
                }
                target_elems += p.numel;
                // Groups along the input dimension: LLaMA [out, in] rows, GPT-2 [in, out] columns.
                const int64_t in = llama ? p.shape[1] : p.shape[0], out = llama ? p.shape[0] : p.shape[1];
                auto at = [&](int64_t o, int64_t k) { return p.offset + size_t(llama ? o * in + k : k * out + o); };
                for (int64_t o = 0; o < out; ++o)
                    for (int64_t g = 0; g < in; g += s.m) {
                        std::vector<float> mags;
                        for (int j = 0; j < s.m; ++j) mags.push_back(std::fabs(dense[at(o, g + j)]));
                        std::vector<float> sorted = mags;
                        std::sort(sorted.begin(), sorted.end(), std::greater<>());
                        int kept = 0;
                        for (int j = 0; j < s.m; ++j) {
                            const float now = w[at(o, g + j)];
                            if (now == 0.0f) continue;
                            ++kept;
                            ASSERT_EQ(now, dense[at(o, g + j)]);   // kept as it was
                            ASSERT_GE(mags[size_t(j)], sorted[size_t(s.n - 1)]) << p.name << " row " << o;
                        }
                        ASSERT_EQ(kept, s.n) << p.name << " row " << o << " group " << g;
                    }
            }
            EXPECT_EQ(zeroed, target_elems / size_t(s.m) * size_t(s.m - s.n));
            // Idempotent: pruning pruned weights zeroes nothing more.
            const std::vector<float> once = w;
            EXPECT_EQ(prune_nm(cfg, layout, w.data(), s), 0u);
            EXPECT_EQ(w, once);
        }
}

// Ties go to the lower index; a group whose kept weights are already zero stays as it is.
TEST(Sparsity, TiesKeepTheLowerIndex) {
    const ModelConfig cfg = test::small_family(true, 64, 32, 1, 4, 48);
    const ParamLayout layout = make_param_layout(cfg);
    std::vector<float> w(layout.total, 0.5f);
    const ParamInfo & q = layout.find("model.layers.0.self_attn.q_proj.weight");
    w[q.offset + 4] = -0.5f;   // group 1: |w| all equal
    w[q.offset + 8] = 0.0f, w[q.offset + 9] = 0.0f, w[q.offset + 10] = 0.0f;   // group 2: one nonzero
    prune_nm(cfg, layout, w.data(), NmSparsity{2, 4});
    EXPECT_EQ(std::vector<float>(w.begin() + long(q.offset), w.begin() + long(q.offset + 12)),
              (std::vector<float>{0.5f, 0.5f, 0, 0, -0.5f, 0.5f, 0, 0, 0, 0, 0, 0.5f}));
}

TEST(Sparsity, RefusesWhatTheModelCannotHold) {
    const ModelConfig cfg = test::small_family(false, 64, 36, 1, 4, 0);   // C = 36: 8 does not divide it
    EXPECT_EQ(sparsity_refusal(cfg, NmSparsity{2, 4}, false), "");
    EXPECT_EQ(sparsity_refusal(cfg, NmSparsity{}, true), "");   // dense: nothing to refuse
    const std::string m8 = sparsity_refusal(cfg, NmSparsity{4, 8}, false);
    EXPECT_NE(m8.find("input dimension of 36"), std::string::npos) << m8;
    const std::string lora = sparsity_refusal(cfg, NmSparsity{2, 4}, true);
    EXPECT_NE(lora.find("LoRA"), std::string::npos) << lora;
}
