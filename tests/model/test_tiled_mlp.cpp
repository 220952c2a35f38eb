// TiledMLP (--mlp-chunk): the MLP run chunk by chunk of tokens, forward and backward, equals the
// whole MLP (losses, evaluation and the updated weights, to fp32 summation order) under every
// recomputation policy, and keeps less: none of the [B*T, 4C] intermediates live whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/recompute.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;

namespace {

constexpr int V = 97, B = 2, T = 24;

struct Trained {
    std::vector<float> params;
    std::vector<float> losses;
    float eval = 0;
    uint64_t activations = 0;   // peak live activation bytes
};

Trained train(const ModelConfig & cfg, const char * recompute, int mlp_chunk, bool flash, DType dt = DType::f32) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.flash_attention = flash;
    eo.compute = dt;
    eo.recompute = parse_recompute(recompute, cfg.n_layer);
    eo.mlp_chunk = mlp_chunk;
    Engine e(cfg, backend, eo);
    e.init_params(3);
    Trained r;
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    for (int s = 0; s < 3; ++s) {
        test::random_batch(in, tg, V, uint64_t(s));
        r.losses.push_back(e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}).loss);
    }
    r.eval = e.eval_loss(in.data(), tg.data());
    const std::vector<float> p = e.full_params();
    r.params = p;
    r.activations = e.ledger().live_peak()[Category::activations];
    return r;
}

}  // namespace

// GPT-2, LLaMA and OLMo 2 (whose MLP output feeds a norm before the residual add).
TEST(TiledMlp, EqualsTheWholeMlpUnderEveryPolicy) {
    const nlohmann::json olmo2 = {{"model_type", "olmo2"}, {"vocab_size", V}, {"hidden_size", 32},
                                  {"intermediate_size", 88}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                                  {"max_position_embeddings", T}};
    for (const ModelConfig & cfg : {test::small_family(false, V, 32, 3, 4, 88), test::small_family(true, V, 32, 3, 4, 88),
                                    parse_hf_config(olmo2, "olmo2")}) {
        for (const char * rc : {"none", "full", "selective", "every:2"})
            for (bool flash : {false, true}) {
                SCOPED_TRACE(cfg.describe() + " " + rc + (flash ? " flash" : " naive"));
                const Trained whole = train(cfg, rc, 0, flash);
                // 7 rows per chunk: 48 rows are 6 chunks of 7 and one of 6.
                const Trained tiled = train(cfg, rc, 7, flash);
                for (size_t s = 0; s < whole.losses.size(); ++s)
                    EXPECT_NEAR(tiled.losses[s], whole.losses[s], 1e-5 * whole.losses[s]) << "step " << s;
                EXPECT_NEAR(tiled.eval, whole.eval, 1e-5 * whole.eval);
                double worst = 0;
                for (size_t i = 0; i < whole.params.size(); ++i)
                    worst = std::max(worst, double(std::fabs(tiled.params[i] - whole.params[i])));
                // The chunked weight gradients sum in another order than the whole gemm's (which order
                // depends on the CPU's oneDNN kernels: 3.0e-6 on an AVX2-only Zen 3, under 2e-6 with
                // AVX-512), and AdamW's normalised steps carry it: 1% of one step's lr.
                EXPECT_LT(worst, 1e-5);
                // Keeping the MLP's intermediates (none, selective) costs more than tiles do.
                if (std::string(rc) == "none") {
                    EXPECT_LT(tiled.activations, whole.activations);
                }
            }
    }
}

// bf16 storage, a chunk that divides the rows, and one at least as large as them (untiled).
TEST(TiledMlp, Bf16AndChunkEdges) {
    const ModelConfig cfg = test::small_family(true, V, 32, 2, 4, 88);
    const Trained whole = train(cfg, "none", 0, true, DType::bf16);
    const Trained tiled = train(cfg, "none", 16, true, DType::bf16);
    for (size_t s = 0; s < whole.losses.size(); ++s)
        EXPECT_NEAR(tiled.losses[s], whole.losses[s], 2e-2 * whole.losses[s]) << "step " << s;
    const Trained big = train(cfg, "none", B * T, true, DType::bf16);
    EXPECT_EQ(big.losses, whole.losses);
    EXPECT_EQ(big.activations, whole.activations);
}
