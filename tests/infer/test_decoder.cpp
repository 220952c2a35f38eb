// Generation with a KV cache: a prompt run at once and then token by token gives the logits a
// full forward over the same tokens gives (both families, grouped-query heads, bf16 caches);
// its bytes are planned exactly (the caches are 2 x layers x capacity x KV width); and a cache
// that fills is refilled from the last half of the context.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "core/error.h"
#include "infer/decoder.h"
#include "train/engine.h"
#include "infer/generate.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::max_rel;

namespace {

ModelConfig gpt2_small() { return memfit::test::small_config(53, 32, 2, 4, 24); }

ModelConfig llama_small() {
    ModelConfig c = memfit::test::small_config(53, 32, 2, 4, 24);
    c.family = "llama";
    c.n_kv_head = 2;
    c.ffn = 40;
    c.tied_head = false;
    return c;
}

}  // namespace

TEST(Decoder, CachedLogitsEqualTheFullForward) {
    for (const ModelConfig & cfg : {gpt2_small(), llama_small()}) {
        SCOPED_TRACE(cfg.family);
        CpuBackend backend;
        const int T = 20, V = cfg.vocab_size;
        EngineOptions eo;
        eo.B = 1;
        eo.T = T;
        eo.with_eval = false;
        Engine e(cfg, backend, eo);
        e.init_params(3);
        std::vector<int32_t> tokens(T);
        for (int i = 0; i < T; ++i) tokens[size_t(i)] = (i * 17 + 5) % V;
        const std::vector<float> full = e.logits(tokens.data(), 1);

        Decoder d(cfg, backend, 24);
        d.set_weights(e.params());
        // A prompt of 7 at once, then one token at a time: row t must match the full forward's row t.
        const float * l = d.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 7));
        EXPECT_LT(max_rel(l, full.data() + 6 * V, V), 1e-5);
        for (int t = 7; t < T; ++t) {
            l = d.step(tokens[size_t(t)]);
            EXPECT_EQ(d.position(), t + 1);
            EXPECT_LT(max_rel(l, full.data() + size_t(t) * V, V), 1e-5) << "position " << t;
        }
        // A new prefill forgets the cache.
        l = d.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3));
        EXPECT_LT(max_rel(l, full.data() + 2 * V, V), 1e-5);

        // bf16 weights and caches: within bf16 rounding of the fp32 logits.
        Decoder h(cfg, backend, 24, DType::bf16);
        h.set_weights(e.params());
        l = h.prefill(tokens);
        EXPECT_LT(max_rel(l, full.data() + size_t(T - 1) * V, V), 0.05);
    }
}

// A sliding window (Mistral's) past its width: the rolling cache holds W + 63 rows, the prompt is
// prefilled in chunks of 64, and every position's logits are the windowed full forward's (which
// differ from unwindowed attention's: the window matters).
TEST(Decoder, RollingCacheOfASlidingWindowEqualsTheFullForward) {
    ModelConfig cfg = llama_small();
    cfg.model_type = "mistral";
    cfg.max_seq = 160;
    cfg.sliding_window = 5;
    CpuBackend backend;
    const int T = 150, V = cfg.vocab_size;
    EngineOptions eo;
    eo.B = 1;
    eo.T = T;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(7);
    std::vector<int32_t> tokens(T);
    for (int i = 0; i < T; ++i) tokens[size_t(i)] = (i * 29 + 3) % V;
    const std::vector<float> full = e.logits(tokens.data(), 1);

    Decoder d(cfg, backend, T);
    EXPECT_EQ(d.cache_rows(), 5 + Decoder::kPrefillChunk - 1);
    EXPECT_EQ(d.kv_cache_bytes(), uint64_t(2) * cfg.n_layer * uint64_t(d.cache_rows()) * cfg.kv_heads() * cfg.head_dim() * 4);
    d.set_weights(e.params());
    const float * l = d.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 100));   // chunks 64 + 36
    EXPECT_LT(max_rel(l, full.data() + 99 * size_t(V), V), 1e-5);
    for (int t = 100; t < T; ++t) {
        l = d.step(tokens[size_t(t)]);
        ASSERT_LT(max_rel(l, full.data() + size_t(t) * V, V), 1e-5) << "position " << t;
    }
    const CategoryBytes plan = d.planned_peak_live();
    for (size_t c = 0; c < kCategoryCount; ++c) EXPECT_EQ(plan.v[c], d.ledger().live_peak().v[c]) << kCategoryNames[c];

    ModelConfig plain = cfg;
    plain.sliding_window = 0;
    plain.model_type = "llama";
    Engine u(plain, backend, eo);
    u.init_params(7);
    const std::vector<float> unwindowed = u.logits(tokens.data(), 1);
    EXPECT_GT(max_rel(unwindowed.data() + size_t(T - 1) * V, full.data() + size_t(T - 1) * V, V), 1e-3);
}

