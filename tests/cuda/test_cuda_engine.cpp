// The engine on the CUDA backend: training steps equal the CPU backend's (fp32 to rounding, bf16
// within bf16 bounds), the plan equals what the step acquires, checking mode changes nothing,
// and the device memory cudaMemGetInfo sees is the plan's regions plus the measured runtime.
// Without a GPU: `--device cuda` is one clear error.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cuda/op_check.h"
#include "model/config.h"
#include "model/recompute.h"
#include "test_util.h"
#include "train/engine.h"

namespace memfit {
namespace {

struct Trained {
    std::vector<float> losses, params;
    CategoryBytes planned_live, measured_live;
};

Trained train(Backend & backend, const ModelConfig & cfg, EngineOptions eo, int steps) {
    Engine engine(cfg, backend, eo);
    engine.init_params(7);
    AdamWHyper h;
    h.lr = 1e-3f;
    h.weight_decay = 0.1f;
    h.clip = 1.0f;
    Trained r;
    const size_t n = size_t(eo.B) * size_t(eo.T) * size_t(eo.grad_accum);
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(n), tg(n);
        test::random_batch(in, tg, cfg.vocab_size, 100 + uint64_t(s));
        r.losses.push_back(engine.train_step(in.data(), tg.data(), h).loss);
    }
    r.params = engine.full_params();
    r.planned_live = engine.planned_peak_live();
    r.measured_live = engine.ledger().live_peak();
    return r;
}

double rel_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(a[i])));
    }
    return num / (den > 0 ? den : 1);
}

struct Case { bool llama; DType dt; bool flash; const char * recompute; int accum; };

TEST(CudaEngine, TrainingStepsMatchTheCpuBackend) {
    MF_REQUIRE_GPU();
    const Case cases[] = {{false, DType::f32, false, "none", 1}, {false, DType::f32, true, "full", 2},
                          {true, DType::f32, true, "selective", 1}, {false, DType::bf16, true, "none", 1},
                          {true, DType::bf16, false, "full", 2}};
    for (const Case & c : cases) {
        SCOPED_TRACE(std::string(c.llama ? "llama" : "gpt2") + " " + std::string(dtype_name(c.dt)) +
                     (c.flash ? " flash " : " naive ") + c.recompute + " accum " + std::to_string(c.accum));
        const ModelConfig cfg = test::small_family(c.llama, 96, 128, 2, 4, 256, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = c.dt, eo.flash_attention = c.flash;
        eo.grad_accum = c.accum;
        eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol_loss = c.dt == DType::f32 ? 1e-4 : 2e-2, tol_params = c.dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol_loss) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), tol_params);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

TEST(CudaEngine, CheckingModeGivesBitwiseEqualResults) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    EngineOptions eo;
    eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = true;
    const Trained a = train(*test::gpu(), cfg, eo, 2);
    eo.checking = true;
    const Trained b = train(*test::gpu(), cfg, eo, 2);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.params, b.params);
}

// GPT-2 124M in bf16: the regions the plan reserves plus the runtime measured at start-up equal
// the device memory this process uses (cudaMemGetInfo) within 2%.
TEST(CudaEngine, PlannedReservedPlusRuntimeMatchesCudaMemGetInfo) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = model_preset("gpt2");
    EngineOptions eo;
    eo.B = 8, eo.T = 1024, eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = true;
    CudaBackend & g = *test::gpu();
    Engine engine(cfg, g, eo);
    engine.init_params(1);
    std::vector<int32_t> in(size_t(eo.B) * size_t(eo.T)), tg(in.size());
    test::random_batch(in, tg, cfg.vocab_size, 3);
    engine.train_step(in.data(), tg.data(), AdamWHyper{});
    g.synchronize();
    const double predicted = double(engine.planned_reserved().total() + g.runtime_bytes());
    const double measured = double(g.device_used_delta());
    EXPECT_LT(std::fabs(predicted - measured) / measured, 0.02)
        << "planned reserved " << engine.planned_reserved().total() << " + runtime " << g.runtime_bytes()
        << " vs used " << measured;
}

TEST(CudaCli, DeviceCudaWithoutAGpuIsOneClearError) {
    std::string why;
    if (test::gpu(&why)) GTEST_SKIP() << "a GPU is present: the error path cannot be reached";
    const std::string out = std::string(::testing::TempDir()) + "memfit_cuda_cli.txt";
    const std::string cmd = std::string(MEMFIT_BINARY) + " train --device cuda --steps 1 --out " +
                            ::testing::TempDir() + "memfit_cuda_run >" + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_NE(WEXITSTATUS(status), 0);
    std::ifstream f(out);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("--device cuda: no CUDA device"), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

}  // namespace
}  // namespace memfit
