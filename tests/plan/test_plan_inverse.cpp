// The planner's questions beyond "does it fit": the longest sequence, the largest micro-batch and
// the largest model that fit (each answer fits, the next value up does not), parameter offload on
// one device (ZeRO-3 over one rank, which train runs), what --explain says of accumulated
// gradients, and hints that were checked by a search and never repeat what the request already
// has.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "backend/cuda_sizing.h"
#include "core/error.h"
#include "core/units.h"
#include "plan/hardware.h"
#include "plan/inverse.h"
#include "plan/plan_report.h"
#include "plan/search.h"
#include "plan_request.h"
#include "test_util.h"

using namespace memfit;

namespace {

PlanRequest request(const char * model, const char * hw, int gpus, int seq, int global_batch) {
    return test::plan_request(model, hw, gpus, seq, global_batch, 2);
}

bool fits(PlanRequest r) {
    r.hint = false;
    try {
        return !search_plans(r).best.empty();
    } catch (const ConfigError &) {
        return false;
    }
}

}  // namespace

TEST(PlanInverse, LongestSequenceFitsAndTheNextStepDoesNot) {
    PlanRequest r = request("llama3.2-3b", "rtx4090", 1, 128, 1);
    const Largest l = largest_seq(r);
    ASSERT_GT(l.value, 0);
    EXPECT_EQ(l.value % kSeqStep, 0);
    ASSERT_GT(l.next, l.value) << "every position fits on a 24 GB device?";
    EXPECT_EQ(l.next, l.value + kSeqStep);
    EXPECT_FALSE(l.report.best.empty());
    EXPECT_EQ(l.request.run.seq, l.value);
    for (const PlanResult & p : l.report.best) EXPECT_LE(p.mem.total(), r.hw.memory);
    r.run.seq = l.next;
    EXPECT_FALSE(fits(r));
    // Past every position: the model's limit is the answer.
    const Largest all = largest_seq(request("llama-nano", "h100-80g", 1, 64, 1));
    EXPECT_EQ(all.value, model_preset("llama-nano").max_seq);
    EXPECT_EQ(all.next, 0);
}

TEST(PlanInverse, LargestMicroBatchFitsAndOneMoreDoesNot) {
    PlanRequest r = request("llama2-7b", "h100-80g", 8, 4096, 0);
    r.micro_batch = 1;   // the global batch follows: micro-batch x accumulation x dp
    const Largest l = largest_micro_batch(r);
    ASSERT_GT(l.value, 1);
    ASSERT_EQ(l.next, l.value + 1);
    EXPECT_EQ(l.report.best.front().c.micro_batch, l.value);
    r.micro_batch = l.next;
    r.grad_accum = 1;
    EXPECT_FALSE(fits(r));
    r.run.global_batch = 64;
    EXPECT_THROW(largest_micro_batch(r), ConfigError);   // the global batch would decide it
}

TEST(PlanInverse, LargestModelOfAFamilyIsTheFirstThatFitsFromTheTop) {
    const std::vector<std::string> llama2 = model_family("llama2");
    EXPECT_EQ(llama2, (std::vector<std::string>{"llama2-7b", "llama2-13b", "llama2-70b"}));
    EXPECT_THROW(model_family("nonsense"), ConfigError);
    EXPECT_GE(model_family("presets").size(), 20u);
    const LargestModel m = largest_model(llama2, [](const std::string & name) {
        return request(name.c_str(), "h200", 1, 2048, 8);
    });
    EXPECT_EQ(m.model, "llama2-13b");   // 70B's optimizer states alone pass 141 GB
    ASSERT_EQ(m.tried.size(), 2u);
    EXPECT_EQ(m.tried[0].first, "llama2-70b");
    EXPECT_NE(m.tried[0].second.find("needs"), std::string::npos) << m.tried[0].second;
    EXPECT_EQ(m.tried[1].second, "");
    EXPECT_FALSE(m.at.report.best.empty());
}

