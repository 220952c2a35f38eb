// --optimizer-in-backward: each layer's update runs as its backward finishes and its gradients
// live only from that backward to that update. For every optimizer row, in fp32 and bf16, with and
// without LoRA, the weights, moments and losses after a few steps equal the unfused step's bit for
// bit (the same kernels on the same gradients); the planned gradients are the rest's buckets plus
// the largest layer's, planned = measured; and what cannot run fused is one clear line.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/param_layout.h"
#include "run/compat.h"
#include "train/engine.h"
#include "optim_ops.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::random_batch;
using test::small_config;

struct Trained {
    std::vector<float> losses;
    TrainState state;
    CategoryBytes planned, measured;
    size_t expected_grads = 0;   // the rest's parameters plus the largest layer's, in gradient bytes
};

Trained train(const ModelConfig & cfg, Optimizer o, DType compute, bool fused, int lora_rank) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false, eo.compute = compute, eo.optimizer = o;
    eo.optimizer_in_backward = fused;
    eo.galore_rank = 8;   // GaLore projects the 32-wide matrices
    if (lora_rank > 0) eo.lora = test::lora_options(cfg, lora_rank);
    Engine e(cfg, backend, eo);
    e.init_params(3);
    Trained r;
    OptimHyper h{3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    for (int s = 0; s < 3; ++s) {
        std::vector<int32_t> in(32), tg(32);
        random_batch(in, tg, cfg.vocab_size, 40 + uint64_t(s));
        h.t = s + 1;
        r.losses.push_back(e.train_step(in.data(), tg.data(), h).loss);
    }
    r.state = e.export_state();
    r.planned = e.planned_peak_live();
    r.measured = e.ledger().live_peak();
    std::map<int, size_t> per_block;
    for (const auto & p : e.step().layout().params) per_block[param_block(p.name)] += p.numel;
    size_t largest = 0;
    for (const auto & [b, n] : per_block)
        if (b >= 0) largest = std::max(largest, n);
    r.expected_grads = (per_block[-1] + largest) * dtype_size(e.step().grad_dtype());
    return r;
}

TEST(OptimizerInBackward, EqualsTheUnfusedStepAndKeepsOneLayersGradients) {
    for (const bool llama : {false, true}) {
        const ModelConfig cfg = test::small_family(llama, 64, 32, 4, 2, 48);
        for (const Optimizer o : {Optimizer::adamw, Optimizer::adamw_bf16, Optimizer::adamw_8bit, Optimizer::sgd,
                                  Optimizer::adafactor, Optimizer::galore_adamw})
            for (const DType compute : {DType::f32, DType::bf16})
                for (const int lora : {0, 4}) {
                    if (lora && o != Optimizer::adamw) continue;
                    SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + optimizer_name(o) + " " + std::string(
                                 dtype_name(compute)) + (lora ? " lora" : ""));
                    const Trained a = train(cfg, o, compute, false, lora), b = train(cfg, o, compute, true, lora);
                    EXPECT_EQ(a.losses, b.losses);
                    EXPECT_TRUE(a.state.params == b.state.params) << "the weights differ";
                    EXPECT_TRUE(a.state.m == b.state.m && a.state.v == b.state.v) << "the moments differ";
                    const size_t g = size_t(Category::gradients);
                    EXPECT_EQ(b.planned.v[g], b.expected_grads);
                    EXPECT_LT(b.planned.v[g], a.planned.v[g]);
                    EXPECT_EQ(b.planned.total(), b.measured.total());
                    EXPECT_EQ(b.planned.v[g], b.measured.v[g]);
                }
    }
}

TEST(OptimizerInBackward, RefusesWhatNeedsTheWholeGradient) {
    const ModelConfig cfg = small_config(64, 32, 2, 2);
    auto refusal = [&](auto edit) {
        RunConfig r;
        r.optimizer_in_backward = true;
        edit(r);
        return test::refusal(r, cfg);
    };
    EXPECT_NE(refusal([](RunConfig & r) { r.clip = 1.0f; }).find("--clip 1"), std::string::npos);
    EXPECT_NE(refusal([](RunConfig & r) { r.grad_accum = 4; }).find("--grad-accum 4"), std::string::npos);
    EXPECT_NE(refusal([](RunConfig & r) { r.layout.tp = 2; }).find("--tp 2"), std::string::npos);
    EXPECT_NE(refusal([](RunConfig & r) { r.compute = DType::f16; }).find("fp16"), std::string::npos);
    EXPECT_NE(refusal([](RunConfig & r) { r.layout.pp = 2; }).find("--pp 2"), std::string::npos);
    for (const int zero : {1, 2, 3}) EXPECT_EQ(refusal([&](RunConfig & r) { r.layout.zero = zero; }), "");
    // The engine itself, asked directly.
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.optimizer_in_backward = true, eo.grad_accum = 2;
    EXPECT_THROW(Engine(cfg, backend, eo), ConfigError);
}

}  // namespace
}  // namespace memfit
