// The tensor-parallel slices (model/tensor_parallel.h): every rank's slice is a model of its
// own shape, the slices put back together give the whole model exactly, every element of a
// slice comes from one place (padding rows aside), and bad head counts are one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/param_layout.h"
#include "model/tensor_parallel.h"
#include "test_util.h"

using namespace memfit;

TEST(TensorParallelSlices, AssembleInvertsSliceForBothFamilies) {
    for (bool llama : {false, true})
        for (int T : {1, 2, 4}) {
            // llama, T = 4: 2 KV heads, each held by 2 ranks
            SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " T " + std::to_string(T));
            const ModelConfig cfg = test::small_family(llama, 37, 32, 2, 4, 48);
            const ModelConfig local = tp_local_config(cfg, T);
            EXPECT_EQ(local.n_head * T, cfg.n_head);
            EXPECT_EQ(local.head_dim(), cfg.head_dim());
            EXPECT_EQ(local.ffn_dim() * T, cfg.ffn_dim());
            EXPECT_EQ(local.vocab_size, (37 + T - 1) / T);
            std::vector<float> whole(size_t(cfg.num_params()));
            std::iota(whole.begin(), whole.end(), 1.0f);
            std::vector<std::vector<float>> slices;
            std::vector<const float *> ptrs;
            for (int r = 0; r < T; ++r) slices.push_back(tp_slice(cfg, T, r, whole.data()));
            for (const auto & s : slices) {
                EXPECT_EQ(s.size(), make_param_layout(local).total);
                ptrs.push_back(s.data());
            }
            std::vector<float> back(whole.size(), -1.0f);
            tp_assemble(cfg, T, ptrs, back.data());
            EXPECT_EQ(back, whole);
            // Each local element is written once; only the last vocabulary slice's padding is not.
            size_t padding = 0;
            for (int r = 0; r < T; ++r) {
                std::vector<int> hits(slices[size_t(r)].size(), 0);
                for (const auto & run : tp_runs(cfg, T, r))
                    for (size_t i = 0; i < run.n; ++i) ++hits[run.local + i];
                for (size_t i = 0; i < hits.size(); ++i) {
                    EXPECT_LE(hits[i], 1) << "rank " << r << " element " << i;
                    padding += hits[i] == 0;
                }
            }
            const size_t pad_rows = size_t(local.vocab_size * T - 37);
            EXPECT_EQ(padding, pad_rows * size_t(cfg.n_embd) * (llama && !cfg.tied_head ? 2 : 1));
        }
}

TEST(TensorParallelSlices, ReplicatedParametersAreTheNormsBiasesAndPositions) {
    const ModelConfig cfg = test::small_family(false, 37, 32, 2, 4, 48);
    const ParamLayout local = make_param_layout(tp_local_config(cfg, 2));
    size_t replicated = 0;
    for (const auto & r : tp_replicated(local, 2)) replicated += r.b - r.a;
    // wpe, and per block ln_1, ln_2 (weight, bias), attn.c_proj.bias, mlp.c_proj.bias; ln_f.
    const size_t C = size_t(cfg.n_embd);
    EXPECT_EQ(replicated, size_t(cfg.max_seq) * C + size_t(cfg.n_layer) * 6 * C + 2 * C);
    EXPECT_EQ(tp_replicated(make_param_layout(cfg), 1).size(), 1u);   // no split: everything, one range
    EXPECT_EQ(tp_replicated(make_param_layout(cfg), 1)[0].b, make_param_layout(cfg).total);
}

TEST(TensorParallelSlices, HeadsThatDoNotDivideAreOneClearError) {
    // 4 ranks over 2 KV heads: each KV head is held by the 2 ranks whose query heads read it.
    const ModelConfig llama = test::small_family(true, 37, 32, 2, 4, 48);
    EXPECT_EQ(tp_local_config(llama, 4).kv_heads(), 1);
    EXPECT_EQ(tp_kv_replicas(llama, 4), 2);
    EXPECT_EQ(tp_kv_replicas(llama, 2), 1);
    const std::vector<float> whole = [&] {
        std::vector<float> w(size_t(llama.num_params()));
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(i);
        return w;
    }();
    // Ranks 2 and 3 hold KV head 1: the same k rows.
    const ParamLayout local = make_param_layout(tp_local_config(llama, 4));
    const ParamInfo & k = local.find("model.layers.0.self_attn.k_proj.weight");
    const auto r2 = tp_slice(llama, 4, 2, whole.data()), r3 = tp_slice(llama, 4, 3, whole.data());
    const auto r0 = tp_slice(llama, 4, 0, whole.data());
    EXPECT_TRUE(std::equal(r2.begin() + long(k.offset), r2.begin() + long(k.offset + k.numel), r3.begin() + long(k.offset)));
    EXPECT_FALSE(std::equal(r2.begin() + long(k.offset), r2.begin() + long(k.offset + k.numel), r0.begin() + long(k.offset)));
    ModelConfig six = test::small_family(true, 37, 48, 2, 6, 48);   // 6 heads, 3 KV heads
    try {
        tp_local_config(six, 2);
        ADD_FAILURE() << "2 tensor ranks over 3 KV heads accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("n_kv_head = 3, which neither divides by 2 nor divides it"),
                  std::string::npos) << e.what();
    }
    EXPECT_THROW(tp_local_config(test::small_family(false, 37, 32, 2, 4, 48), 3), ConfigError);
}
