// --offload optimizer: the master weights and moments of the offloaded share live in a file (the
// CPU backend's store) and are staged through device memory unit by unit for the same kernels,
// so the run equals the in-memory one bit for bit; the `offloaded` category is planned and
// measured exactly, and the device's bytes drop by the offloaded states less the staging. With
// optimizer+params (ZeRO 3) the weights' shard joins them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/moments8.h"
#include "core/error.h"
#include "train/engine.h"
#include "test_util.h"
#include "optim_ops.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::random_batch;
using test::small_config;

std::string offload_dir() { return test::process_dir("offload"); }

struct Trained {
    TrainState state;
    std::vector<float> losses;
    CategoryBytes planned_live, measured_live, planned_reserved, measured_reserved;
};

// `steps` steps; the state is exported after `resume_at` of them and imported into a fresh
// engine of the same options, which runs the rest (0: one engine throughout).
Trained train(const ModelConfig & cfg, const EngineOptions & eo, int steps, int resume_at = 0) {
    CpuBackend backend;
    auto engine = std::make_unique<Engine>(cfg, backend, eo);
    engine->init_params(5);
    Trained r;
    const size_t n = size_t(eo.B) * size_t(eo.T) * size_t(eo.grad_accum);
    OptimHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    h.clip = 1.0f;
    for (int s = 0; s < steps; ++s) {
        if (s == resume_at && s > 0) {
            const TrainState mid = engine->export_state();
            engine = std::make_unique<Engine>(cfg, backend, eo);
            engine->import_state(mid);
        }
        std::vector<int32_t> in(n), tg(n);
        random_batch(in, tg, cfg.vocab_size, 40 + uint64_t(s));
        h.t = s + 1;
        r.losses.push_back(engine->train_step(in.data(), tg.data(), h).loss);
    }
    r.state = engine->export_state();
    r.planned_live = engine->planned_peak_live();
    r.measured_live = engine->ledger().live_peak();
    r.planned_reserved = engine->planned_reserved();
    r.measured_reserved = engine->ledger().reserved_peak();
    return r;
}

struct Case { DType compute, moments; int accum; double fraction; bool checking; bool sgd = false; };

TEST(Offload, StatesInAFileTrainBitForBitLikeInMemory) {
    const ModelConfig cfg = small_config(64, 32, 2, 2);
    const Case cases[] = {{DType::f32, DType::f32, 1, 1.0, false},  {DType::bf16, DType::f32, 1, 1.0, true},
                          {DType::bf16, DType::u8, 2, 0.5, false},  {DType::f32, DType::bf16, 2, 0.3, false},
                          {DType::bf16, DType::bf16, 1, 1.0, false}, {DType::bf16, DType::f32, 2, 1.0, false, true}};
    for (const Case & c : cases) {
        SCOPED_TRACE(std::string(dtype_name(c.compute)) + " moments " + std::string(dtype_name(c.moments)) +
                     " accum " + std::to_string(c.accum) + " fraction " + std::to_string(c.fraction) +
                     (c.sgd ? " sgd" : ""));
        EngineOptions eo;
        eo.B = 2, eo.T = 16, eo.with_eval = false, eo.compute = c.compute, eo.optimizer = test::optimizer_for(c.moments, c.sgd);
        eo.grad_accum = c.accum, eo.checking = c.checking;
        const Trained mem = train(cfg, eo, 4);
        eo.offload = c.fraction, eo.offload_dir = offload_dir(), eo.offload_unit = 512;   // several units per tensor
        const Trained off = train(cfg, eo, 4), resumed = train(cfg, eo, 4, 2);
        EXPECT_EQ(off.losses, mem.losses);
        EXPECT_EQ(off.state.params, mem.state.params);
        EXPECT_EQ(off.state.m, mem.state.m);
        EXPECT_EQ(off.state.v, mem.state.v);
        EXPECT_EQ(resumed.state.params, mem.state.params);
        EXPECT_EQ(resumed.state.v, mem.state.v);
        for (int k = 0; k < kCategoryCount; ++k) {
            EXPECT_EQ(off.planned_live.v[size_t(k)], off.measured_live.v[size_t(k)]) << category_name(Category(k));
            if (!c.checking) {   // checking mode: a block per buffer, not the arenas
                EXPECT_EQ(off.planned_reserved.v[size_t(k)], off.measured_reserved.v[size_t(k)]) << category_name(Category(k));
            }
        }
        // What left the device: the offloaded share of master weights and moments, in the file.
        const auto off_cat = size_t(Category::offloaded);
        const size_t P = mem.state.params.size();
        const double per = (c.compute == DType::f32 ? 0.0 : 4.0) + (c.sgd ? 1.0 : 2.0) * double(dtype_size(c.moments));
        const double offloaded = double(off.measured_live.v[off_cat]);
        EXPECT_GE(offloaded, per * c.fraction * double(P) * 0.99);
        if (c.fraction == 1.0 && c.moments != DType::u8) {
            EXPECT_EQ(offloaded, per * double(P));
        }
        // The device keeps three units' staging at most (512 elements each here).
        const uint64_t states = mem.planned_live.v[size_t(Category::master_weights)] +
                                mem.planned_live.v[size_t(Category::optimizer_states)];
        const uint64_t left = off.planned_live.v[size_t(Category::master_weights)] +
                              off.planned_live.v[size_t(Category::optimizer_states)];
        EXPECT_LE(left + uint64_t(offloaded), states + uint64_t(3 * 512 * (per + 8)));
        EXPECT_EQ(mem.planned_live.total() - off.planned_live.total(), states - left);
    }
}

