// `memfit plan --hardware cpu --gpus N --zero K` against what each of N ranks measures while
// training: the planner records rank 0's step program (equal shards make every rank's the
// same), so every rank's measured peak live bytes equal the plan per category.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/communicator.h"
#include "model/recompute.h"
#include "plan/hardware.h"
#include "plan/search.h"
#include "train/engine.h"
#include "../test_util.h"

using namespace memfit;

namespace {
Communicator & comm() {
    static std::unique_ptr<Communicator> c = make_communicator();
    return *c;
}
}  // namespace

TEST(ZeroPlan, CpuPlanEqualsEveryRanksMeasuredMemory) {
    Communicator & c = comm();
    const int N = c.size();
    ASSERT_GE(N, 2) << "run under mpirun -np 2 or more";
    CpuBackend backend;
    const Hardware hw = find_hardware(default_hardware_catalog(""), "cpu");
    struct Case { bool llama; DType dt; int zero, accum; const char * rc; };
    for (const Case & k : {Case{false, DType::f32, 0, 1, "none"}, Case{false, DType::bf16, 1, 2, "selective"},
                           Case{true, DType::bf16, 2, 1, "none"}, Case{true, DType::f32, 2, 2, "full"},
                           Case{false, DType::bf16, 3, 1, "none"}, Case{true, DType::f32, 3, 2, "selective"}}) {
        const ModelConfig cfg = test::small_family(k.llama, 53, 32, 4, 4, 64, 32);
        SCOPED_TRACE(std::string(k.llama ? "llama " : "gpt2 ") + std::string(dtype_name(k.dt)) + " zero " +
                     std::to_string(k.zero) + " accum " + std::to_string(k.accum) + " recompute " + k.rc);
        const int B = 2, T = 16;   // per rank
        PlanRequest r;
        r.cfg = cfg;
        r.hw = hw;
        r.gpus = N;
        r.seq = T;
        r.global_batch = B * k.accum * N;
        r.micro_batch = B;
        r.compute = k.dt;
        r.zero = k.zero;
        r.tp = 1;
        r.pp = 1;
        r.offload = Offload::none;
        r.flash = true;
        r.recompute = k.rc;
        r.exact_sizing = &backend;
        const SearchReport rep = search_plans(r);
        ASSERT_FALSE(rep.best.empty());
        const DeviceMemory & plan = rep.best[0].mem;
        ASSERT_TRUE(plan.exact);
        ASSERT_EQ(rep.best[0].c.layout.dp, N);

        EngineOptions eo;
        eo.B = B;
        eo.T = T;
        eo.grad_accum = k.accum;
        eo.with_eval = false;
        eo.flash_attention = true;
        eo.compute = k.dt;
        eo.recompute = parse_recompute(k.rc, cfg.n_layer);
        eo.data_parallel = N;
        eo.comm = &c;
        eo.zero = k.zero;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(size_t(B * T * k.accum)), tg(in.size());
        for (int s = 0; s < 2; ++s) {
            test::random_batch(in, tg, cfg.vocab_size, uint64_t(s * N + c.rank()));
            e.train_step(in.data(), tg.data(), AdamWHyper{});
        }
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            if (Category(cat) == Category::runtime) continue;
            EXPECT_EQ(plan.device.v[cat], e.ledger().live_peak().v[cat]) << kCategoryNames[cat];
        }
        // Every rank reserves the same bytes, so every rank makes the same --fit auto choice.
        const std::vector<uint64_t> rsv = c.all_gather_u64(e.ledger().reserved_peak().total());
        for (int q = 1; q < N; ++q) EXPECT_EQ(rsv[0], rsv[size_t(q)]) << "rank " << q;
    }
}
