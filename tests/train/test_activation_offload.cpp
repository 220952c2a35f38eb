// --offload activations: what each layer's forward saves for its backward waits in the store (a
// file, the CPU backend's) between the two. The kernels read the same bytes back, so training is
// bit for bit the resident run's whatever the recomputation, precision, attention, accumulation
// or adapters; every category, the store's included, is planned and measured to the byte; and
// what moves is what the program keeps (with full recomputation, exactly each layer's input).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

std::string offload_dir() { return test::process_dir("act_offload"); }

struct Trained {
    TrainState state;
    std::vector<float> losses;
    CategoryBytes planned_live, measured_live, planned_reserved, measured_reserved;
};

Trained train(const ModelConfig & cfg, const EngineOptions & eo, int steps = 3) {
    CpuBackend backend;
    Engine engine(cfg, backend, eo);
    engine.init_params(7);
    Trained r;
    const size_t n = size_t(eo.B) * size_t(eo.T) * size_t(eo.grad_accum);
    OptimHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(n), tg(n);
        test::random_batch(in, tg, cfg.vocab_size, 70 + uint64_t(s));
        h.t = s + 1;
        r.losses.push_back(engine.train_step(in.data(), tg.data(), h).loss);
    }
    r.state = engine.export_state();
    r.planned_live = engine.planned_peak_live();
    r.measured_live = engine.ledger().live_peak();
    r.planned_reserved = engine.planned_reserved();
    r.measured_reserved = engine.ledger().reserved_peak();
    return r;
}

void expect_planned_exactly(const Trained & t, bool checking) {
    for (int k = 0; k < kCategoryCount; ++k) {
        EXPECT_EQ(t.planned_live.v[size_t(k)], t.measured_live.v[size_t(k)]) << category_name(Category(k));
        if (!checking) {   // checking mode: a block per buffer, not the arenas
            EXPECT_EQ(t.planned_reserved.v[size_t(k)], t.measured_reserved.v[size_t(k)]) << category_name(Category(k));
        }
    }
}

struct Case {
    bool llama;
    const char * recompute;
    DType compute = DType::f32;
    bool flash = false;
    int accum = 1, lora = 0, mlp_chunk = 0, layers = 0;
    bool checking = false;
};

std::string name(const Case & c) {
    return std::string(c.llama ? "llama" : "gpt2") + " recompute " + c.recompute + " " + std::string(dtype_name(c.compute)) +
           (c.flash ? " flash" : "") + " accum " + std::to_string(c.accum) + " lora " + std::to_string(c.lora) +
           " mlp_chunk " + std::to_string(c.mlp_chunk) + " layers " + std::to_string(c.layers) +
           (c.checking ? " checking" : "");
}

TEST(ActivationOffload, TrainsBitForBitLikeResident) {
    const Case cases[] = {
        {false, "none"},
        {false, "selective", DType::bf16, true},
        {false, "full", DType::f32, false, 2},
        {false, "every:2", DType::f32, true, 1, 0, 0, 0, true},
        {true, "none", DType::bf16, true},
        {true, "selective", DType::f32, false, 1, 0, 16},
        {true, "none", DType::f32, true, 2, 4},
        {true, "full", DType::bf16, false, 1, 4, 0, 2},
        {true, "none", DType::f32, false, 1, 0, 0, 1, true},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(name(c));
        const ModelConfig cfg = test::small_family(c.llama, 64, 32, 3, 4, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 16, eo.with_eval = false, eo.compute = c.compute, eo.flash_attention = c.flash;
        eo.grad_accum = c.accum, eo.mlp_chunk = c.mlp_chunk, eo.checking = c.checking;
        eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
        if (c.lora) eo.lora = test::lora_options(cfg, c.lora);
        const Trained mem = train(cfg, eo);
        eo.offload_activations = true, eo.offload_activation_layers = c.layers, eo.offload_dir = offload_dir();
        const Trained off = train(cfg, eo);
        EXPECT_EQ(off.losses, mem.losses);
        EXPECT_EQ(off.state.params, mem.state.params);
        EXPECT_EQ(off.state.m, mem.state.m);
        EXPECT_EQ(off.state.v, mem.state.v);
        expect_planned_exactly(off, c.checking);
        const auto acts = size_t(Category::activations), moved = size_t(Category::offloaded);
        EXPECT_GT(off.measured_live.v[moved], 0u);
        EXPECT_EQ(mem.measured_live.v[moved], 0u);
        // Only activations move: every other category is the resident run's.
        for (int k = 0; k < kCategoryCount; ++k)
            if (size_t(k) != acts && size_t(k) != moved) {
                EXPECT_EQ(off.planned_live.v[size_t(k)], mem.planned_live.v[size_t(k)]) << category_name(Category(k));
            }
        EXPECT_LE(off.planned_live.v[acts], mem.planned_live.v[acts]);
    }
}

// Full recomputation keeps one tensor per layer, its input (the embedding's output for the
// first, the layer below's output for the rest): that is what moves, B x T x C each, for every
// layer or the first N; the last layer's output stays (the head reads it).
TEST(ActivationOffload, WhatMovesIsWhatTheProgramKeeps) {
    const ModelConfig cfg = test::small_family(true, 64, 32, 4, 4, 64);
    for (const DType dt : {DType::f32, DType::bf16})
        for (const int layers : {0, 1, 3}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " layers " + std::to_string(layers));
            EngineOptions eo;
            eo.B = 2, eo.T = 16, eo.with_eval = false, eo.compute = dt;
            eo.recompute = parse_recompute("full", cfg.n_layer);
            eo.offload_activations = true, eo.offload_activation_layers = layers, eo.offload_dir = offload_dir();
            const Trained off = train(cfg, eo, 1);
            const uint64_t input = uint64_t(eo.B) * uint64_t(eo.T) * uint64_t(cfg.n_embd) * dtype_size(dt);
            const uint64_t n = uint64_t(layers > 0 ? layers : cfg.n_layer);
            EXPECT_EQ(off.measured_live.v[size_t(Category::offloaded)], n * input);
            expect_planned_exactly(off, false);
        }
}

// Nothing saved for a backward crosses the whole step: with every unit kept, the device holds
// the saved activations of the layers in flight, not of all of them.
TEST(ActivationOffload, TheDeviceHoldsTheLayersInFlight) {
    const ModelConfig cfg = test::small_family(false, 64, 64, 8, 4, 64);
    EngineOptions eo;
    eo.B = 2, eo.T = 32, eo.with_eval = false, eo.loss_chunk = 16;
    const Trained mem = train(cfg, eo, 1);
    eo.offload_activations = true, eo.offload_dir = offload_dir();
    const Trained off = train(cfg, eo, 1);
    const uint64_t moved = off.planned_live.v[size_t(Category::offloaded)];
    const uint64_t resident = mem.planned_live.v[size_t(Category::activations)];
    const uint64_t left = off.planned_live.v[size_t(Category::activations)];
    // Eight layers' saved activations moved; at most about three layers' worth is on the device
    // at once (the one computing, the one being written or read, the next one read ahead).
    EXPECT_GT(moved, resident / 2);
    EXPECT_LT(left, resident - moved / 2);
    EXPECT_EQ(off.state.params, mem.state.params);
}

}  // namespace
}  // namespace memfit
