// --sparsity N:M in the engine: dense until `start` updates are in, then the block projections are
// pruned by magnitude and stay N:M after every later step, for every optimizer path (fp32, mixed
// precision's master weights, bf16-sr, bf16 and 8-bit moments, SGD, weight decay, accumulation,
// ZeRO in one process, offloaded states, a resumed engine): the zeros never move, the kept weights
// train, the pruned weights' moments are zero; and the plan stays exact (no buffer is added).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/sparsity.h"
#include "train/engine.h"
#include "test_util.h"
#include "optim_ops.h"

namespace memfit {
namespace {

struct Case {
    const char * name;
    bool llama = false;
    DType compute = DType::f32, moments = DType::f32;
    int accum = 1, zero = 0;
    bool sr = false, sgd = false, offload = false;
    int resume_at = 0;   // > 0: the state moves to a fresh engine after this many steps
};

// The zeros of the targets, as a mask over the flat weights.
std::vector<bool> target_zeros(const ParamLayout & layout, const std::vector<float> & w) {
    std::vector<bool> z(w.size(), false);
    for (const auto & p : layout.params)
        if (sparse_target(p.name))
            for (size_t i = p.offset; i < p.offset + p.numel; ++i) z[i] = w[i] == 0.0f;
    return z;
}

void check(const Case & c) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = test::small_family(c.llama, 64, 32, 2, 4, 48);
    const ParamLayout layout = make_param_layout(cfg);
    const NmSparsity pattern{2, 4, 2};
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false, eo.compute = c.compute, eo.optimizer = test::optimizer_for(c.moments, c.sgd);
    eo.grad_accum = c.accum, eo.zero = c.zero, eo.sr_master = c.sr;
    eo.sparsity = pattern;
    if (c.offload) {
        const auto dir = std::filesystem::path(::testing::TempDir()) / ("memfit_sparse." + std::to_string(getpid()));
        std::filesystem::create_directories(dir);
        eo.offload = 1.0, eo.offload_dir = dir.string(), eo.offload_unit = 256;   // many units
    }
    CpuBackend backend;
    auto engine = std::make_unique<Engine>(cfg, backend, eo);
    engine->init_params(5);
    OptimHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};   // weight decay 0.1 pulls every weight
    h.clip = 1.0f;
    std::vector<float> prev = engine->full_params(), pruned;
    std::vector<bool> zeros;
    const size_t n = size_t(eo.B) * size_t(eo.T) * size_t(eo.grad_accum);
    for (int s = 1; s <= 6; ++s) {
        if (s - 1 == c.resume_at && c.resume_at > 0) {
            const TrainState mid = engine->export_state();
            engine = std::make_unique<Engine>(cfg, backend, eo);
            engine->import_state(mid);
        }
        if (s == pattern.start + 1) {   // what the prune before this step must give
            pruned = prev;
            prune_nm(cfg, layout, pruned.data(), pattern);
            zeros = target_zeros(layout, pruned);
        }
        std::vector<int32_t> in(n), tg(n);
        test::random_batch(in, tg, cfg.vocab_size, 40 + uint64_t(s));
        const StepResult r = engine->train_step(in.data(), tg.data(), h);
        ASSERT_FALSE(r.skipped);
        const std::vector<float> w = engine->full_params();
        if (s <= pattern.start) {   // the dense warm-up
            EXPECT_GT(nm_violations(cfg, layout, w.data(), pattern), 0u) << "step " << s;
            prev = w;
            continue;
        }
        ASSERT_EQ(nm_violations(cfg, layout, w.data(), pattern), 0u) << "step " << s;
        // The zeros are the prune's, exactly: none moved, none appeared (the kept weights train on).
        ASSERT_TRUE(target_zeros(layout, w) == zeros) << "step " << s;
        size_t moved = 0, kept = 0;
        for (const auto & p : layout.params)
            for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
                if (!sparse_target(p.name) || zeros[i]) continue;
                ++kept;
                moved += w[i] != prev[i];
            }
        EXPECT_GT(moved, kept * 9 / 10) << "step " << s << ": the kept weights train";
        // The pruned weights' moments are zero (SGD: its momentum; no second moment).
        const TrainState st = engine->export_state();
        ASSERT_EQ(st.offset, 0u);
        for (size_t i = 0; i < zeros.size(); ++i)
            if (zeros[i]) {
                ASSERT_TRUE(st.m[i] == 0.0f && st.v[i] == 0.0f) << "element " << i << " step " << s;
            }
        prev = w;
    }
    // Planned == measured: the masked updates add no buffer.
    for (size_t k = 0; k < kCategoryCount; ++k) {
        EXPECT_EQ(engine->planned_peak_live().v[k], engine->ledger().live_peak().v[k]) << kCategoryNames[k];
        EXPECT_EQ(engine->planned_reserved().v[k], engine->ledger().reserved_peak().v[k]) << kCategoryNames[k];
    }
}

TEST(Sparsity, PatternHoldsAfterEveryStepFp32) {
    check({"gpt2 fp32"});
    check({"llama fp32", true});
    check({"gpt2 fp32, accumulated", false, DType::f32, DType::f32, 2});
}

TEST(Sparsity, PatternHoldsAfterEveryStepBf16) {
    check({"gpt2 bf16 with fp32 masters", false, DType::bf16});
    check({"llama bf16, accumulated", true, DType::bf16, DType::f32, 2});
    check({"gpt2 bf16-sr", false, DType::bf16, DType::f32, 1, 0, true});
}

TEST(Sparsity, PatternHoldsWithEveryOptimizerState) {
    check({"bf16 moments", false, DType::f32, DType::bf16});
    check({"8-bit moments", true, DType::bf16, DType::u8});
    check({"8-bit moments, bf16-sr", false, DType::bf16, DType::u8, 1, 0, true});
    check({"sgd", false, DType::f32, DType::f32, 1, 0, false, true});
}

TEST(Sparsity, PatternHoldsWithZeroOffloadAndResume) {
    check({"zero 1", false, DType::bf16, DType::f32, 1, 1});
    check({"zero 3, accumulated", true, DType::f32, DType::f32, 2, 3});
    check({"offloaded states", false, DType::bf16, DType::f32, 1, 0, false, false, true});
    check({"resumed after the prune", true, DType::bf16, DType::f32, 1, 0, false, false, false, 4});
    check({"resumed before the prune", false, DType::f32, DType::f32, 1, 0, false, false, false, 1});
}

TEST(Sparsity, RefusedWithLora) {
    const ModelConfig cfg = test::small_family(true, 64, 32, 2, 4, 48);
    EngineOptions eo;
    eo.B = 2, eo.T = 16;
    eo.lora = test::lora_options(cfg, 4);
    eo.sparsity = NmSparsity{2, 4};
    CpuBackend backend;
    try {
        Engine e(cfg, backend, eo);
        FAIL() << "LoRA with --sparsity was accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("LoRA"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace memfit
