// Expert parallelism (model/expert_parallel.h) over MPI ranks against one process on the same
// global batch: the experts split over expert groups of 2 consecutive ranks, routed rows
// exchanged by all-to-all, the dense gradients summed over the group and the load-balancing
// loss over every rank's tokens. With a capacity large enough that nothing drops, the losses and the
// whole model after 20 AdamW steps equal the one process's within fp32 rounding, at ZeRO 0 and
// 1 and under recomputation; each rank's plan equals what it measured.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/communicator.h"
#include "model/expert_parallel.h"
#include "train/engine.h"
#include "mpi_test_env.h"
#include "../test_util.h"

using namespace memfit;

namespace {

struct EpRun {
    std::vector<float> losses, aux, params;
    double dropped = 0;
    CategoryBytes planned, measured;
};

struct EpCase {
    int zero = 0;
    const char * recompute = "none";
    float capacity = 4;
};

// Global batch G sequences of T tokens; ep > 1: this rank's G / N rows, its expert group the
// 2 consecutive ranks it is in.
EpRun train(const ModelConfig & cfg, int G, int T, int steps, int ep, const EpCase & c = {}) {
    Communicator & w = test::world();
    const int N = ep > 1 ? w.size() : 1, r = ep > 1 ? w.rank() : 0;
    std::unique_ptr<Communicator> group, data;
    CpuBackend backend;
    EngineOptions eo;
    eo.B = G / N;
    eo.T = T;
    eo.flash_attention = true;
    eo.with_eval = false;
    eo.checking = true;
    eo.zero = c.zero;
    eo.recompute = recompute_plan(Recompute(c.recompute), cfg.n_layer);
    if (ep > 1) {
        group = w.split(r / ep, r % ep);
        data = w.split(r % ep, r / ep);
        eo.expert_parallel = ep;
        eo.ep_comm = group.get();
        eo.data_parallel = N / ep;
        eo.comm = N / ep > 1 ? data.get() : nullptr;
        eo.moe_capacity_factor = c.capacity;
    }
    Engine e(cfg, backend, eo);
    e.init_params(11);
    OptimHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    EpRun run;
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(size_t(G * T)), tg(in.size());
        test::random_batch(in, tg, cfg.vocab_size, uint64_t(300 + s % 2));   // two batches, learnt
        const std::vector<int32_t> my_in = test::rank_rows(in, 1, G, T, r, eo.B), my_tg = test::rank_rows(tg, 1, G, T, r, eo.B);
        const StepResult res = e.train_step(my_in.data(), my_tg.data(), h);
        run.losses.push_back(res.loss);
        run.aux.push_back(res.aux_loss);
        run.dropped += res.moe_dropped;
    }
    run.params = e.full_params();
    run.planned = e.planned_peak_live();
    run.measured = e.ledger().live_peak();
    return run;
}

ModelConfig model() {
    ModelConfig cfg = model_preset("mixtral-nano");
    cfg.vocab_size = 37;
    cfg.n_layer = 2;
    cfg.moe.aux_coef = 0.02f;
    cfg.moe.z_coef = 0.001f;
    return cfg;
}

void expect_equal(const EpRun & ep, const EpRun & one) {
    ASSERT_EQ(ep.losses.size(), one.losses.size());
    for (size_t s = 0; s < one.losses.size(); ++s) {
        EXPECT_NEAR(ep.losses[s], one.losses[s], 2e-4 * std::max(1.0f, std::fabs(one.losses[s]))) << "step " << s;
        EXPECT_NEAR(ep.aux[s], one.aux[s], 1e-4 * std::max(1.0f, std::fabs(one.aux[s]))) << "aux loss, step " << s;
    }
    ASSERT_EQ(ep.params.size(), one.params.size());
    double worst = 0;
    for (size_t i = 0; i < one.params.size(); ++i) worst = std::max(worst, std::fabs(double(ep.params[i]) - one.params[i]));
    EXPECT_LT(worst, 5e-4) << "largest parameter difference after " << one.losses.size() << " steps";
    EXPECT_EQ(ep.dropped, 0) << "a capacity of 4 drops nothing";
    for (int k = 0; k < kCategoryCount; ++k)
        EXPECT_EQ(ep.planned.v[size_t(k)], ep.measured.v[size_t(k)]) << category_name(Category(k));
}

}  // namespace

TEST(ExpertParallel, EqualsOneProcessOverTwentySteps) {
    Communicator & w = test::world();
    ASSERT_EQ(w.size() % 2, 0) << "run under mpirun -np 2 or 4";
    const ModelConfig cfg = model();
    const int G = 4, T = 8, steps = 20;
    const EpRun one = train(cfg, G, T, steps, 1);
    EXPECT_LT(one.losses.back(), one.losses.front()) << "the reference learns";
    for (const EpCase & c : {EpCase{0, "none"}, EpCase{1, "none"}, EpCase{1, "full"}, EpCase{0, "selective"}}) {
        SCOPED_TRACE(std::string("zero ") + std::to_string(c.zero) + " recompute " + c.recompute);
        expect_equal(train(cfg, G, T, steps, 2, c), one);
    }
}

// A capacity below the load drops choices (counted, the same on every rank) and still trains;
// the experts' shares are disjoint: rank 0's share of the whole model is not rank 1's.
TEST(ExpertParallel, CountsWhatACapacityDrops) {
    Communicator & w = test::world();
    const ModelConfig cfg = model();
    const EpRun tight = train(cfg, 4, 8, 3, 2, EpCase{0, "none", 0.25f});
    EXPECT_GT(tight.dropped, 0) << "a quarter of the fair share drops choices";
    for (float l : tight.losses) EXPECT_TRUE(std::isfinite(l));
    const double all = w.all_reduce_sum(tight.dropped);
    EXPECT_EQ(all, tight.dropped * w.size()) << "every rank reports the step's total";
    const ExpertParallel e0{2, 0, 1}, e1{2, 1, 1};
    const ParamLayout a = make_param_layout(ep_local_config(cfg, e0)), b = make_param_layout(ep_local_config(cfg, e1));
    EXPECT_EQ(a.total, b.total);
    EXPECT_TRUE(a.try_find("model.layers.0.block_sparse_moe.experts.0.w1.weight"));
    EXPECT_FALSE(b.try_find("model.layers.0.block_sparse_moe.experts.0.w1.weight"));
    EXPECT_TRUE(b.try_find("model.layers.0.block_sparse_moe.experts." + std::to_string(cfg.moe.experts / 2) + ".w1.weight"));
}