// --offload optimizer+params: ZeRO 3's weight shard in the file too, read into staging a layer
// ahead of each gather and written back by the update; bit for bit the in-memory ZeRO-3 run, the
// whole shard of weights off the device, planned and measured alike.
TEST(Offload, WeightsInTheFileTooTrainBitForBitLikeInMemory) {
    const ModelConfig cfg = small_config(64, 32, 3, 2);
    struct P { DType compute, moments; int accum; bool checking, sr, sgd; };
    const P cases[] = {{DType::f32, DType::f32, 1, true, false, false},  {DType::bf16, DType::f32, 1, false, false, false},
                       {DType::bf16, DType::u8, 2, false, false, false}, {DType::bf16, DType::f32, 3, true, true, false},
                       {DType::f32, DType::f32, 2, false, false, true}};
    for (const P & c : cases) {
        SCOPED_TRACE(std::string(dtype_name(c.compute)) + " moments " + std::string(dtype_name(c.moments)) + " accum " +
                     std::to_string(c.accum) + (c.sr ? " bf16-sr" : "") + (c.sgd ? " sgd" : ""));
        EngineOptions eo;
        eo.B = 2, eo.T = 16, eo.with_eval = true, eo.compute = c.compute, eo.optimizer = test::optimizer_for(c.moments, c.sgd), eo.zero = 3;
        eo.grad_accum = c.accum, eo.checking = c.checking, eo.sr_master = c.sr;
        const Trained mem = train(cfg, eo, 4);
        eo.offload = 1, eo.offload_params = true, eo.offload_dir = offload_dir(), eo.offload_unit = 512;
        const Trained off = train(cfg, eo, 4), resumed = train(cfg, eo, 4, 2);
        EXPECT_EQ(off.losses, mem.losses);
        EXPECT_EQ(off.state.params, mem.state.params);
        EXPECT_EQ(off.state.m, mem.state.m);
        EXPECT_EQ(off.state.v, mem.state.v);
        EXPECT_EQ(resumed.losses, mem.losses);
        EXPECT_EQ(resumed.state.params, mem.state.params);
        for (int k = 0; k < kCategoryCount; ++k) {
            EXPECT_EQ(off.planned_live.v[size_t(k)], off.measured_live.v[size_t(k)]) << category_name(Category(k));
            if (!c.checking) {
                EXPECT_EQ(off.planned_reserved.v[size_t(k)], off.measured_reserved.v[size_t(k)]) << category_name(Category(k));
            }
        }
        // The file holds the weights' shard (compute dtype) beside the optimizer state; on the
        // device the weights are the gathered layers and their staging, below the whole shard
        // the in-memory run keeps plus them.
        const size_t P = mem.state.params.size(), cs = dtype_size(c.compute);
        const double per = (c.compute == DType::f32 || c.sr ? 0.0 : 4.0) + (c.sgd ? 1.0 : 2.0) * double(dtype_size(c.moments));
        const uint64_t offloaded = off.measured_live.v[size_t(Category::offloaded)];
        EXPECT_GE(double(offloaded), double(P) * (per + double(cs)));
        const uint64_t weights = mem.planned_live.v[size_t(Category::parameters)];
        EXPECT_LT(off.planned_live.v[size_t(Category::parameters)], weights);
        EXPECT_LT(off.planned_live.total(), mem.planned_live.total());
    }
}

// Forward-only programs (Engine::logits) read the offloaded weights through the same staging.
TEST(Offload, LogitsReadTheOffloadedWeights) {
    const ModelConfig cfg = small_config(64, 32, 2, 2);
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false, eo.compute = DType::bf16, eo.zero = 3;
    std::vector<int32_t> in(32), tg(32);
    random_batch(in, tg, cfg.vocab_size, 7);
    CpuBackend backend;
    Engine mem(cfg, backend, eo);
    mem.init_params(3);
    eo.offload = 1, eo.offload_params = true, eo.offload_dir = offload_dir();
    Engine off(cfg, backend, eo);
    off.init_params(3);
    const std::vector<float> a = mem.logits(in.data(), 2), b = off.logits(in.data(), 2);
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(a, b);
}

TEST(Offload, WhereTheStatesCannotGoIsOneClearError) {
    const ModelConfig cfg = small_config(64, 32, 2, 2);
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false, eo.offload = 1;
    try {
        Engine e(cfg, backend, eo);
        ADD_FAILURE() << "the CPU backend offloaded without a directory";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("needs --offload-dir DIR"), std::string::npos) << e.what();
    }
    eo.offload_dir = offload_dir();
    eo.offload_params = true;   // the weights leave as ZeRO 3's shard
    try {
        Engine e(cfg, backend, eo);
        ADD_FAILURE() << "offloaded the weights without ZeRO 3";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("needs --zero 3"), std::string::npos) << e.what();
    }
    eo.offload_params = false;
    eo.offload_dir = offload_dir() + "/missing";
    try {
        Engine e(cfg, backend, eo);
        ADD_FAILURE() << "offloaded into a directory that is not there";
    } catch (const IoError & e) {
        EXPECT_NE(std::string(e.what()).find("not a directory"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace memfit
