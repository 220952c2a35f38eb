// The planner's context parallelism (--cp): a context rank's memory is the program of its T / cp
// positions (exact, and the analytic model within the search's slack of it); the time model
// splits the math over the context ranks and charges the k | v gathers; the search tries it for
// long sequences only and finds layouts that fit where one rank per sequence does not.
#include <gtest/gtest.h>

#include <memory>

#include "backend/cuda_sizing.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "plan_request.h"
#include "test_util.h"

namespace memfit {
namespace {

PlanRequest request(const char * model, const char * hw, int gpus, int seq, int global_batch) {
    return test::plan_request(model, hw, gpus, seq, global_batch, 3);
}

Candidate candidate(int dp, int cp, int mb, const char * recompute) {
    Candidate c;
    c.layout.dp = dp, c.layout.cp = cp, c.layout.zero = 3;
    c.micro_batch = mb;
    c.recompute = Recompute(recompute);
    c.loss_chunk = 4096;
    return c;
}

TEST(PlanContextParallel, MemoryIsTheRanksShareAndTheAnalyticModelIsWithinTheSlack) {
    const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
    const PlanRequest r = request("llama3.1-8b", "h200", 8, 65536, 8);
    for (const char * rc : {"none", "full"}) {
        SCOPED_TRACE(rc);
        const DeviceMemory one = exact_memory(r.cfg, r.hw, candidate(8, 1, 1, rc), 65536, *cuda);
        const DeviceMemory two = exact_memory(r.cfg, r.hw, candidate(4, 2, 1, rc), 65536, *cuda);
        const DeviceMemory four = exact_memory(r.cfg, r.hw, candidate(2, 4, 1, rc), 65536, *cuda);
        EXPECT_TRUE(two.exact && four.exact);
        const auto acts = [](const DeviceMemory & m) { return double(m.device[Category::activations]); };
        EXPECT_LT(acts(two), 0.6 * acts(one));
        EXPECT_LT(acts(four), 0.6 * acts(two));
        // The model states: sharded over the data x context ranks, as the 8 ranks of dp 8.
        EXPECT_EQ(two.device[Category::optimizer_states], one.device[Category::optimizer_states]);
        for (const Candidate & c : {candidate(4, 2, 1, rc), candidate(2, 4, 2, rc)}) {
            const double ratio = double(predict_memory(r.cfg, r.hw, c, 65536).total()) /
                                 double(exact_memory(r.cfg, r.hw, c, 65536, *cuda).total());
            EXPECT_GT(ratio, 0.75);
            EXPECT_LT(ratio, kAnalyticSlack);
        }
    }
}

TEST(PlanContextParallel, TheTimeModelSplitsTheMathAndChargesTheGathers) {
    const PlanRequest r = request("llama3.1-8b", "h100-80g", 8, 65536, 8);
    const StepTime one = predict_step_time(r.cfg, r.hw, candidate(8, 1, 1, "full"), 65536, 1);
    const StepTime two = predict_step_time(r.cfg, r.hw, candidate(4, 2, 2, "full"), 65536, 1);
    // Each context rank does half of a sequence's work, on two sequences: the same math a step.
    EXPECT_NEAR(two.compute / one.compute, 1.0, 0.05);
    EXPECT_GT(two.comm, one.comm);   // the k | v all-gathers and reduce-scatters
    EXPECT_GT(two.comm_exposed, one.comm_exposed);
    EXPECT_GT(two.tokens_per_s, 0.0);
}

TEST(PlanContextParallel, SearchedForLongSequencesOnly) {
    PlanRequest shorter = request("llama3-8b", "h100-80g", 8, 8192, 64);
    for (const PlanResult & p : search_plans(shorter).best) EXPECT_EQ(p.c.layout.cp, 1);
    shorter.cp = 2;   // fixed, it is planned
    const SearchReport fixed = search_plans(shorter);
    ASSERT_FALSE(fixed.best.empty());
    for (const PlanResult & p : fixed.best) {
        EXPECT_EQ(p.c.layout.cp, 2);
        EXPECT_EQ(p.c.layout.dp * p.c.layout.cp * p.c.layout.tp * p.c.layout.pp, 8);
    }
    // 128K tokens of Llama 3.1 8B on one node of H200s: with the activations resident, only
    // layouts that split the sequence fit a micro-batch of a whole sequence without recomputing.
    PlanRequest longer = request("llama3.1-8b", "h200", 8, 131072, 8);
    longer.offload_acts = false;
    longer.recompute = "none";
    const SearchReport rep = search_plans(longer);
    ASSERT_FALSE(rep.best.empty());
    for (const PlanResult & p : rep.best) {
        EXPECT_GT(p.c.layout.cp * p.c.layout.tp, 1);
        EXPECT_TRUE(p.mem.exact);
    }
}

}  // namespace
}  // namespace memfit
