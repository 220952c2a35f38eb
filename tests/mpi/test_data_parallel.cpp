// Data parallel over MPI ranks against one process on the same global batch: each rank runs
// its slice of every micro-batch, the gradients are summed bucket by bucket (non-blocking, one
// bucket per layer), and the losses and parameters after a few AdamW steps equal the single
// process's within fp32 rounding (bf16: within bf16 rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/communicator.h"
#include "train/engine.h"
#include "../test_util.h"

using namespace memfit;

namespace {

Communicator & world() {
    static std::unique_ptr<Communicator> c = make_communicator();
    return *c;
}

ModelConfig tiny(bool llama) {
    ModelConfig c = test::small_config(37, 32, 2, 4, 64);
    if (llama) {
        c.family = "llama";
        c.n_kv_head = 2;
        c.ffn = 48;
        c.tied_head = false;
    }
    c.validate();
    return c;
}

struct DpRun {
    std::vector<float> losses, params;
};

// Global batch G sequences of T tokens per micro-batch, k micro-batches per step.
DpRun train(const ModelConfig & cfg, DType dt, int G, int T, int k, int steps, Communicator * comm) {
    CpuBackend backend;
    const int N = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
    EngineOptions eo;
    eo.B = G / N;
    eo.T = T;
    eo.grad_accum = k;
    eo.compute = dt;
    eo.flash_attention = true;
    eo.with_eval = false;
    eo.data_parallel = N;
    eo.comm = N > 1 ? comm : nullptr;
    Engine e(cfg, backend, eo);
    e.init_params(11);
    AdamWHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    DpRun run;
    for (int s = 0; s < steps; ++s) {
        // The same global batch on every rank; this rank takes rows r*B .. r*B+B-1 of each micro-batch.
        std::vector<int32_t> in(size_t(G * T * k)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(100 + s));
        std::vector<int32_t> my_in, my_tg;
        for (int m = 0; m < k; ++m)
            for (int b = r * eo.B; b < (r + 1) * eo.B; ++b)
                for (int t = 0; t < T; ++t) {
                    const size_t i = size_t((m * G + b) * T + t);
                    my_in.push_back(in[i]);
                    my_tg.push_back(tg[i]);
                }
        run.losses.push_back(e.train_step(my_in.data(), my_tg.data(), h).loss);
    }
    run.params.assign(e.params(), e.params() + e.step().layout().total);
    return run;
}

}  // namespace

TEST(DataParallel, EqualsOneProcessOnTheSameGlobalBatch) {
    Communicator & c = world();
    ASSERT_GE(c.size(), 2) << "run under mpirun -np 2 or more";
    const int G = 4;   // sequences per micro-batch: 2 per rank at N = 2, 1 at N = 4
    for (bool llama : {false, true})
        for (DType dt : {DType::f32, DType::bf16})
            for (int k : {1, 2}) {
                SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + std::string(dtype_name(dt)) + " accum " +
                             std::to_string(k));
                const ModelConfig cfg = tiny(llama);
                const int batch = std::max(G, c.size());
                const DpRun dp = train(cfg, dt, batch, 8, k, 3, &c);
                const DpRun one = train(cfg, dt, batch, 8, k, 3, nullptr);
                const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
                for (size_t s = 0; s < one.losses.size(); ++s)
                    EXPECT_NEAR(dp.losses[s], one.losses[s], tol * std::fabs(one.losses[s])) << "step " << s;
                double worst = 0, diff2 = 0, norm2 = 0;
                for (size_t i = 0; i < one.params.size(); ++i) {
                    const double d = double(dp.params[i]) - double(one.params[i]);
                    worst = std::max(worst, std::fabs(d));
                    diff2 += d * d;
                    norm2 += double(one.params[i]) * double(one.params[i]);
                }
                if (dt == DType::f32) {
                    EXPECT_LT(worst, 1e-4) << "largest parameter difference";
                } else {
                    // bf16 gradients are rounded per rank before the sum: AdamW's normalised
                    // update can move a parameter with a tiny gradient by up to 2 lr per step.
                    EXPECT_LT(worst, 2 * 1e-2 * 3 + 1e-3) << "largest parameter difference";
                    EXPECT_LT(std::sqrt(diff2 / norm2), 1e-2) << "relative RMS parameter difference";
                }
                // Every rank holds the same parameters.
                std::vector<float> all(one.params.size() * size_t(c.size()));
                c.all_gather(dp.params.data(), all.data(), dp.params.size() * sizeof(float));
                for (int q = 1; q < c.size(); ++q)
                    EXPECT_EQ(0, std::memcmp(all.data(), all.data() + size_t(q) * dp.params.size(),
                                             dp.params.size() * sizeof(float)))
                        << "rank " << q << " diverged from rank 0";
            }
}
