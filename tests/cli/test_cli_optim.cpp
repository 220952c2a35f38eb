// The optimizer choices from the command line: --optimizer adamw-bf16 halves the planned and
// measured optimizer states, trains, and resumes bit for bit; an optimizer the engine does not
// run is one clear line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memfit {
namespace {

using namespace cli_test;

TEST(Cli, OptimizerBf16MomentsHalveTheStatesAndResumeBitwise) {
    const fs::path text = small_text("o24.txt"), data = scratch("o24_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --checkpoint-every 20 ";
    auto summary = [](const fs::path & out) { return nlohmann::json::parse(std::ifstream(out / "summary.json")); };
    auto state = [](const fs::path & out, int step) {
        std::ifstream in(out / ("checkpoints/step-0000" + std::to_string(step) + "/state.safetensors"), std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    const fs::path f32 = scratch("o24_f32"), bf16 = scratch("o24_bf16"), resumed = scratch("o24_resumed");
    ASSERT_EQ(run_memfit(args + "--steps 40 --out " + f32.string()).code, 0);
    const CmdResult r = run_memfit(args + "--steps 40 --optimizer adamw-bf16 --out " + bf16.string());
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json a = summary(f32), b = summary(bf16);
    EXPECT_EQ(b["run_config"]["optimizer"], "adamw-bf16");
    for (const char * kind : {"planned", "measured"}) {
        const auto & key = std::string(kind) == "planned" ? b["planned"]["peak_live"] : b["measured"]["peak_live"];
        EXPECT_EQ(2 * key["optimizer_states"].get<uint64_t>(), a[kind]["peak_live"]["optimizer_states"].get<uint64_t>())
            << kind;
    }
    EXPECT_NEAR(b["final_loss"].get<double>(), a["final_loss"].get<double>(), 0.05 * a["final_loss"].get<double>());
    // Stopped at step 20 and resumed: the end is the uninterrupted run's, byte for byte.
    ASSERT_EQ(run_memfit(args + "--steps 20 --optimizer adamw-bf16 --out " + resumed.string()).code, 0);
    ASSERT_EQ(run_memfit(args + "--steps 40 --optimizer adamw-bf16 --resume auto --out " + resumed.string()).code, 0);
    EXPECT_TRUE(state(resumed, 40) == state(bf16, 40)) << "the resumed adamw-bf16 run ended elsewhere";
    EXPECT_TRUE(state(bf16, 40) != state(f32, 40));

    expect_clean_failure(run_memfit(args + "--steps 2 --optimizer sgd --out " + scratch("o24_sgd").string()),
                         "--optimizer sgd: the engine trains with AdamW (fp32 or bf16 moments) only");
}

}  // namespace
}  // namespace memfit
