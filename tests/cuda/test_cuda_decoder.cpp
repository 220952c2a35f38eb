// Generation on the CUDA backend (`memfit generate --device cuda`): the decoder's prefill and
// cached steps give the CPU decoder's logits (both families, grouped-query heads, bf16, packed
// int8 / nf4 / sparse24 projections, a sliding window's rolling cache), greedy generation the
// same tokens, the plan the bytes acquired, and planned reserved + runtime the device memory in use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "infer/batch_generate.h"
#include "infer/decoder.h"
#include "infer/generate.h"
#include "op_check.h"
#include "test_util.h"
#include "train/engine.h"

namespace memfit::test {
namespace {

// Grouped-query LLaMA: 4 query heads over 2 KV heads, a SwiGLU of 40, an untied head.
ModelConfig llama_small() { return small_family(true, 53, 32, 2, 4, 40, 24); }

struct DecodeCase {
    ModelConfig cfg;
    DType dt;
    std::optional<QuantFormat> quant;
    const char * name;
};

// The whole model's fp32 weights as a freshly initialised engine holds them.
std::vector<float> initial_weights(const ModelConfig & cfg) {
    CpuBackend cpu;
    EngineOptions eo;
    eo.B = 1, eo.T = 8, eo.with_eval = false;
    Engine e(cfg, cpu, eo);
    e.init_params(11);
    return std::vector<float>(e.params(), e.params() + cfg.num_params());
}

TEST(CudaDecoder, LogitsAndTokensMatchTheCpuDecoder) {
    MF_REQUIRE_GPU();
    ModelConfig window = llama_small();
    window.model_type = "mistral", window.max_seq = 100, window.sliding_window = 5;
    const DecodeCase cases[] = {{small_config(53, 32, 2, 4, 24), DType::f32, std::nullopt, "gpt2 f32"},
                                {llama_small(), DType::bf16, std::nullopt, "llama bf16"},
                                {llama_small(), DType::f32, QuantFormat::nf4_dq, "llama nf4"},
                                {small_config(53, 32, 2, 4, 24), DType::f32, QuantFormat::int8, "gpt2 int8"},
                                {llama_small(), DType::bf16, QuantFormat::sparse24, "llama bf16 sparse24"},
                                {window, DType::f32, std::nullopt, "mistral rolling cache"}};
    for (const DecodeCase & c : cases) {
        SCOPED_TRACE(c.name);
        const std::vector<float> w = initial_weights(c.cfg);
        const int capacity = c.cfg.sliding_window ? 90 : 24, prompt_len = c.cfg.sliding_window ? 70 : 6;
        std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
        for (int i = 0; i < prompt_len; ++i) prompt[size_t(i)] = (i * 17 + 5) % c.cfg.vocab_size;
        CpuBackend cpu;
        CudaBackend & g = *gpu();
        Decoder a(c.cfg, cpu, capacity, c.dt, c.quant), b(c.cfg, g, capacity, c.dt, c.quant);
        a.set_weights(w.data()), b.set_weights(w.data());
        EXPECT_EQ(a.weights(), b.weights()) << "the stored weights, read back";
        const double tol = c.dt == DType::f32 ? (c.quant ? 1e-3 : 1e-4) : 3e-2;
        const int V = c.cfg.vocab_size;
        a.prefill(prompt), b.prefill(prompt);   // and again: the cache restarts
        const float * pa0 = a.prefill(prompt);
        std::vector<float> la(pa0, pa0 + V);
        const float * pb0 = b.prefill(prompt);
        std::vector<float> lb(pb0, pb0 + V);
        EXPECT_LT(rel(la, lb), tol) << "prefill";
        for (int t = 0; t < 10; ++t) {
            const int32_t next = (t * 7 + 1) % V;
            const float * pa = a.step(next);
            la.assign(pa, pa + V);
            const float * pb = b.step(next);
            lb.assign(pb, pb + V);
            ASSERT_LT(rel(la, lb), tol) << "step " << t;
        }
        EXPECT_EQ(b.position(), prompt_len + 10);
        if (c.dt == DType::f32) {   // greedy: the same tokens (bf16 may break a near tie the other way)
            SampleOptions so;
            so.max_new_tokens = 12, so.temperature = 0;
            EXPECT_EQ(generate(a, prompt, so), generate(b, prompt, so));
        }
        const CategoryBytes plan = b.planned_peak_live(), rsv = b.planned_reserved();
        for (int k = 0; k < kCategoryCount; ++k) {
            EXPECT_EQ(plan.v[size_t(k)], b.ledger().live_peak().v[size_t(k)]) << category_name(Category(k));
            EXPECT_EQ(rsv.v[size_t(k)], b.ledger().reserved_peak().v[size_t(k)]) << category_name(Category(k));
        }
        EXPECT_EQ(plan[Category::parameters], a.planned_peak_live()[Category::parameters]);
        EXPECT_EQ(b.kv_cache_bytes(), a.kv_cache_bytes());
        g.synchronize();
#ifdef MEMFIT_CUDA_EMU
        EXPECT_EQ(rsv.total() + g.runtime_bytes(), g.device_used_delta());
#else
        EXPECT_LT(std::fabs(double(rsv.total() + g.runtime_bytes()) - double(g.device_used_delta())),
                  0.02 * double(g.device_used_delta()));
#endif
    }
}

// Batched generation over the paged cache (`generate --prompts --device cuda`): the same tokens as
// the CPU's for every request (greedy, fp32), through chunked prefill and pre-emption, and the
// plan the bytes acquired.
TEST(CudaDecoder, BatchedGenerationMatchesTheCpu) {
    MF_REQUIRE_GPU();
    for (const bool llama : {false, true}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = small_family(llama, 53, 32, 2, 4, 40, 48);
        std::vector<float> w = initial_weights(cfg);
        for (float & x : w) x *= 6.0f;   // sharp logits: no near ties between the backends
        std::vector<GenerationRequest> reqs(6);
        for (size_t i = 0; i < reqs.size(); ++i) {
            for (size_t t = 0; t < 3 + 4 * i; ++t) reqs[i].prompt.push_back(int32_t((t * 13 + i * 5 + 1) % 53));
            reqs[i].sample.temperature = 0;
            reqs[i].sample.max_new_tokens = 8 + int(i);
        }
        PagedKv kv;
        kv.block = 4, kv.blocks = 14, kv.seqs = 8, kv.tokens = 16;
        CpuBackend cpu;
        CudaBackend & g = *gpu();
        Decoder a(cfg, cpu, kv, 40, DType::f32), b(cfg, g, kv, 40, DType::f32);
        a.set_weights(w.data()), b.set_weights(w.data());
        BatchStats sa, sb;
        const auto ra = generate_batch(a, reqs, {}, &sa), rb = generate_batch(b, reqs, {}, &sb);
        EXPECT_GT(sb.preemptions, 0);
        for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(ra[i].tokens, rb[i].tokens) << "request " << i;
        const CategoryBytes plan = b.planned_peak_live();
        EXPECT_EQ(plan.total(), b.ledger().live_peak().total());
        EXPECT_EQ(b.kv_cache_bytes(), a.kv_cache_bytes());
    }
}

}  // namespace
}  // namespace memfit::test
