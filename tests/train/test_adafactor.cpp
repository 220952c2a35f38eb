// --optimizer adafactor: the kernel's steps against a float64 reference written with
// python3-torch from the paper's algorithm (tests/data/make_adafactor_fixture.py: a factored
// matrix, a vector, a one-row matrix, three steps, the second's update clipped; the matrix with a
// first moment, --adafactor-beta1 0.9); in the engine,
// its states are a row and a column statistic per matrix, planned = measured, and a resume from
// the exported state continues bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::host_view;

TEST(Adafactor, MatchesTheFloat64Reference) {
    std::ifstream in(std::string(MEMFIT_TEST_DATA) + "/adafactor_reference.json");
    ASSERT_TRUE(in.good());
    const nlohmann::json ref = nlohmann::json::parse(in);
    CpuBackend be;
    for (const auto & c : ref["cases"]) {
        SCOPED_TRACE(c["name"].get<std::string>());
        const std::vector<int64_t> shape = c["shape"].get<std::vector<int64_t>>();
        const int64_t rows = shape.size() == 2 ? shape[0] : 1, cols = shape.back();
        std::vector<float> p = c["init"].get<std::vector<float>>();
        std::vector<float> stat(factored_len(rows, cols), 0.0f), m(size_t(rows * cols), 0.0f);
        const float beta1 = c["beta1"].get<float>();   // > 0: the first moment's case
        for (size_t t = 0; t < 3; ++t) {
            std::vector<float> g = c["grads"][t].get<std::vector<float>>();
            OptimHyper h;
            h.lr = ref["lr"].get<float>(), h.weight_decay = c["weight_decay"].get<float>(), h.t = int(t + 1);
            h.decay_rate = ref["decay_rate"].get<float>(), h.clip_threshold = ref["clip_threshold"].get<float>();
            h.adafactor_beta1 = beta1;
            Tensor pv = host_view(p, DType::f32), gv = host_view(g, DType::f32);
            if (shape.size() == 2) pv = pv.view(0, {rows, cols}), gv = gv.view(0, {rows, cols});
            OptimizerStates st{{host_view(stat, DType::f32)}};
            if (beta1 > 0) st.t[1] = host_view(m, DType::f32);
            be.optimizer_step(Optimizer::adafactor, pv, gv, st, Tensor{}, Tensor{}, h);
            const std::vector<double> want = c["after"][t].get<std::vector<double>>();
            for (size_t i = 0; i < p.size(); ++i)
                ASSERT_NEAR(p[i], want[i], 2e-6 * (1.0 + std::fabs(want[i]))) << "step " << t + 1 << " element " << i;
        }
    }
}

TEST(Adafactor, EngineStatesArePlannedAndResumeBitwise) {
    const ModelConfig cfg = test::small_family(true, 64, 32, 2, 2, 48);
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false, eo.optimizer = Optimizer::adafactor;
    auto batch = [&](int s, std::vector<int32_t> & in, std::vector<int32_t> & tg) {
        in.resize(32), tg.resize(32);
        test::random_batch(in, tg, cfg.vocab_size, 90 + uint64_t(s));
    };
    const OptimHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    Engine a(cfg, backend, eo);
    a.init_params(5);
    std::vector<int32_t> in, tg;
    float first = 0, last = 0;
    batch(0, in, tg);
    for (int s = 0; s < 6; ++s) {   // one batch, learnt
        OptimHyper hs = h;
        hs.t = s + 1;
        last = a.train_step(in.data(), tg.data(), hs).loss;
        if (s == 0) first = last;
    }
    EXPECT_LT(last, first);
    // A row and a column statistic per matrix, one per element of a vector, nothing else.
    size_t want = 0;
    for (const auto & p : a.step().moment_pieces()) want += factored_len(p.rows, p.cols) * 4;
    EXPECT_EQ(a.planned_peak_live()[Category::optimizer_states], want);
    EXPECT_EQ(a.ledger().live_peak()[Category::optimizer_states], want);
    EXPECT_EQ(a.planned_peak_live().total(), a.ledger().live_peak().total());
    EXPECT_LT(want * 10, a.step().layout().total * 4);   // tiny matrices: R + C is 6% of 32 x 32
    // Exported (the statistics at the start of each matrix's range of v), imported, continued.
    const TrainState saved = a.export_state();
    Engine b(cfg, backend, eo);
    b.init_params(6);
    b.import_state(saved);
    batch(6, in, tg);
    OptimHyper hs = h;
    hs.t = 7;
    EXPECT_EQ(a.train_step(in.data(), tg.data(), hs).loss, b.train_step(in.data(), tg.data(), hs).loss);
    EXPECT_TRUE(a.export_state().params == b.export_state().params);
    EXPECT_TRUE(a.export_state().v == b.export_state().v);
}

TEST(Adafactor, FirstMomentIsPlannedAndResumesBitwise) {
    const ModelConfig cfg = test::small_family(false, 64, 32, 2, 2, 48);
    CpuBackend backend;
    auto engine_opts = [&](bool first) {
        EngineOptions eo;
        eo.B = 2, eo.T = 16, eo.with_eval = false, eo.optimizer = Optimizer::adafactor;
        eo.adafactor_first_moment = first;
        return eo;
    };
    Engine plain(cfg, backend, engine_opts(false)), a(cfg, backend, engine_opts(true));
    const size_t P = a.step().layout().total;
    // The first moment: 4 bytes a parameter beside the statistics, planned = measured.
    EXPECT_EQ(a.planned_peak_live()[Category::optimizer_states],
              plain.planned_peak_live()[Category::optimizer_states] + P * 4);
    a.init_params(5);
    OptimHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    h.adafactor_beta1 = 0.9f;
    std::vector<int32_t> in(32), tg(32);
    for (int s = 0; s < 3; ++s) {
        test::random_batch(in, tg, cfg.vocab_size, 70 + uint64_t(s));
        h.t = s + 1;
        a.train_step(in.data(), tg.data(), h);
    }
    EXPECT_EQ(a.ledger().live_peak()[Category::optimizer_states], a.planned_peak_live()[Category::optimizer_states]);
    const TrainState saved = a.export_state();
    ASSERT_EQ(saved.m.size(), P);
    EXPECT_TRUE(std::any_of(saved.m.begin(), saved.m.end(), [](float x) { return x != 0.0f; }));
    Engine b(cfg, backend, engine_opts(true));
    b.init_params(6);
    b.import_state(saved);
    test::random_batch(in, tg, cfg.vocab_size, 80);
    h.t = 4;
    EXPECT_EQ(a.train_step(in.data(), tg.data(), h).loss, b.train_step(in.data(), tg.data(), h).loss);
    EXPECT_TRUE(a.export_state().params == b.export_state().params);
    EXPECT_TRUE(a.export_state().m == b.export_state().m);
    // Without the flag's engine option the step has no first moment to run with.
    EngineOptions wrong = engine_opts(true);
    wrong.optimizer = Optimizer::adamw;
    EXPECT_THROW(Engine(cfg, backend, wrong), ConfigError);
}

TEST(Adafactor, RefusesWhatCutsAMatrix) {
    const ModelConfig cfg = test::small_config(64, 32, 2, 2);
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.optimizer = Optimizer::adafactor, eo.offload = 0.5;
    eo.offload_dir = "/tmp";
    EXPECT_THROW(Engine(cfg, backend, eo), ConfigError);
}

}  // namespace
}  // namespace memfit
