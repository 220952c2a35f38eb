// The planner on a mixture of experts: its memory is the engine's program (every expert's
// weights, gradients and states resident; the activations of the k experts each token visits; the
// route and dispatch buffers), the analytic model within the search's slack of it, the time model
// charging the active parameters' FLOPs, and the search answering for qwen3-30b-a3b on 8 H100s
// with data-parallel ZeRO layouts memfit train runs.
#include <gtest/gtest.h>

#include <memory>

#include "backend/cuda_sizing.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "run/compat.h"
#include "plan_request.h"
#include "test_util.h"

namespace memfit {
namespace {

PlanRequest moe_request(const char * model, const char * hw, int gpus, int seq, int global_batch) {
    return test::plan_request(model, hw, gpus, seq, global_batch, 3);
}

Candidate zero_candidate(int dp, int zero, int mb, const char * recompute) {
    Candidate c;
    c.layout.dp = dp, c.layout.zero = zero;
    c.micro_batch = mb;
    c.recompute = Recompute(recompute);
    c.loss_chunk = 4096;
    return c;
}

TEST(PlanMoe, TheAnalyticModelIsWithinTheSlackOfTheProgram) {
    const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
    for (const char * model : {"qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b"}) {
        const PlanRequest r = moe_request(model, "h200", 8, 4096, 8);
        for (const char * rc : {"none", "selective", "full"}) {
            SCOPED_TRACE(std::string(model) + " " + rc);
            const Candidate c = zero_candidate(8, 3, 1, rc);
            const DeviceMemory exact = exact_memory(r.cfg, r.hw, c, 4096, *cuda);
            EXPECT_TRUE(exact.exact);
            const double ratio = double(predict_memory(r.cfg, r.hw, c, 4096).total()) / double(exact.total());
            EXPECT_GT(ratio, 0.75);
            EXPECT_LT(ratio, kAnalyticSlack);
            const double acts = double(predict_memory(r.cfg, r.hw, c, 4096).device[Category::activations]) /
                                double(exact.device[Category::activations]);
            EXPECT_GT(acts, 0.6);
            EXPECT_LT(acts, 2.0) << "activations: analytic " << predict_memory(r.cfg, r.hw, c, 4096).device[Category::activations] << " exact " << exact.device[Category::activations];
        }
    }
}

// Every expert's weights and states are resident (ZeRO shards them like any parameter), but a
// token's compute is its k experts': the time model's FLOPs follow the active parameters.
TEST(PlanMoe, StatesFollowEveryExpertAndComputeTheActiveOnes) {
    const PlanRequest r = moe_request("qwen3-30b-a3b", "h100-80g", 8, 4096, 8);
    const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
    const DeviceMemory m = exact_memory(r.cfg, r.hw, zero_candidate(8, 3, 1, "full"), 4096, *cuda);
    const double P = double(r.cfg.num_params());
    EXPECT_NEAR(double(m.device[Category::optimizer_states]), 8.0 * P / 8, 0.01 * P);   // two fp32 moments
    const double flops = train_flops_per_token(r.cfg, 4096);
    EXPECT_LT(flops, 0.2 * 6.0 * P);   // 3.3B of 30.5B active
    EXPECT_GT(flops, 6.0 * double(r.cfg.active_params()) * 0.99);
    const StepTime t = predict_step_time(r.cfg, r.hw, zero_candidate(8, 3, 1, "full"), 4096, 1);
    EXPECT_GT(t.tokens_per_s, 0.0);
}

TEST(PlanMoe, TheSearchFindsRunnableLayoutsForQwen3On8H100s) {
    PlanRequest r = moe_request("qwen3-30b-a3b", "h100-80g", 8, 4096, 8);
    const SearchReport rep = search_plans(r);
    ASSERT_FALSE(rep.best.empty());
    for (const PlanResult & p : rep.best) {
        EXPECT_EQ(p.c.layout.tp, 1);   // --tp with experts is plan-only until expert parallelism
        EXPECT_EQ(p.c.layout.pp, 1);
        EXPECT_TRUE(p.mem.exact);
        EXPECT_TRUE(p.fits);
    }
}

// Expert parallelism (model/expert_parallel.h): a rank holds E / ep experts, so without ZeRO-3 the
// experts' weights and gradients divide by ep, ZeRO shards the rank's flat buffer over the ranks
// holding the same experts, ZeRO-3 gathers a rank's own experts only, and the routed rows cross
// the group all-to-all; the search tries it and lists it as runnable.
TEST(PlanMoe, ExpertParallelismDividesTheExpertsAndChargesTheAllToAll) {
    const PlanRequest r = moe_request("qwen3-30b-a3b", "h100-80g", 8, 4096, 8);
    Candidate one = zero_candidate(8, 1, 1, "full"), eight = one;
    eight.layout.ep = 8;
    const DeviceMemory a = predict_memory(r.cfg, r.hw, one, 4096), b = predict_memory(r.cfg, r.hw, eight, 4096);
    const ParamSplit ps = param_split(r.cfg);
    const double experts = double(ps.experts) * r.cfg.n_layer * 2;   // bf16 bytes
    EXPECT_NEAR(double(a.device[Category::parameters]) - double(b.device[Category::parameters]), experts * 7 / 8,
                0.01 * experts);
    // ZeRO-1's states: over the 8 data ranks without; with ep 8, the rank's share (the rest and
    // 1/8 of the experts) over the 1 rank holding the same experts.
    const double P = double(r.cfg.num_params()), X = double(ps.experts) * r.cfg.n_layer;
    EXPECT_NEAR(double(b.device[Category::optimizer_states]),
                double(a.device[Category::optimizer_states]) * 8 * (P - X * 7 / 8) / P,
                0.001 * double(b.device[Category::optimizer_states]));
    Candidate z3 = zero_candidate(8, 3, 1, "full"), z3e = z3;
    z3e.layout.ep = 8;
    EXPECT_LT(predict_memory(r.cfg, r.hw, z3e, 4096).device[Category::communication],
              predict_memory(r.cfg, r.hw, z3, 4096).device[Category::communication]);   // gathered layers
    const StepTime t = predict_step_time(r.cfg, r.hw, z3, 4096, 1), te = predict_step_time(r.cfg, r.hw, z3e, 4096, 1);
    EXPECT_GT(te.comm, 0.0);
    EXPECT_LT(te.comm, t.comm);   // gathering 16 of 128 experts a layer outweighs the all-to-all here
    EXPECT_GT(te.tokens_per_s, t.tokens_per_s);
    const SearchReport rep = search_plans(r);
    bool listed = false;
    for (const PlanResult & p : rep.best) listed |= p.c.layout.ep > 1 && p.runnable() && p.mem.exact;
    EXPECT_TRUE(listed) << "an expert-parallel layout among the runnable ones, planned exactly";
    RunConfig run;
    run.layout.ep = 2;
    run.layout.dp = 2;
    EXPECT_FALSE(unsupported(run, r.cfg, nullptr));
    run.lora.rank = 8;
    EXPECT_NE(unsupported(run, r.cfg, nullptr).value_or("").find("--ep 2 with LoRA is not supported yet"),
              std::string::npos);
    run.lora.rank = 0;
    run.layout.dp = 3;
    EXPECT_NE(unsupported(run, r.cfg, nullptr).value_or("").find("must divide the 3 data-parallel ranks"),
              std::string::npos);
    EXPECT_NE(unsupported(run, model_preset("llama-nano"), nullptr).value_or("").find("has no experts"),
              std::string::npos);
}

}  // namespace
}  // namespace memfit
