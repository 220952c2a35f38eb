// memfit plan --inference (plan/inference_plan.h): on the CPU the plan is the paged decoder's
// measured peak, byte for byte, once a full step has run (fp32, bf16 and NF4 weights); the most
// requests that fit is the largest concurrency whose plan is within the device; tensor parallelism
// splits the weights and the KV cache; the roofline's decode rate grows with the concurrency.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "infer/batch_generate.h"
#include "infer/decoder.h"
#include "plan/hardware.h"
#include "plan/inference_plan.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;

namespace {

InferenceRequest tiny_request(bool llama) {
    InferenceRequest r;
    r.cfg = memfit::test::small_family(llama, 61, 32, 2, 4, 40, 96);
    r.hw = find_hardware(default_hardware_catalog(""), "cpu");
    r.compute = DType::f32;
    r.context = 40;
    r.kv_block = 4;
    r.batched_tokens = 32;
    r.concurrency = 5;
    return r;
}

}  // namespace

TEST(InferencePlan, EqualsTheMeasuredPeakOnTheCpu) {
    struct Case { bool llama; DType dt; std::optional<QuantDesc> quant; bool int8 = false; };
    for (const Case c : {Case{false, DType::f32, {}}, Case{true, DType::bf16, {}},
                         Case{true, DType::f32, QuantDesc{QuantFormat::nf4_dq}}, Case{true, DType::bf16, {}, true}}) {
        SCOPED_TRACE(testing::Message() << (c.llama ? "llama " : "gpt2 ") << dtype_name(c.dt) << (c.quant ? " nf4" : "")
                                        << (c.int8 ? " int8 cache" : ""));
        InferenceRequest r = tiny_request(c.llama);
        r.compute = c.dt;
        r.quant = c.quant;
        r.kv_int8 = c.int8;
        CpuBackend cpu;
        const InferencePlan p = plan_inference(r, cpu);
        ASSERT_TRUE(p.fits);
        EXPECT_EQ(p.blocks, 5 * 10);
        const uint64_t KVH = uint64_t(r.cfg.kv_heads()), hd = uint64_t(r.cfg.head_dim());
        EXPECT_EQ(p.kv_per_token, uint64_t(2) * 2 * (c.int8 ? KVH * hd + 4 * KVH : KVH * hd * dtype_size(c.dt)));

        // The engine with that geometry, serving eight requests whose prompts fill a 32-row step.
        PagedKv kv;
        kv.block = 4, kv.blocks = p.blocks, kv.seqs = 8, kv.tokens = 32, kv.int8 = c.int8;
        const QuantLayout q = c.quant ? make_quant_layout(r.cfg, *c.quant) : QuantLayout{};
        Decoder d(r.cfg, cpu, kv, r.context, c.dt, q);
        EngineOptions eo;
        eo.B = 1, eo.T = 8, eo.with_eval = false;
        Engine e(r.cfg, cpu, eo);
        e.init_params(2);
        d.set_weights(e.full_params().data());
        std::vector<GenerationRequest> reqs(8);
        for (size_t i = 0; i < reqs.size(); ++i) {
            reqs[i].prompt.assign(12, int32_t(i + 1));
            reqs[i].sample.temperature = 0;
            reqs[i].sample.max_new_tokens = 4;
        }
        BatchStats st;
        generate_batch(d, reqs, {}, &st);
        EXPECT_EQ(d.ledger().live_peak().total(), p.bytes.total());
        EXPECT_EQ(d.kv_cache_bytes(), p.kv_pool);
        EXPECT_EQ(d.weight_bytes(), p.weights);
    }
}

TEST(InferencePlan, LargestConcurrencyIsTheMostThatFit) {
    InferenceRequest r = tiny_request(true);
    CpuBackend cpu;
    r.concurrency = 0;
    r.hw.usable = 2u << 20;   // 2 MiB
    const InferencePlan most = plan_inference(r, cpu);
    ASSERT_GT(most.max_concurrency, 1);
    EXPECT_EQ(most.concurrency, most.max_concurrency);
    EXPECT_TRUE(most.fits);
    r.concurrency = most.max_concurrency + 1;
    const InferencePlan over = plan_inference(r, cpu);
    EXPECT_FALSE(over.fits);
    EXPECT_GT(over.bytes.total(), r.hw.usable);
    EXPECT_GT(over.decode_tokens_per_s, most.decode_tokens_per_s * 0.99);
    r.hw.usable = 1000;
    EXPECT_EQ(plan_inference(r, cpu).max_concurrency, 0);
}

TEST(InferencePlan, TensorParallelSplitsWeightsAndCache) {
    InferenceRequest r;
    r.cfg = memfit::test::small_family(true, 64, 64, 2, 8, 128, 256);
    r.hw = find_hardware(default_hardware_catalog(""), "h100-80g");
    r.context = 256;
    r.concurrency = 4;
    CpuBackend cpu;
    const InferencePlan one = plan_inference(r, cpu);
    r.tp = 2;
    const InferencePlan two = plan_inference(r, cpu);
    EXPECT_EQ(two.kv_per_token * 2, one.kv_per_token);
    EXPECT_LT(two.weights, one.weights * 0.6);
    EXPECT_GT(two.weights, one.weights * 0.4);
    r.tp = 3;   // 8 heads do not split over 3
    EXPECT_THROW(plan_inference(r, cpu), ConfigError);
    r.tp = 1;
    r.context = 300;   // past the model's 256 positions
    EXPECT_THROW(plan_inference(r, cpu), ConfigError);
}
