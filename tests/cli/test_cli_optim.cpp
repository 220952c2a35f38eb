// The optimizer choices from the command line: --optimizer adamw-bf16 halves the planned and
// measured optimizer states, adamw-8bit takes them to at most 0.27x; both train and resume bit
// for bit; an optimizer the engine does not run is one clear line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memfit {
namespace {

using namespace cli_test;

TEST(Cli, SmallerMomentsShrinkTheStatesAndResumeBitwise) {
    const fs::path text = small_text("o24.txt"), data = scratch("o24_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --checkpoint-every 20 ";
    auto summary = [](const fs::path & out) { return nlohmann::json::parse(std::ifstream(out / "summary.json")); };
    auto state = [](const fs::path & out, int step) {
        std::ifstream in(out / ("checkpoints/step-0000" + std::to_string(step) + "/state.safetensors"), std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    const fs::path f32 = scratch("o24_f32");
    ASSERT_EQ(run_memfit(args + "--steps 40 --out " + f32.string()).code, 0);
    const nlohmann::json a = summary(f32);
    for (const std::string opt : {"adamw-bf16", "adamw-8bit"}) {
        SCOPED_TRACE(opt);
        const fs::path out = scratch("o24_" + opt), resumed = scratch("o24_resumed_" + opt);
        const CmdResult r = run_memfit(args + "--steps 40 --optimizer " + opt + " --out " + out.string());
        ASSERT_EQ(r.code, 0) << r.err;
        const nlohmann::json b = summary(out);
        EXPECT_EQ(b["run_config"]["optimizer"], opt);
        const double ratio = opt == "adamw-bf16" ? 0.5 : 0.27;
        for (const char * kind : {"planned", "measured"}) {
            const double mine = b[kind]["peak_live"]["optimizer_states"].get<double>();
            const double theirs = a[kind]["peak_live"]["optimizer_states"].get<double>();
            if (opt == "adamw-bf16") EXPECT_EQ(mine, ratio * theirs) << kind;
            else EXPECT_LE(mine, ratio * theirs) << kind;
        }
        EXPECT_NEAR(b["final_loss"].get<double>(), a["final_loss"].get<double>(), 0.05 * a["final_loss"].get<double>());
        // Stopped at step 20 and resumed: the end is the uninterrupted run's, byte for byte.
        ASSERT_EQ(run_memfit(args + "--steps 20 --optimizer " + opt + " --out " + resumed.string()).code, 0);
        ASSERT_EQ(run_memfit(args + "--steps 40 --optimizer " + opt + " --resume auto --out " + resumed.string()).code, 0);
        EXPECT_TRUE(state(resumed, 40) == state(out, 40)) << "the resumed run ended elsewhere";
        EXPECT_TRUE(state(out, 40) != state(f32, 40));
    }

    expect_clean_failure(run_memfit(args + "--steps 2 --optimizer sgd --out " + scratch("o24_sgd").string()),
                         "--optimizer sgd: the engine trains with AdamW (fp32, bf16 or 8-bit moments) only");
}

}  // namespace
}  // namespace memfit
