// The engine's paths for a backend whose memory is not host memory (the CUDA backend's), run on
// the CPU: a CPU backend that declares its memory a device's, so the engine reaches it only
// through upload and download (params(), grads() and the moments become host mirrors). Its
// results must equal the plain CPU backend's bit for bit: a write left in a mirror, or a stale
// mirror uploaded over trained weights, shows as a difference.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"
#include "train/engine.h"

namespace memfit {
namespace {

class DeviceLikeCpu final : public CpuBackend {
public:
    bool host_memory() const override { return false; }
    void upload(void * dst, const void * src, size_t bytes) override {
        ++uploads;
        std::memcpy(dst, src, bytes);
    }
    void download(void * dst, const void * src, size_t bytes) override {
        ++downloads;
        std::memcpy(dst, src, bytes);
    }
    int uploads = 0, downloads = 0;
};

EngineOptions options(DType dt, int zero_accum) {
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.compute = dt, eo.grad_accum = zero_accum, eo.with_eval = true;
    return eo;
}

struct Out { std::vector<float> losses, params; };

// Three steps; between the first and the second, one weight is edited through params() (the
// mirror on a device backend) and an unrelated params() read is followed by a step (a stale
// mirror must not be uploaded afterwards).
Out run(Backend & b, const ModelConfig & cfg, const EngineOptions & eo, const TrainState * resume = nullptr) {
    Engine e(cfg, b, eo);
    e.init_params(5);
    if (resume) e.import_state(*resume);
    OptimHyper h;
    h.lr = 1e-2f, h.clip = 1.0f;
    const size_t n = size_t(eo.B) * size_t(eo.T) * size_t(eo.grad_accum);
    Out o;
    for (int s = 0; s < 3; ++s) {
        std::vector<int32_t> in(n), tg(n);
        test::random_batch(in, tg, cfg.vocab_size, 40 + uint64_t(s));
        if (s == 1) {
            e.params()[3] = 0.25f;
            e.params_changed();
            (void) e.params();   // read only: a mirror handed out, then a step
        }
        o.losses.push_back(e.train_step(in.data(), tg.data(), h).loss);
        o.losses.push_back(e.eval_loss(in.data(), tg.data()));
    }
    e.params_changed();   // nothing written since the step: must change nothing
    o.params = e.full_params();
    return o;
}

TEST(DevicePaths, EngineThroughUploadAndDownloadEqualsHostMemoryBitwise) {
    for (bool llama : {false, true})
        for (DType dt : {DType::f32, DType::bf16})
            for (int accum : {1, 2}) {
                SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + std::string(dtype_name(dt)) + " accum " +
                             std::to_string(accum));
                const ModelConfig cfg = test::small_family(llama, 64, 32, 2, 4, 64, 16);
                CpuBackend host;
                DeviceLikeCpu dev;
                const Out a = run(host, cfg, options(dt, accum)), b = run(dev, cfg, options(dt, accum));
                EXPECT_EQ(a.losses, b.losses);
                EXPECT_EQ(a.params, b.params);
                EXPECT_GT(dev.uploads, 0);
                EXPECT_GT(dev.downloads, 0);
            }
}

TEST(DevicePaths, StateMovesThroughMirrors) {
    // A state exported from a device engine resumes on another exactly as on the host backend.
    const ModelConfig cfg = test::small_family(false, 64, 32, 2, 4, 64, 16);
    const EngineOptions eo = options(DType::bf16, 1);
    CpuBackend host;
    DeviceLikeCpu dev;
    TrainState s;
    {
        Engine e(cfg, dev, eo);
        e.init_params(11);
        std::vector<int32_t> in(32), tg(32);
        test::random_batch(in, tg, cfg.vocab_size, 2);
        e.train_step(in.data(), tg.data(), OptimHyper{});
        s = e.export_state();
    }
    EXPECT_EQ(s.t, 1);
    const Out a = run(host, cfg, eo, &s), b = run(dev, cfg, eo, &s);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.params, b.params);
}

}  // namespace
}  // namespace memfit
