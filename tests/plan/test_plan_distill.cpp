// The planner with a distillation teacher (--teacher; plan/distill_plan.h): the exact plan of a
// candidate is the engine's program with the teacher in it (planned == measured per category,
// the `teacher` category the teacher's weights exactly, dense and packed); the analytic model
// (the search's) gives the same `teacher` bytes and activations close to the exact ones; the
// time model adds the teacher's forward.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/config.h"
#include "plan/distill_plan.h"
#include "plan/fit.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

TEST(PlanDistill, ExactAnalyticAndTime) {
    CpuBackend backend;
    Hardware cpu = test::h100_like();
    cpu.name = "cpu";
    cpu.usable = cpu.memory;
    ModelConfig cfg = model_preset("nano");
    cfg.vocab_size = 256;
    for (const char * weights : {"compute", "nf4"}) {
        SCOPED_TRACE(weights);
        Candidate c;
        c.micro_batch = 2;
        c.compute = DType::bf16;
        c.loss_chunk = 64;
        RunConfig run = c;
        run.seq = 64;
        run.distill.teacher = "micro";   // a preset: its vocabulary is the student's
        run.distill.weights = weights;
        c.distill_plan = make_distill_plan(run, distill_options(run, cfg, c.compute));
        ASSERT_TRUE(c.distill_plan);
        const DeviceMemory plan = exact_memory(cfg, cpu, c, 64, backend);

        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.loss_chunk = 64;
        eo.flash_attention = c.flash();
        eo.distill = c.distill_plan->opts;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(128), tg(128);
        test::random_batch(in, tg, cfg.vocab_size, 1);
        e.train_step(in.data(), tg.data(), OptimHyper{});
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            if (Category(cat) == Category::runtime) continue;
            EXPECT_EQ(plan.device.v[cat], e.ledger().live_peak().v[cat]) << kCategoryNames[cat];
        }
        ModelConfig teacher = model_preset("micro");
        teacher.vocab_size = 256;
        const uint64_t dense = uint64_t(teacher.num_params()) * 2;
        if (std::string(weights) == "compute") EXPECT_EQ(plan.device[Category::teacher], dense);
        else EXPECT_LT(plan.device[Category::teacher], dense / 2);

        const DeviceMemory approx = predict_memory(cfg, cpu, c, 64);
        EXPECT_EQ(approx.device[Category::teacher], plan.device[Category::teacher]);
        const double acts = double(approx.device[Category::activations]) / double(plan.device[Category::activations]);
        EXPECT_GT(acts, 0.8);
        EXPECT_LT(acts, 1.7);

        Candidate alone = c;
        alone.distill_plan = nullptr;
        const StepTime with = predict_step_time(cfg, test::h100_like(), c, 64, 1);
        const StepTime without = predict_step_time(cfg, test::h100_like(), alone, 64, 1);
        // micro's forward has about 3.5x nano's parameters: more than the student's forward and
        // backward together (3x its forward).
        EXPECT_GT(with.compute, 1.8 * without.compute);
        EXPECT_EQ(predict_memory(cfg, cpu, alone, 64).device[Category::teacher], 0u);
    }
}

}  // namespace
}  // namespace memfit