// On one device the search tries parameter offload as ZeRO-3 over one rank, which train runs: a
// 3B model's long sequence fits one RTX 4090 with the activations resident only so, exactly
// planned; with activation offload searched too, the optimizer's offload and the activations'
// fit it faster. A 70B full fine-tune still does not fit one H200: the gradients stay on the
// device, and the reason says so.
TEST(PlanInverse, OneDeviceSearchesParameterOffloadOverZero3) {
    PlanRequest r = request("llama3.2-3b", "rtx4090", 1, 40960, 1);
    r.offload_acts = false;
    const SearchReport rep = search_plans(r);
    ASSERT_FALSE(rep.best.empty());
    for (const PlanResult & p : rep.best) {
        EXPECT_TRUE(p.runnable()) << p.refused;
        EXPECT_EQ(p.c.layout.offload, Offload::optimizer_params);
        EXPECT_EQ(p.c.layout.zero, 3);
        EXPECT_TRUE(p.mem.exact);   // the engine's recorded program
        EXPECT_LT(p.mem.device[Category::parameters], uint64_t(3.21e9 * 2) / 4);   // gathered layers, not the weights
    }
    r.offload = Offload::optimizer;   // without the weights offloaded, nothing fits
    EXPECT_TRUE(search_plans(r).best.empty());
    r.offload_acts.reset();           // ... unless the activations leave too
    const SearchReport acts = search_plans(r);
    ASSERT_FALSE(acts.best.empty());
    EXPECT_TRUE(acts.best[0].c.layout.offload_acts);
    EXPECT_TRUE(acts.best[0].mem.exact);
    EXPECT_GT(acts.best[0].mem.host, acts.best[0].mem.device[Category::activations]);
    EXPECT_GT(acts.best[0].time.tokens_per_s, rep.best[0].time.tokens_per_s);

    // Nothing fits: "closest" is the candidate needing the fewest bytes (parameter offload's,
    // short by its gradients), not the fastest of the rejected.
    PlanRequest big = request("llama3-70b", "h200", 1, 2048, 8);
    const SearchReport none = search_plans(big);
    EXPECT_TRUE(none.best.empty());
    ASSERT_EQ(none.closest.size(), 1u);
    const PlanResult & c = none.closest.front();
    EXPECT_EQ(c.c.layout.offload, Offload::optimizer_params);
    EXPECT_NE(c.why.find("gradients"), std::string::npos) << c.why;
    for (const PlanResult & p : none.rejected) EXPECT_LE(c.mem.total(), p.mem.total());
    EXPECT_NE(none.rejected.front().c.layout.offload, Offload::optimizer_params);   // the fastest: another
    EXPECT_NE(format_plan(big, none, false).find("nothing fits: closest, " + c.why.substr(0, 40)), std::string::npos);
}

// --explain says how the best row's accumulated gradients reach the ZeRO shard: every
// micro-batch's buckets reduce-scattered into it, so their bytes are the same at 8 and 16
// micro-batches (and equal the row's gradients).
TEST(PlanInverse, ExplainShowsTheGradientPathUnderAccumulation) {
    std::vector<uint64_t> bytes;
    for (int accum : {8, 16}) {
        PlanRequest r = request("llama3-8b", "h100-80g", 8, 8192, 8 * accum);
        r.zero = 3, r.tp = 1, r.pp = 1, r.micro_batch = 1, r.recompute = "none", r.explain = true;
        const SearchReport rep = search_plans(r);
        ASSERT_FALSE(rep.best.empty());
        const std::string text = format_plan(r, rep, false);
        const std::string line = fmt::format("gradients: each of the {} micro-batches' buckets (bf16) reduce-scattered", accum);
        EXPECT_NE(text.find(line), std::string::npos) << text;
        EXPECT_NE(text.find(format_bytes(rep.best.front().mem.device[Category::gradients]) + ", the same at any"),
                  std::string::npos) << text;
        bytes.push_back(rep.best.front().mem.device[Category::gradients]);
        r.explain = false;
        EXPECT_EQ(format_plan(r, rep, false).find("reduce-scattered"), std::string::npos);
    }
    EXPECT_EQ(bytes[0], bytes[1]);
}

TEST(PlanInverse, HintsAreCheckedAndNotWhatTheRequestHas) {
    // A fixed ZeRO stage that cannot hold the states: the hint drops it, and then something fits.
    PlanRequest r = request("llama2-13b", "h100-80g", 8, 4096, 64);
    r.zero = 0, r.tp = 1, r.pp = 1, r.offload = Offload::none, r.offload_acts = false, r.recompute = "none";
    const SearchReport rep = search_plans(r);
    ASSERT_TRUE(rep.best.empty());
    EXPECT_NE(rep.hint.find("dropping --zero 0 fits"), std::string::npos) << rep.hint;
    r.zero.reset();
    EXPECT_TRUE(fits(r));
    // Nothing fixed that matters, optimizer offload searched: never "add --offload optimizer".
    PlanRequest one = request("llama2-13b", "rtx4090", 1, 4096, 1);
    const SearchReport none = search_plans(one);
    ASSERT_TRUE(none.best.empty());
    EXPECT_EQ(none.hint.find("use --offload optimizer\n"), std::string::npos);
    EXPECT_EQ(none.hint.rfind("--offload optimizer", 0), std::string::npos) << none.hint;
    // Too big for anything the request can change: what is left.
    PlanRequest huge = request("llama2-70b", "rtx4090", 1, 4096, 1);
    huge.lora = nullptr;
    const SearchReport h = search_plans(huge);
    ASSERT_TRUE(h.best.empty());
    EXPECT_FALSE(h.hint.empty());
}
