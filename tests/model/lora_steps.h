// What the LoRA and DoRA model tests share: their engine options, and two steps whose every
// category's bytes are the plan's.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "test_util.h"
#include "train/engine.h"

namespace memfit::test {

// B x T, flash attention, the compute dtype and the recompute plan, LoRA options `lora`.
inline EngineOptions lora_engine_options(int B, int T, const LoraOptions & lora, DType dt = DType::f32,
                                         const RecomputePlan & rc = {}) {
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.flash_attention = true;
    eo.compute = dt;
    eo.recompute = rc;
    eo.lora = lora;
    return eo;
}

// Two training steps on random B x T batches, each followed by an evaluation; then every
// category's planned peak and reserved bytes against the ledger's. Returns the parameters after.
inline std::vector<float> two_steps_as_planned(Engine & e, int vocab, int B, int T) {
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    for (int s = 0; s < 2; ++s) {
        random_batch(in, tg, vocab, uint64_t(s));
        e.train_step(in.data(), tg.data(), OptimHyper{});
        e.eval_loss(in.data(), tg.data());
    }
    const CategoryBytes plan = e.planned_peak_live(), rsv = e.planned_reserved();
    for (size_t k = 0; k < kCategoryCount; ++k) {
        EXPECT_EQ(plan.v[k], e.ledger().live_peak().v[k]) << kCategoryNames[k];
        EXPECT_EQ(rsv.v[k], e.ledger().reserved_peak().v[k]) << kCategoryNames[k];
    }
    return std::vector<float>(e.params(), e.params() + e.step().layout().total);
}

}  // namespace memfit::test