// Gemma 3: a sliding layer (window 5) and a global one, each with its RoPE base, the embedding
// scaled and the scores by query_pre_attn_scalar. Past the window plus a prefill chunk the
// sliding layer's cache is a ring of W + 63 rows and the global layer's holds every position (the
// hybrid cache), planned so; a prompt prefilled in chunks, then token by token, gives every
// position's logits as the full forward does.
TEST(Decoder, Gemma3SlidingAndGlobalLayersEqualTheFullForward) {
    const nlohmann::json j = {{"model_type", "gemma3_text"}, {"vocab_size", 53}, {"hidden_size", 32},
                              {"intermediate_size", 40}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"head_dim", 16}, {"query_pre_attn_scalar", 12},
                              {"sliding_window", 5}, {"sliding_window_pattern", 2}, {"max_position_embeddings", 160}};
    const ModelConfig cfg = parse_hf_config(j, "gemma3");
    CpuBackend backend;
    const int T = 150, V = cfg.vocab_size;
    EngineOptions eo;
    eo.B = 1;
    eo.T = T;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(11);
    std::vector<int32_t> tokens(T);
    for (int i = 0; i < T; ++i) tokens[size_t(i)] = (i * 13 + 2) % V;
    const std::vector<float> full = e.logits(tokens.data(), 1);
    Decoder d(cfg, backend, T);
    EXPECT_EQ(d.cache_rows(), 5 + Decoder::kPrefillChunk - 1);
    const uint64_t row = uint64_t(2) * cfg.kv_heads() * cfg.head_dim() * 4;   // k and v, fp32
    EXPECT_EQ(d.kv_cache_bytes(), row * uint64_t(d.cache_rows() + T));
    d.set_weights(e.params());
    const float * l = d.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 100));   // 64 + 36
    EXPECT_LT(max_rel(l, full.data() + 99 * size_t(V), V), 1e-5);
    for (int t = 100; t < T; ++t) {
        l = d.step(tokens[size_t(t)]);
        ASSERT_LT(max_rel(l, full.data() + size_t(t) * V, V), 1e-5) << "position " << t;
    }
    const CategoryBytes plan = d.planned_peak_live();
    for (size_t c = 0; c < kCategoryCount; ++c) EXPECT_EQ(plan.v[c], d.ledger().live_peak().v[c]) << kCategoryNames[c];
}

// GPT-NeoX: parallel residuals, partial rotary, biases: cached generation equals the full forward.
TEST(Decoder, GptNeoxEqualsTheFullForward) {
    const nlohmann::json j = {{"model_type", "gpt_neox"}, {"vocab_size", 53}, {"hidden_size", 32},
                              {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                              {"max_position_embeddings", 64}};
    const ModelConfig cfg = parse_hf_config(j, "neox");
    CpuBackend backend;
    const int T = 30, V = cfg.vocab_size;
    EngineOptions eo;
    eo.B = 1;
    eo.T = T;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(12);
    std::vector<int32_t> tokens(T);
    for (int i = 0; i < T; ++i) tokens[size_t(i)] = (i * 7 + 1) % V;
    const std::vector<float> full = e.logits(tokens.data(), 1);
    Decoder d(cfg, backend, T);
    d.set_weights(e.params());
    const float * l = d.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 5));
    EXPECT_LT(max_rel(l, full.data() + 4 * size_t(V), V), 1e-5);
    for (int t = 5; t < T; ++t) {
        l = d.step(tokens[size_t(t)]);
        ASSERT_LT(max_rel(l, full.data() + size_t(t) * V, V), 1e-5) << "position " << t;
    }
}

