// --attention auto | flash | naive, resolved against the backend: the CUDA flash kernels take
// head dimensions 32, 64, 96 and 128 (cuda_sizing.h answers for them in every build), the CPU's
// any. auto picks flash where it runs and says so where it does not; an explicit flash the
// backend cannot run is one clear error, before any memory is reserved; --fit auto searches
// only what runs.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "core/error.h"
#include "train/engine.h"
#include "plan/fit.h"
#include "test_util.h"

namespace memfit {
namespace {

RunConfig shape(const std::string & attention, uint64_t budget = 0) {
    RunConfig s;
    s.micro_batch = 2;
    s.grad_accum = 1;
    s.seq = 32;
    s.attention = parse_attention(attention);
    s.budget = budget;
    return s;
}

TEST(AttentionChoice, AutoIsFlashWhereTheBackendRunsItAndNaiveWithANoteElsewhere) {
    const ModelConfig hd16 = test::small_config(96, 64, 2, 4), hd32 = test::small_config(96, 128, 2, 4);
    ASSERT_EQ(hd16.head_dim(), 16);
    ASSERT_EQ(hd32.head_dim(), 32);
    CpuBackend cpu;
    const auto gpu = make_cuda_sizing_backend();
    EXPECT_TRUE(resolve_run(shape("auto"), hd16, cpu, false).eo.flash_attention);
    EXPECT_TRUE(resolve_run(shape("auto"), hd32, *gpu, false).eo.flash_attention);
    const ResolvedRun r = resolve_run(shape("auto"), hd16, *gpu, false);
    EXPECT_FALSE(r.eo.flash_attention);
    ASSERT_FALSE(r.notes.empty());
    EXPECT_EQ(r.notes.back(),
              "attention: naive (the CUDA flash-attention kernels take head dimensions 32, 64, 96 and 128, not 16)");
    EXPECT_FALSE(resolve_run(shape("naive"), hd32, *gpu, false).eo.flash_attention);
}

TEST(AttentionChoice, ExplicitFlashTheBackendCannotRunIsOneClearError) {
    const ModelConfig hd16 = test::small_config(96, 64, 2, 4);
    const auto gpu = make_cuda_sizing_backend();
    const EngineOptions eo = resolve_run(shape("flash"), hd16, *gpu, false).eo;
    ASSERT_TRUE(eo.flash_attention);
    try {
        const StepPlans plans(hd16, *gpu, eo);
        FAIL() << "flash attention with head dim 16 was planned for the CUDA backend";
    } catch (const ConfigError & e) {
        EXPECT_STREQ(e.what(), "--attention flash: the CUDA flash-attention kernels take head dimensions 32, 64, 96 "
                               "and 128, not 16; use --attention naive");
    }
    EXPECT_NO_THROW(StepPlans(hd16, CpuBackend(), eo));
    EXPECT_THROW(resolve_run(shape("tiled"), hd16, *gpu, false), ConfigError);
}

TEST(AttentionChoice, FitAutoSearchesOnlyAttentionTheBackendRuns) {
    const ModelConfig hd16 = test::small_config(96, 64, 2, 4);
    RunConfig s = shape("auto", uint64_t(1) << 30);
    s.fit_auto = true;
    s.precision_auto = true;
    const auto gpu = make_cuda_sizing_backend();
    EXPECT_FALSE(resolve_run(s, hd16, *gpu, false).eo.flash_attention);
    CpuBackend cpu;
    EXPECT_TRUE(resolve_run(s, hd16, cpu, false).eo.flash_attention);   // the time model rates it faster
}

// `--fit auto --precision auto` rates 16-bit gemms at the backend's measured speed (on a CPU,
// backend/cpu/bf16_path.h): where bf16 gemms run at a third of fp32's it keeps fp32, where they
// run at three times it takes bf16.
TEST(AttentionChoice, PrecisionAutoFollowsTheMeasuredBf16Speed) {
    struct Measured : CpuBackend {
        explicit Measured(double s) : speed(s) {}
        double lowp_gemm_speed() const override { return speed; }
        double speed;
    };
    const ModelConfig cfg = test::small_config(512, 256, 2, 4);
    RunConfig s = shape("auto", uint64_t(1) << 30);
    s.seq = 64;
    s.fit_auto = true;
    s.precision_auto = true;
    EXPECT_EQ(resolve_run(s, cfg, Measured(1.0 / 3), false).eo.compute, DType::f32);
    EXPECT_EQ(resolve_run(s, cfg, Measured(3.0), false).eo.compute, DType::bf16);
}

}  // namespace
}  // namespace memfit
