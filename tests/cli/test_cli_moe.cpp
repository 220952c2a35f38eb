// A mixture of experts end to end on the command line: `memfit train --model qwen3-moe-nano`
// (planned = measured, the routing in metrics.jsonl and report.html), export as the Hub stores
// it and generate from the folder, LoRA on its experts from that folder (PEFT's adapter folder
// and the merged model generating alike), QLoRA with nf4 experts, and what it does not run yet
// refused in one line.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace cli_test;

namespace {

CmdResult in_dir(const fs::path & dir, const std::string & args) { return run_memfit(args, dir); }

}  // namespace

TEST(CliMoe, TrainExportGenerateAndFineTuneTheExperts) {
    const fs::path dir = scratch("moe");
    fs::create_directories(dir);
    const fs::path text = small_text("moe.txt");
    ASSERT_EQ(in_dir(dir, "prepare --tokenizer bytes --input " + text.string() + " --out data").code, 0);
    const std::string common = " --data data --seq 32 --batch 4 --eval-every 0 --eval-batches 1 --threads 2 ";
    CmdResult r = in_dir(dir, "train --model qwen3-moe-nano --steps 6 --sample 0 --progress plain --out run" + common);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_NE(r.out.find("8 experts of 32 (top 2) in 2 of 2 layers"), std::string::npos) << r.out;
    const nlohmann::json s = nlohmann::json::parse(std::ifstream(dir / "run/summary.json"));
    EXPECT_EQ(s["planned"]["peak_live"], s["measured"]["peak_live"]) << s.dump(2);
    std::ifstream metrics(dir / "run/metrics.jsonl");
    std::string line, last;
    while (std::getline(metrics, line)) last = line;
    const nlohmann::json m = nlohmann::json::parse(last);
    ASSERT_TRUE(m.contains("moe/aux_loss")) << last;
    EXPECT_GE(m["moe/aux_loss"].get<double>(), 2.0 - 1e-4);   // k = 2 at best
    EXPECT_GE(m["moe/max_load"].get<double>(), 1.0);
    ASSERT_EQ(m["moe/tokens_per_expert"].size(), 2u);
    double routed = 0;
    for (double v : m["moe/tokens_per_expert"][0]) routed += v;
    EXPECT_EQ(routed, 4.0 * 32 * 2);   // every token's two experts
    EXPECT_NE(slurp(dir / "run/report.html").find("Routing (mixture of experts)"), std::string::npos);

    ASSERT_EQ(in_dir(dir, "export run/checkpoints --out base --dtype fp32").code, 0);
    const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "base/config.json"));
    EXPECT_EQ(cfg["model_type"], "qwen3_moe");
    EXPECT_EQ(cfg["architectures"][0], "Qwen3MoeForCausalLM");
    EXPECT_EQ(cfg["num_experts"], 8);
    EXPECT_EQ(cfg["moe_intermediate_size"], 32);
    const std::string gen = " --prompt ROMEO: --temperature 0 --max-new-tokens 12";
    const CmdResult plain = in_dir(dir, "generate --model base" + gen);
    ASSERT_EQ(plain.code, 0) << plain.err;
    EXPECT_EQ(plain.out.rfind("ROMEO:", 0), 0u) << plain.out;

    // LoRA on every expert (and attention) of the exported model.
    r = in_dir(dir, "train --model base --lora-rank 4 --lora-targets all --lr 1e-2 --steps 6 --sample 0 --quiet "
                    "--out lora" + common);
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_EQ(in_dir(dir, "export lora/checkpoints --out merged --merge-lora --dtype fp32").code, 0);
    ASSERT_EQ(in_dir(dir, "export lora/checkpoints --out adapter --adapter-only").code, 0);
    const std::string ac = slurp(dir / "adapter/adapter_config.json");
    EXPECT_NE(ac.find("\"gate_proj\""), std::string::npos) << ac;
    const CmdResult merged = in_dir(dir, "generate --model merged" + gen);
    const CmdResult peft = in_dir(dir, "generate --model base --adapter adapter" + gen);
    ASSERT_EQ(merged.code, 0) << merged.err;
    ASSERT_EQ(peft.code, 0) << peft.err;
    EXPECT_EQ(peft.out, merged.out);
    EXPECT_NE(merged.out, plain.out) << "the adapters changed nothing";

    // QLoRA: the experts packed in nf4.
    r = in_dir(dir, "train --model base --lora-rank 4 --lora-targets all --base-weights nf4 --steps 2 --sample 0 "
                    "--progress plain --out qlora" + common);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("projections nf4"), std::string::npos) << r.out;

    // What a mixture of experts does not run yet: one line each.
    expect_clean_failure(in_dir(dir, "train --model base --lora-rank 4 --lora-variant dora --steps 1" + common),
                         "--lora-variant dora with a mixture of experts");
    expect_clean_failure(in_dir(dir, "train --model base --mlp-chunk 16 --steps 1" + common), "--mlp-chunk with a mixture");
    expect_clean_failure(in_dir(dir, "train --model nano --moe-aux-loss-coeff 0.1 --steps 1" + common), "has no experts");
    expect_clean_failure(in_dir(dir, "train --model base --ep 2 --steps 1" + common),
                         "--ep 2: 1 rank cannot form expert groups of 2");
    expect_clean_failure(in_dir(dir, "train --model base --moe-capacity-factor 2 --steps 1" + common),
                         "without --ep routing is dropless");

    // Expert parallelism is searched and runnable: the default --json lists layouts with "ep" > 1.
    const CmdResult plan = in_dir(dir, "plan --model qwen3-30b-a3b --hardware h100-80g --gpus 8 --json");
    ASSERT_EQ(plan.code, 0) << plan.err;
    EXPECT_TRUE(std::regex_search(plan.out, std::regex("\"ep\": [2-8],"))) << plan.out.substr(0, 600);
}
