// The planner with preference tuning (--objective dpo; model/preference.h): the exact plan of a
// candidate is the engine's program with the pairs' buffers and the reference in it (planned ==
// measured per category; `reference` the copy's weights exactly, dense and packed; none for
// adapters-off and precompute); the analytic model gives the same `reference` bytes and
// activations close to the exact ones; the time model adds the reference's forward and the LM
// head's second one; `memfit plan --objective dpo --json` shows the category, and micro-batches
// that would split a pair are never chosen.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "cli/cli_util.h"
#include "model/config.h"
#include "plan/fit.h"
#include "plan/lora_plan.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

TEST(PlanDpo, ExactAnalyticAndTime) {
    CpuBackend backend;
    Hardware cpu = test::h100_like();
    cpu.name = "cpu";
    cpu.usable = cpu.memory;
    ModelConfig cfg = model_preset("nano");
    cfg.vocab_size = 256;
    for (const char * ref : {"copy", "adapters-off", "precompute"}) {
        for (const char * weights : {"compute", "nf4"}) {
            if (std::string(ref) != "copy" && std::string(weights) != "compute") continue;
            SCOPED_TRACE(std::string(ref) + " " + weights);
            Candidate c;
            c.micro_batch = 4;
            c.compute = DType::bf16;
            c.loss_chunk = 64;
            c.pref.objective = "dpo";
            c.pref.reference = ref;
            c.pref.weights = weights;
            const bool lora = std::string(ref) == "adapters-off";
            if (lora) c.lora_plan = make_lora_plan(cfg, test::lora_options(cfg, 4, BaseWeights::compute, "q,v"));
            const DeviceMemory plan = exact_memory(cfg, cpu, c, 64, backend);

            EngineOptions eo;
            eo.B = 4, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.loss_chunk = 64;
            eo.flash_attention = c.flash();
            const RunConfig run = candidate_run(c, 64);
            eo.pref = preference_options(run);
            if (lora) eo.lora = c.lora_plan->opts;
            Engine e(cfg, backend, eo);
            e.init_params(1);
            std::vector<int32_t> in(256), tg(256);
            test::random_batch(in, tg, cfg.vocab_size, 1);
            const std::vector<float> zeros(4, 0.0f);
            e.train_step(in.data(), tg.data(), OptimHyper{}, nullptr, zeros.data());
            for (size_t cat = 0; cat < kCategoryCount; ++cat) {
                if (Category(cat) == Category::runtime) continue;
                EXPECT_EQ(plan.device.v[cat], e.ledger().live_peak().v[cat]) << kCategoryNames[cat];
            }
            const uint64_t dense = uint64_t(cfg.num_params()) * 2;
            if (std::string(ref) != "copy") EXPECT_EQ(plan.device[Category::reference], 0u);
            else if (std::string(weights) == "compute") EXPECT_EQ(plan.device[Category::reference], dense);
            else EXPECT_LT(plan.device[Category::reference], dense / 2);
            if (!lora) {   // the analytic model (LoRA candidates take the search's LoRA plan)
                const DeviceMemory approx = predict_memory(cfg, cpu, c, 64);
                EXPECT_EQ(approx.device[Category::reference], plan.device[Category::reference]);
                const double acts = double(approx.device[Category::activations]) / double(plan.device[Category::activations]);
                EXPECT_GT(acts, 0.8);
                EXPECT_LT(acts, 1.7);
                Candidate lm = c;
                lm.pref = {};
                const double with = predict_step_time(cfg, test::h100_like(), c, 64, 1).compute;
                const double without = predict_step_time(cfg, test::h100_like(), lm, 64, 1).compute;
                // A reference forward is about a third of a step's compute; precompute adds only
                // the head's second forward.
                if (std::string(ref) == "copy") EXPECT_GT(with, 1.25 * without);
                else EXPECT_LT(with, 1.25 * without);
                EXPECT_GT(with, without);
            }
        }
    }
}

TEST(PlanDpo, PlanCommandShowsTheReferenceAndKeepsPairsWhole) {
    const cli_test::CmdResult p = cli_test::run_memfit(
        "plan --model nano --objective dpo --reference copy --seq 128 --global-batch 6 --hardware h100-80g --gpus 1 "
        "--zero 0 --tp 1 --pp 1 --json");
    ASSERT_EQ(p.code, 0) << p.err;
    const nlohmann::json plan = nlohmann::json::parse(p.out);
    const auto & best = plan.at("best");
    ASSERT_FALSE(best.empty());
    EXPECT_GT(best.at(0).at("memory").at("per_device").at("reference").get<uint64_t>(), 0u) << p.out;
    for (const auto & b : best) EXPECT_EQ(b.at("micro_batch").get<int>() % 2, 0) << b.dump();
    const cli_test::CmdResult pre = cli_test::run_memfit(
        "plan --model nano --objective dpo --reference precompute --seq 128 --global-batch 6 --hardware h100-80g "
        "--gpus 1 --zero 0 --tp 1 --pp 1 --json");
    ASSERT_EQ(pre.code, 0) << pre.err;
    EXPECT_EQ(nlohmann::json::parse(pre.out).at("best").at(0).at("memory").at("per_device").value("reference", 0), 0);
    // --max-micro-batch counts in whole pairs.
    const cli_test::CmdResult most = cli_test::run_memfit(
        "plan --model llama2-7b --objective dpo --lora-rank 16 --seq 1024 --precision bf16 --hardware h100-80g --gpus 1 "
        "--max-micro-batch");
    ASSERT_EQ(most.code, 0) << most.err;
    const size_t at = most.out.find("largest micro-batch that fits: ");
    ASSERT_NE(at, std::string::npos) << most.out;
    const int mb = std::stoi(most.out.substr(at + 31));
    EXPECT_GT(mb, 2);
    EXPECT_EQ(mb % 2, 0) << most.out;
}

}  // namespace
}  // namespace memfit