TEST(Decoder, PlannedEqualsMeasuredAndTheCacheIsWhatItShouldBe) {
    CpuBackend backend;
    const ModelConfig cfg = llama_small();
    Decoder d(cfg, backend, 16);
    std::vector<float> w(d.layout().total, 0.01f);
    d.set_weights(w.data());
    d.prefill({1, 2, 3, 4, 5});
    d.step(6);
    d.prefill({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    d.step(7);
    // K and V, per layer, capacity x KVH * head_dim floats.
    EXPECT_EQ(d.kv_cache_bytes(), uint64_t(2) * cfg.n_layer * 16 * cfg.kv_heads() * cfg.head_dim() * 4);
    const CategoryBytes plan = d.planned_peak_live(), rsv = d.planned_reserved();
    for (size_t c = 0; c < kCategoryCount; ++c) {
        EXPECT_EQ(plan.v[c], d.ledger().live_peak().v[c]) << kCategoryNames[c];
        EXPECT_EQ(rsv.v[c], d.ledger().reserved_peak().v[c]) << kCategoryNames[c];
    }
    EXPECT_EQ(plan[Category::parameters], d.layout().total * 4);
    EXPECT_EQ(plan[Category::gradients], 0u);
    EXPECT_EQ(plan[Category::optimizer_states], 0u);
}

TEST(Decoder, GenerationRefillsAFullCacheAndMatchesAnUnboundedOne) {
    CpuBackend backend;
    const ModelConfig cfg = gpt2_small();
    EngineOptions eo;
    eo.B = 1;
    eo.T = 8;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(9);
    SampleOptions o;
    o.temperature = 0;   // greedy: the same logits give the same tokens
    o.max_new_tokens = 20;
    Decoder big(cfg, backend, 24), small(cfg, backend, 10);
    big.set_weights(e.params());
    small.set_weights(e.params());
    const std::vector<int32_t> prompt = {3, 1, 4};
    const auto a = generate(big, prompt, o), b = generate(small, prompt, o);
    ASSERT_EQ(a.size(), 20u);
    ASSERT_EQ(b.size(), 20u);
    // Until the small cache first fills (3 + 7 tokens), both saw the same context.
    for (size_t i = 0; i < 7; ++i) EXPECT_EQ(a[i], b[i]) << i;
    EXPECT_LE(small.position(), 10);
    EXPECT_THROW(Decoder(cfg, backend, 25), ConfigError);   // beyond the model's 24 positions
    EXPECT_THROW(small.prefill(std::vector<int32_t>(11, 1)), ConfigError);
    EXPECT_THROW(small.prefill({1, 99}), FormatError);       // outside the vocabulary
    // A stop token (a chat's end of turn) ends generation before it, and is not returned.
    o.stop = {a[5]};
    const auto stopped = generate(big, prompt, o);
    const size_t first = size_t(std::find(a.begin(), a.end(), a[5]) - a.begin());
    ASSERT_EQ(stopped.size(), first);
    EXPECT_TRUE(std::equal(stopped.begin(), stopped.end(), a.begin()));
}

// Quantized weights (`memfit generate --weights int8|nf4`): the block projections packed as a
// QLoRA base, the rest dense. The decoder computes what an fp32 decoder computes on the
// dequantized weights, and its weight bytes are the dense part plus the packed bytes, planned
// and measured alike.
TEST(Decoder, QuantizedWeightsComputeWithTheirDequantizedValues) {
    CpuBackend backend;
    for (const ModelConfig & cfg : {gpt2_small(), llama_small()})
        for (QuantFormat f : {QuantFormat::int8, QuantFormat::nf4, QuantFormat::nf4_dq}) {
            SCOPED_TRACE(cfg.family + " " + quant_format_name(f));
            const int T = 16, V = cfg.vocab_size;
            EngineOptions eo;
            eo.B = 1;
            eo.T = T;
            eo.with_eval = false;
            Engine e(cfg, backend, eo);
            e.init_params(4);
            std::vector<int32_t> tokens(T);
            for (int i = 0; i < T; ++i) tokens[size_t(i)] = (i * 13 + 2) % V;

            Decoder q(cfg, backend, 20, DType::f32, f);
            q.set_weights(e.params());
            const std::vector<float> deq = q.weights();
            // Quantization moved the projections (not far) and nothing else.
            ASSERT_EQ(deq.size(), q.layout().total);
            double err = 0, norm = 0;
            for (size_t i = 0; i < deq.size(); ++i) err += std::pow(deq[i] - e.params()[i], 2), norm += std::pow(e.params()[i], 2);
            EXPECT_GT(err, 0.0);
            EXPECT_LT(std::sqrt(err / norm), f == QuantFormat::int8 ? 0.01 : 0.12);
            for (const auto & p : q.dense_layout().params)
                for (size_t i = 0; i < p.numel; ++i)
                    ASSERT_EQ(deq[q.layout().find(p.name).offset + i], e.params()[q.layout().find(p.name).offset + i]);

            Decoder ref(cfg, backend, 20);
            ref.set_weights(deq.data());
            auto rows = [&](Decoder & d) {
                std::vector<float> out;
                const float * l = d.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 5));
                out.insert(out.end(), l, l + V);
                for (int t = 5; t < T; ++t) {
                    l = d.step(tokens[size_t(t)]);
                    out.insert(out.end(), l, l + V);
                }
                return out;
            };
            const std::vector<float> a = rows(q), b = rows(ref);
            EXPECT_LT(max_rel(a.data(), b.data(), int(a.size())), 1e-4);

            // Weight bytes: the dense part in fp32 plus the packed projections, exactly.
            const QuantLayout & ql = q.quant_layout();
            ASSERT_EQ(ql.entries.size(), size_t(4 * cfg.n_layer));
            size_t held = 0;
            for (const auto & en : ql.entries) held += size_t(en.q.out * en.q.in);
            EXPECT_EQ(q.dense_layout().total + held, size_t(cfg.num_params()));
            EXPECT_EQ(q.weight_bytes(), q.dense_layout().total * 4 + ql.bytes);
            const CategoryBytes plan = q.planned_peak_live(), rsv = q.planned_reserved();
            EXPECT_EQ(plan[Category::parameters], q.weight_bytes());
            for (size_t c = 0; c < kCategoryCount; ++c) {
                EXPECT_EQ(plan.v[c], q.ledger().live_peak().v[c]) << kCategoryNames[c];
                EXPECT_EQ(rsv.v[c], q.ledger().reserved_peak().v[c]) << kCategoryNames[c];
            }
            // Smaller than fp32: int8 about a quarter of the projections' fp32 bytes, nf4 about an eighth.
            EXPECT_LT(double(ql.bytes), double(held) * (f == QuantFormat::int8 ? 1.3 : 0.75));
        }
}

