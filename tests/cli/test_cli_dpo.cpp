// Preference tuning end to end as a TRL or torchtune user would run it: docs/fine-tune.md's DPO
// recipe (read from the page, run as written on a tiny Llama with a 259-token ChatML tokenizer),
// TRL's metrics in metrics.jsonl, a LoRA run's peak equal to its plan and below a frozen copy's by
// about the base's bytes, precompute's table kept beside the data and read again on resume, and
// the clear one-line refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cli_test::CmdResult;
using cli_test::scratch;
using cli_test::slurp;

namespace {

const std::string kTiny = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/tiny-chat";

CmdResult run_in(const fs::path & dir, const std::string & args) { return cli_test::run_memfit(args, dir); }

// A folder with prefs.jsonl (40 pairs: a question, the right answer chosen, a wrong one
// rejected) and a base model folder MODEL (a 2-layer, 64-wide Llama pretrained 10 steps on the
// answers, exported with the tokenizer files beside it).
fs::path pref_workspace(const std::string & name) {
    const fs::path dir = scratch(name);
    fs::create_directories(dir);
    const char * qa[][3] = {{"What is 2 plus 3?", "5.", "7."}, {"Say hello.", "Hello!", "Goodbye."},
                            {"Name a colour.", "Blue.", "Seven."}, {"What is 1 plus 1?", "2.", "11."}};
    std::ofstream prefs(dir / "prefs.jsonl"), chat(dir / "chat.jsonl");
    for (int i = 0; i < 40; ++i) {
        const auto * r = qa[i % 4];
        prefs << nlohmann::json{{"prompt", {{{"role", "user"}, {"content", r[0]}}}},
                                {"chosen", {{{"role", "assistant"}, {"content", r[1]}}}},
                                {"rejected", {{{"role", "assistant"}, {"content", r[2]}}}}}.dump()
              << "\n";
        chat << nlohmann::json{{"messages", {{{"role", "user"}, {"content", r[0]}}, {{"role", "assistant"}, {"content", r[1]}}}}}
                    .dump()
             << "\n";
    }
    prefs.close();
    chat.close();
    std::ofstream(dir / "tiny.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 259, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";
    CmdResult r = run_in(dir, "prepare --format jsonl --input chat.jsonl --tokenizer " + kTiny +
                                  "/tokenizer.json --out chat-data");
    EXPECT_EQ(r.code, 0) << r.err;
    r = run_in(dir, "train --quiet --model tiny.json --data chat-data --steps 10 --seq 64 --eval-every 0 --sample 0 "
                    "--out pre");
    EXPECT_EQ(r.code, 0) << r.err;
    r = run_in(dir, "export pre/checkpoints --out MODEL");
    EXPECT_EQ(r.code, 0) << r.err;
    return dir;
}

// docs/fine-tune.md's DPO recipe: the code block that starts with `memfit prepare --format preference`.
std::vector<std::string> dpo_recipe() {
    return cli_test::doc_commands(fs::path(MEMFIT_SOURCE_DIR) / "docs/fine-tune.md",
                                  "memfit prepare --format preference --input prefs.jsonl");
}

std::vector<nlohmann::json> metrics(const fs::path & run) {
    std::vector<nlohmann::json> rows;
    std::istringstream in(slurp(run / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
    return rows;
}

uint64_t peak(const nlohmann::json & summary, const char * which, const char * category) {
    return summary.at(which).at("peak_live").value(category, uint64_t{0});
}

}  // namespace

TEST(CliDpo, TheDocumentedRecipeRunsAsWrittenAndLogsTrlMetrics) {
    const std::vector<std::string> recipe = dpo_recipe();
    ASSERT_EQ(recipe.size(), 3u) << "docs/fine-tune.md's DPO recipe: prepare, train, export";
    const fs::path dir = pref_workspace("recipe");
    std::vector<CmdResult> out;
    for (const std::string & cmd : recipe) {
        ASSERT_TRUE(cmd.starts_with("memfit ")) << cmd;
        out.push_back(run_in(dir, cmd.substr(7) + (cmd.find(" train ") != std::string::npos ? " --log-every 1" : "")));
        ASSERT_EQ(out.back().code, 0) << cmd << "\n" << out.back().err << out.back().out;
    }
    const std::string & train = out[1].out;
    EXPECT_NE(train.find("dpo: sigmoid loss, beta 0.1; reference adapters-off; each micro-batch of 8 rows holds 4 pairs"),
              std::string::npos) << train;
    const std::vector<nlohmann::json> rows = metrics(dir / "dpo");
    ASSERT_FALSE(rows.empty());
    // The first step: the policy is its reference, so the loss is log 2 and every reward 0.
    EXPECT_NEAR(rows.front().at("loss").get<double>(), 0.693147, 2e-3);
    EXPECT_NEAR(rows.front().at("rewards/margins").get<double>(), 0.0, 1e-6);
    for (const char * k : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected"})
        EXPECT_TRUE(rows.back().contains(k)) << k;
    EXPECT_TRUE(rows.back().contains("eval_rewards/margins")) << rows.back().dump();
    EXPECT_LT(rows.back().at("logps/chosen").get<double>(), 0.0);
    EXPECT_TRUE(fs::exists(dir / "dpo-tuned/model.safetensors"));
    const std::string report = slurp(dir / "dpo/report.html");
    EXPECT_NE(report.find("Preference (DPO)"), std::string::npos);
    EXPECT_NE(report.find("rewards/margins"), std::string::npos);
    const nlohmann::json summary = nlohmann::json::parse(slurp(dir / "dpo/summary.json"));
    EXPECT_EQ(summary.at("run_config").at("objective"), "dpo") << summary.at("run_config").dump();
}

TEST(CliDpo, LoraPeakEqualsItsPlanAndACopyAddsTheBase) {
    const fs::path dir = pref_workspace("peaks");
    ASSERT_EQ(run_in(dir, "prepare --format preference --input prefs.jsonl --tokenizer MODEL/tokenizer.json --out p").code, 0);
    const std::string common = "train --quiet --model MODEL --data p --objective dpo --lora-rank 4 --seq 64 --batch 4 "
                               "--steps 2 --eval-every 0 --sample 0 ";
    ASSERT_EQ(run_in(dir, common + "--out off").code, 0);
    const CmdResult copy = run_in(dir, common + "--reference copy --out copy");
    ASSERT_EQ(copy.code, 0) << copy.err;
    // The hints after a copy's run name the reference it could do without; none splits a pair.
    const CmdResult hinted = run_in(dir, "train --model MODEL --data p --objective dpo --lora-rank 4 --seq 64 --batch 2 "
                                         "--steps 1 --eval-every 0 --sample 0 --reference copy --out hinted");
    ASSERT_EQ(hinted.code, 0) << hinted.err;
    EXPECT_NE(hinted.out.find("hint: --reference precompute would lower the planned peak"), std::string::npos)
        << hinted.out;
    EXPECT_EQ(hinted.out.find("--micro-batch 1"), std::string::npos) << hinted.out;
    const nlohmann::json off = nlohmann::json::parse(slurp(dir / "off/summary.json"));
    const nlohmann::json cp = nlohmann::json::parse(slurp(dir / "copy/summary.json"));
    EXPECT_EQ(peak(off, "planned", "total"), peak(off, "measured", "total"));
    EXPECT_EQ(peak(cp, "planned", "total"), peak(cp, "measured", "total"));
    EXPECT_EQ(peak(off, "planned", "reference"), 0u);
    // The copy holds the base once more: its bytes, as the LoRA base holds them (fp32 here).
    const uint64_t trainable = off.at("config").at("trainable_params").get<uint64_t>();
    const uint64_t base = peak(off, "planned", "parameters") - 4 * trainable;
    EXPECT_EQ(peak(cp, "planned", "reference"), base);
    EXPECT_EQ(peak(cp, "planned", "total") - peak(off, "planned", "total"), base);
}

TEST(CliDpo, PrecomputeKeepsItsTableBesideTheDataAndResumes) {
    const fs::path dir = pref_workspace("precompute");
    ASSERT_EQ(run_in(dir, "prepare --format preference --input prefs.jsonl --tokenizer MODEL/tokenizer.json --out p").code, 0);
    const std::string common = "train --model MODEL --data p --objective dpo --reference precompute --lr 1e-3 --warmup 0 --seq 64 "
                               "--batch 4 --eval-every 0 --sample 0 --checkpoint-every 2 ";
    const CmdResult first = run_in(dir, common + "--steps 2 --out r");
    ASSERT_EQ(first.code, 0) << first.err;
    EXPECT_NE(first.out.find("computed in"), std::string::npos) << first.out;
    int tables = 0;
    for (const auto & e : fs::directory_iterator(dir / "p")) tables += e.path().filename().string().starts_with("reference_logps-");
    EXPECT_EQ(tables, 2);   // train and val
    const CmdResult again = run_in(dir, common + "--steps 4 --resume r/checkpoints --out r");
    ASSERT_EQ(again.code, 0) << again.err;
    EXPECT_NE(again.out.find("log-probabilities of"), std::string::npos) << again.out;
    EXPECT_EQ(again.out.find("computed in"), std::string::npos) << again.out;
    // The reference stays the starting model: the policy's margin over it grows, the loss falls below log 2.
    const std::vector<nlohmann::json> rows = metrics(dir / "r");
    ASSERT_FALSE(rows.empty());
    EXPECT_LT(rows.back().at("loss").get<double>(), 0.69);
    EXPECT_GT(rows.back().at("rewards/margins").get<double>(), 0.0);
}

TEST(CliDpo, RefusalsAreOneLine) {
    const fs::path dir = pref_workspace("refusals");
    ASSERT_EQ(run_in(dir, "prepare --format preference --input prefs.jsonl --tokenizer MODEL/tokenizer.json --out p").code, 0);
    cli_test::expect_clean_failure(run_in(dir, "train --model MODEL --data chat-data --objective dpo --steps 1 --seq 32"),
                                   "--objective dpo trains on pairs of answers");
    cli_test::expect_clean_failure(
        run_in(dir, "train --model MODEL --data p --objective dpo --steps 1 --seq 32 --micro-batch 3"),
        "--micro-batch 4");
    cli_test::expect_clean_failure(
        run_in(dir, "train --model MODEL --data p --objective dpo --reference adapters-off --steps 1 --seq 32"),
        "--reference adapters-off switches LoRA's adapters off");
    cli_test::expect_clean_failure(run_in(dir, "train --model MODEL --data p --dpo-beta 0.5 --steps 1 --seq 32"),
                                   "add --objective dpo");
}
