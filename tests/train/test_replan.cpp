// Run-time re-planning: an allocation that fails mid-step (injected) or a budget lowered through
// the control file makes the run continue with half the micro-batch and twice the accumulation;
// no progress is lost and the parameters equal a run that switched at that step on purpose.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "memory/budget.h"
#include "memory/step_memory.h"
#include "train/replan.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::random_batch;
using memfit::test::small_config;

namespace {

constexpr int V = 67, G = 4, T = 16, kSteps = 5;

EngineOptions start_options() {
    EngineOptions eo;
    eo.B = G;
    eo.T = T;
    eo.with_eval = false;
    eo.flash_attention = true;
    return eo;
}

const OptimHyper kHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};

}  // namespace

TEST(Replan, InjectedAllocationFailureRedoesTheStepWithHalfTheMicroBatch) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, 32, 2, 2);
    std::vector<int32_t> in(size_t(G * T)), tg(in.size());
    std::vector<float> result[2];
    for (int run = 0; run < 2; ++run) {
        auto engine = std::make_unique<Engine>(cfg, backend, start_options());
        engine->init_params(3);
        std::vector<std::string> notes;
        for (int step = 1; step <= kSteps; ++step) {
            random_batch(in, tg, V, uint64_t(step));
            if (step == 3) {
                if (run == 0) inject_acquire_failure(40);   // the 41st buffer step 3 acquires fails
                else rebuild_engine(engine, cfg, backend, *halve_micro_batch(engine->options()));
            }
            const StepResult r = resilient_step(engine, cfg, backend, in.data(), tg.data(), kHyper, notes);
            EXPECT_TRUE(std::isfinite(r.loss));
        }
        inject_acquire_failure(-1);
        EXPECT_EQ(engine->options().B, G / 2);
        EXPECT_EQ(engine->options().grad_accum, 2);
        EXPECT_EQ(engine->steps_done(), kSteps);   // no step lost, none repeated
        if (run == 0) {
            ASSERT_EQ(notes.size(), 1u);
            EXPECT_NE(notes[0].find("(injected)"), std::string::npos) << notes[0];
            EXPECT_NE(notes[0].find("redid step 3"), std::string::npos) << notes[0];
        } else {
            EXPECT_TRUE(notes.empty());
        }
        result[run].assign(engine->params(), engine->params() + engine->step().layout().total);
    }
    EXPECT_EQ(0, std::memcmp(result[0].data(), result[1].data(), result[0].size() * 4));
}

TEST(Replan, InjectedFailureAtMicroBatchOneIsAClearError) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, 32, 2, 2);
    EngineOptions eo = start_options();
    eo.B = 1;
    auto engine = std::make_unique<Engine>(cfg, backend, eo);
    engine->init_params(3);
    std::vector<int32_t> in(static_cast<size_t>(T)), tg(in.size());
    random_batch(in, tg, V, 1);
    std::vector<std::string> notes;
    inject_acquire_failure(0);
    EXPECT_THROW(resilient_step(engine, cfg, backend, in.data(), tg.data(), kHyper, notes), OutOfMemory);
    inject_acquire_failure(-1);
}

TEST(Replan, LoweredBudgetFileShrinksTheMicroBatch) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, 32, 2, 2);
    auto engine = std::make_unique<Engine>(cfg, backend, start_options());
    engine->init_params(3);
    const uint64_t full = engine->planned_reserved().total();
    EngineOptions quarter = start_options();
    quarter.B = G / 4;
    quarter.grad_accum = 4;
    const uint64_t need_quarter = StepPlans(cfg, backend, quarter).reserved().total();
    ASSERT_LT(need_quarter, full);

    const std::string path = ::testing::TempDir() + "memfit_budget_" + std::to_string(::getpid());
    BudgetFile file(path);
    EXPECT_FALSE(file.poll());   // absent: nothing to do
    std::ofstream(path) << need_quarter << "\n";
    const auto b = file.poll();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(*b, need_quarter);
    EXPECT_FALSE(file.poll());   // unchanged text: polled once

    std::vector<std::string> notes;
    const std::vector<float> before(engine->params(), engine->params() + engine->step().layout().total);
    shrink_to_budget(engine, cfg, backend, *b, notes);
    EXPECT_EQ(engine->options().B, G / 4);
    EXPECT_EQ(engine->options().grad_accum, 4);
    EXPECT_LE(engine->planned_reserved().total(), *b);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(0, std::memcmp(before.data(), engine->params(), before.size() * 4));   // state carried over

    std::vector<std::string> more;
    EXPECT_THROW(shrink_to_budget(engine, cfg, backend, need_quarter / 4, more), OutOfMemory);

    std::ofstream(path) << "lots\n";
    EXPECT_THROW(file.poll(), ConfigError);
    std::remove(path.c_str());
}
