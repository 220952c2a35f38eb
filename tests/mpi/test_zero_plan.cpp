// `memfit plan --hardware cpu --gpus N --zero K` against what each of N ranks measures while
// training: the planner records rank 0's step program (equal shards make every rank's the
// same), so every rank's measured peak live bytes equal the plan per category.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "comm/communicator.h"
#include "comm/groups.h"
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
        r.run.seq = T;
        r.run.global_batch = B * k.accum * N;
        r.micro_batch = B;
        r.run.compute = k.dt;
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
            e.train_step(in.data(), tg.data(), OptimHyper{});
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

// `memfit plan --hardware cpu --gpus N --tp T [--sp] --pp P --schedule S` against each rank's measured
// peak: the plan records every stage's program (rank 0 of its tensor and data groups: the others'
// buffers have the same sizes), and each rank's ledger equals its stage's plan per category.
TEST(ParallelPlan, CpuPlanEqualsEveryRanksMeasuredMemoryUnderTensorAndPipeline) {
    Communicator & c = comm();
    const int N = c.size();
    ASSERT_GE(N, 2);
    CpuBackend backend;
    const Hardware hw = find_hardware(default_hardware_catalog(""), "cpu");
    struct Case { bool llama; DType dt; int tp, pp, zero; PipeSchedule sch; const char * rc; bool sp = false; };
    std::vector<Case> cases = {{false, DType::f32, 2, 1, 0, PipeSchedule::one_f_one_b, "none"},
                               {true, DType::bf16, 2, 1, 0, PipeSchedule::one_f_one_b, "selective", true},
                               {true, DType::bf16, 1, 2, 0, PipeSchedule::gpipe, "selective"},
                               {false, DType::bf16, 1, 2, 0, PipeSchedule::one_f_one_b, "full"},
                               {true, DType::f32, 1, 2, 0, PipeSchedule::interleaved, "none"}};
    if (N == 4)
        cases = {{false, DType::f32, 2, 2, 0, PipeSchedule::one_f_one_b, "none"},
                 {false, DType::bf16, 2, 2, 0, PipeSchedule::one_f_one_b, "full", true},
                 {true, DType::bf16, 1, 4, 0, PipeSchedule::gpipe, "selective"},
                 {false, DType::bf16, 1, 2, 1, PipeSchedule::one_f_one_b, "none"},
                 {true, DType::f32, 2, 1, 1, PipeSchedule::one_f_one_b, "full"},
                 {false, DType::f32, 2, 2, 0, PipeSchedule::interleaved, "selective"}};
    for (const Case & k : cases) {
        const ModelConfig cfg = test::small_family(k.llama, 53, 32, 4, 4, 64, 32);
        SCOPED_TRACE(fmt::format("{} {} tp {}{} pp {} zero {} {} recompute {}", k.llama ? "llama" : "gpt2",
                                 dtype_name(k.dt), k.tp, k.sp ? " sp" : "", k.pp, k.zero,
                                 k.sch == PipeSchedule::gpipe ? "gpipe" : k.sch == PipeSchedule::one_f_one_b ? "1f1b" : "interleaved:2",
                                 k.rc));
        const int B = 2, T = 16, m = 4;   // per data rank; micro-batches per step
        const int D = N / (k.tp * k.pp);
        PlanRequest r;
        r.cfg = cfg;
        r.hw = hw;
        r.gpus = N;
        r.run.seq = T;
        r.run.global_batch = B * m * D;
        r.micro_batch = B;
        r.run.compute = k.dt;
        r.zero = k.zero;
        r.tp = k.tp;
        r.pp = k.pp;
        r.schedule = k.sch;
        r.virtual_stages = 2;   // interleaved: two chunks of the 4 blocks per stage
        r.sp = k.sp;
        r.offload = Offload::none;
        r.flash = true;
        r.recompute = k.rc;
        r.exact_sizing = &backend;
        const SearchReport rep = search_plans(r);
        ASSERT_FALSE(rep.best.empty());
        const PlanResult & best = rep.best[0];
        ASSERT_TRUE(best.mem.exact);
        ASSERT_EQ(best.c.layout.tp, k.tp);
        ASSERT_EQ(best.c.layout.pp, k.pp);
        ASSERT_EQ(best.c.layout.sp, k.sp);
        ASSERT_EQ(best.c.grad_accum, m);

        const ProcessGroups pg(c, derive_layout(N, k.tp, k.pp));
        EngineOptions eo;
        eo.B = B;
        eo.T = T;
        eo.grad_accum = m;
        eo.with_eval = false;
        eo.flash_attention = true;
        eo.compute = k.dt;
        eo.recompute = parse_recompute(k.rc, cfg.n_layer);
        eo.data_parallel = D;
        eo.comm = pg.dp.get();
        eo.zero = k.zero;
        eo.tensor_parallel = k.tp;
        eo.sequence_parallel = k.sp;
        eo.tp_comm = pg.tp.get();
        eo.pipeline_parallel = k.pp;
        eo.pp_comm = pg.pp.get();
        eo.emb_comm = pg.emb.get();
        eo.schedule = k.sch == PipeSchedule::gpipe           ? PipeSchedule::gpipe
                      : k.sch == PipeSchedule::one_f_one_b ? PipeSchedule::one_f_one_b
                                                       : PipeSchedule::interleaved;
        eo.virtual_stages = k.sch == PipeSchedule::interleaved ? 2 : 1;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(size_t(B * T * m)), tg(in.size());
        for (int s = 0; s < 2; ++s) {
            test::random_batch(in, tg, cfg.vocab_size, uint64_t(s * N + pg.coords.dp));
            e.train_step(in.data(), tg.data(), OptimHyper{});
        }
        const CategoryBytes planned = k.pp > 1 ? best.mem.stages.at(size_t(pg.coords.pp)) : best.mem.device;
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            if (Category(cat) == Category::runtime) continue;
            EXPECT_EQ(planned.v[cat], e.ledger().live_peak().v[cat]) << kCategoryNames[cat];
        }
        if (k.pp > 1) {   // the device the plan reports is the largest stage
            uint64_t most = 0;
            for (const auto & st : best.mem.stages) most = std::max(most, st.total());
            EXPECT_EQ(most + best.mem.device[Category::runtime], best.mem.total());
        }
    }
}
