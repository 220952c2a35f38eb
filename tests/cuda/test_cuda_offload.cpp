// --offload optimizer on the device: the fp32 master weights and both moments live in pinned host
// memory and are staged through device memory unit by unit for the same kernels, so the run is
// the in-memory one's bit for bit; what the device holds (cudaMemGetInfo) is the plan's device
// regions plus the runtime, without the 12 bytes per parameter: to the byte on the emulator.
// The copies run on a copy stream of their own; the emulator defers them until a stream waits on
// them, so a missing wait (or one on the wrong slot) shows here as stale states.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/op_check.h"
#include "test_util.h"
#include "train/engine.h"

namespace memfit {
namespace {

struct Trained {
    std::vector<float> params, m, v;
    CategoryBytes planned_live, measured_live, planned_reserved;
    uint64_t device_used = 0;
};

Trained train(const ModelConfig & cfg, const EngineOptions & eo) {
    CudaBackend & g = *test::gpu();
    Engine engine(cfg, g, eo);
    engine.init_params(4);
    OptimHyper h;
    h.lr = 1e-3f, h.weight_decay = 0.1f, h.clip = 1.0f;
    std::vector<int32_t> in(size_t(eo.B) * size_t(eo.T)), tg(in.size());
    for (int s = 0; s < 3; ++s) {
        test::random_batch(in, tg, cfg.vocab_size, 60 + uint64_t(s));
        h.t = s + 1;
        engine.train_step(in.data(), tg.data(), h);
    }
    g.synchronize();
    Trained r;
    r.device_used = g.device_used_delta();
    const TrainState st = engine.export_state();
    r.params = st.params, r.m = st.m, r.v = st.v;
    r.planned_live = engine.planned_peak_live();
    r.measured_live = engine.ledger().live_peak();
    r.planned_reserved = engine.planned_reserved();
    return r;
}

// The offloaded run ended where the in-memory one did, bit for bit, each category's peak as planned.
void expect_same_end_planned_exactly(const Trained & off, const Trained & mem) {
    EXPECT_EQ(off.params, mem.params);
    EXPECT_EQ(off.m, mem.m);
    EXPECT_EQ(off.v, mem.v);
    for (int k = 0; k < kCategoryCount; ++k)
        EXPECT_EQ(off.planned_live.v[size_t(k)], off.measured_live.v[size_t(k)]) << category_name(Category(k));
}

TEST(CudaOffload, StatesInPinnedHostMemoryLeaveTheDevice) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    EngineOptions eo;
    eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = true;
    const Trained mem = train(cfg, eo);
    eo.offload = 1, eo.offload_unit = 4096;
    const Trained off = train(cfg, eo);
    expect_same_end_planned_exactly(off, mem);
    // Off the device: 12 bytes per parameter (fp32 master weights and moments).
    const uint64_t P = mem.params.size();
    EXPECT_EQ(off.planned_live.v[size_t(Category::offloaded)], 12 * P);
    // On it: the plan's regions and the runtime; the states' 12 bytes per parameter are gone but
    // for the units' staging.
    const uint64_t runtime = test::gpu()->runtime_bytes();
#ifdef MEMFIT_CUDA_EMU
    EXPECT_EQ(off.device_used, off.planned_reserved.total() + runtime);
    EXPECT_EQ(mem.device_used, mem.planned_reserved.total() + runtime);
#else
    EXPECT_LT(std::fabs(double(off.device_used) - double(off.planned_reserved.total() + runtime)) / double(off.device_used),
              0.02);
#endif
    // Three units are live at once; the arena places units of unequal sizes in under four.
    EXPECT_GE(mem.planned_reserved.total() - off.planned_reserved.total(), 12 * P - 4 * 4096 * 12);
    EXPECT_GE(mem.device_used - off.device_used, 12 * P - 4 * 4096 * 12);
}

// --offload optimizer+params on the device (ZeRO 3 on one process): the weights' bf16 shard joins
// the states in pinned host memory, each layer's part copied up a layer ahead of its gather on
// the copy stream; bit for bit the in-memory ZeRO-3 run, 14 bytes a parameter off the device.
TEST(CudaOffload, WeightsInPinnedHostMemoryToo) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    EngineOptions eo;
    eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = true, eo.zero = 3;
    const Trained mem = train(cfg, eo);
    eo.offload = 1, eo.offload_params = true, eo.offload_unit = 4096;
    const Trained off = train(cfg, eo);
    expect_same_end_planned_exactly(off, mem);
    const uint64_t P = mem.params.size();
    EXPECT_GE(off.planned_live.v[size_t(Category::offloaded)], 14 * P);   // the shard is padded
    EXPECT_LT(off.planned_live.v[size_t(Category::parameters)], mem.planned_live.v[size_t(Category::parameters)]);
#ifdef MEMFIT_CUDA_EMU
    EXPECT_EQ(off.device_used, off.planned_reserved.total() + test::gpu()->runtime_bytes());
#endif
    EXPECT_LT(off.device_used, mem.device_used);
}

// --offload activations on the device: each layer's saved activations go to pinned host memory
// on the copy stream after its forward and come back one layer ahead of its backward; bit for bit
// the resident run, each category as planned, the device holding the plan's regions (to the byte
// on the emulator) and less than the resident run's. GPT-2 with naive attention and LLaMA with
// grouped KV heads and flash attention, every unit kept and selective recomputation.
TEST(CudaOffload, ActivationsInPinnedHostMemory) {
    MF_REQUIRE_GPU();
    for (const bool llama : {false, true}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = test::small_family(llama, 96, 128, 3, 4, 256, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = llama;
        eo.recompute = parse_recompute(llama ? "selective" : "none", cfg.n_layer);
        const Trained mem = train(cfg, eo);
        eo.offload_activations = true;
        const Trained off = train(cfg, eo);
        expect_same_end_planned_exactly(off, mem);
        EXPECT_GT(off.planned_live.v[size_t(Category::offloaded)], 0u);
        EXPECT_LT(off.planned_live.v[size_t(Category::activations)], mem.planned_live.v[size_t(Category::activations)]);
#ifdef MEMFIT_CUDA_EMU
        EXPECT_EQ(off.device_used, off.planned_reserved.total() + test::gpu()->runtime_bytes());
#endif
        EXPECT_LT(off.device_used, mem.device_used);
    }
}

}  // namespace
}  // namespace memfit