TEST(Decoder, QuantizedWeightsWithBf16Activations) {
    CpuBackend backend;
    const ModelConfig cfg = llama_small();
    EngineOptions eo;
    eo.B = 1;
    eo.T = 8;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(6);
    std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3, 8, 4};
    const std::vector<float> full = e.logits(tokens.data(), 1);
    Decoder q(cfg, backend, 8, DType::bf16, QuantFormat::int8);
    q.set_weights(e.params());
    EXPECT_EQ(q.weight_bytes(), q.dense_layout().total * 2 + q.quant_layout().bytes);
    const float * l = q.prefill(tokens);
    EXPECT_LT(max_rel(l, full.data() + size_t(7) * size_t(cfg.vocab_size), cfg.vocab_size), 0.05);
}

// Logits that are not finite (weights that overflow, here one inf in the head's input norm) stop
// generation with an error instead of text sampled from NaNs.
TEST(Decoder, NonFiniteLogitsStopGeneration) {
    const ModelConfig cfg = gpt2_small();
    CpuBackend backend;
    Decoder d(cfg, backend, 8);
    const ParamLayout & L = d.layout();
    std::vector<float> w(L.total, 0.01f);
    w[L.find("ln_f.weight").offset] = INFINITY;
    d.set_weights(w.data());
    SampleOptions o;
    o.max_new_tokens = 3;
    try {
        generate(d, {1, 2}, o, nullptr);
        ADD_FAILURE() << "generated from non-finite logits";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("the logits after 2 tokens hold"), std::string::npos) << e.what();
    }
}
