// `memfit generate --prompts --out` end to end: a tiny LLaMA trained here serves a file of
// requests at once, each greedy reply the one `generate --prompt` streams alone, in the input's
// order, through a pool small enough to pre-empt; the planned bytes are the measured ones; `memfit
// plan --inference` answers for the folder on this machine; bad files and flags are one line.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace cli_test;

namespace {

std::vector<nlohmann::json> jsonl(const fs::path & p) {
    std::vector<nlohmann::json> out;
    std::istringstream in(slurp(p));
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
}

void write(const fs::path & p, const std::string & text) { std::ofstream(p) << text; }

// generate's "memory planned A, measured B" (A and B as printed).
std::pair<std::string, std::string> planned_measured(const std::string & err) {
    const size_t at = err.find("memory planned ");
    if (at == std::string::npos) return {};
    const size_t comma = err.find(", measured ", at), colon = err.find(':', comma);
    return {err.substr(at + 15, comma - at - 15), err.substr(comma + 11, colon - comma - 11)};
}

}  // namespace

TEST(Cli, GeneratePromptsFileServesEveryRequestAsAlone) {
    const fs::path text = small_text("serve.txt");
    const fs::path data = scratch("serve_data"), run = scratch("serve_run"), hf = scratch("serve_hf"),
                   dir = scratch("serve_files");
    fs::create_directories(dir);
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    ASSERT_EQ(run_memfit("train --quiet --model llama-nano --data " + data.string() + " --batch 4 --seq 64 --steps 8 "
                         "--lr 3e-3 --eval-every 0 --sample 0 --checkpoint-every 8 --out " + run.string()).code, 0);
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    const std::vector<std::string> prompts = {"ROMEO:", "First Citizen: Before we", "O", "KING HENRY: Once more",
                                              "JULIET: What is in a name?", "Thy"};
    std::string file;
    for (size_t i = 0; i < prompts.size(); ++i)
        file += nlohmann::json{{"prompt", prompts[i]}, {"max_tokens", 6 + 5 * int(i)}, {"temperature", 0}}.dump() + "\n";
    write(dir / "prompts.jsonl", file);
    const std::string serve = "generate --model " + hf.string() + " --prompts " + (dir / "prompts.jsonl").string();
    const CmdResult a = run_memfit(serve + " --out " + (dir / "a.jsonl").string());
    ASSERT_EQ(a.code, 0) << a.err;
    const auto [planned, measured] = planned_measured(a.err);
    EXPECT_FALSE(planned.empty()) << a.err;
    EXPECT_EQ(planned, measured) << a.err;
    const std::vector<nlohmann::json> res = jsonl(dir / "a.jsonl");
    ASSERT_EQ(res.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE(prompts[i]);
        EXPECT_EQ(res[i]["index"], i);
        EXPECT_EQ(res[i]["finish_reason"], "length");
        EXPECT_EQ(res[i]["completion_tokens"], 6 + 5 * int(i));
        EXPECT_EQ(res[i]["prompt_tokens"], prompts[i].size());   // bytes: one token each
        const CmdResult one = run_memfit("generate --model " + hf.string() + " --prompt '" + prompts[i] +
                                         "' --temperature 0 --max-new-tokens " + std::to_string(6 + 5 * i));
        ASSERT_EQ(one.code, 0) << one.err;
        std::string bytes;   // the bytes tokenizer: token i is byte i
        for (const int id : res[i]["token_ids"]) bytes += char(id);
        EXPECT_EQ(prompts[i] + bytes + "\n", one.out);
    }
    // A pool of 10 blocks of 8 positions (4 KiB each), one request's whole context and a spare,
    // and 8-row steps: pre-emptions, the same replies.
    const CmdResult b = run_memfit(serve + " --out " + (dir / "b.jsonl").string() +
                                   " --kv-block 8 --kv-memory 40KiB --max-num-batched-tokens 8 --max-num-seqs 4");
    ASSERT_EQ(b.code, 0) << b.err;
    const std::vector<nlohmann::json> again = jsonl(dir / "b.jsonl");
    int preempted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(again[i]["token_ids"], res[i]["token_ids"]);
        preempted += again[i]["preemptions"].get<int>();
    }
    EXPECT_GT(preempted, 0) << b.err;
    EXPECT_NE(b.err.find("KV pool 40.00 KiB (10 blocks of 8 positions)"), std::string::npos) << b.err;

    // An int8 cache: (32 codes + 2 scales) bytes a position's keys of a layer against fp32's 128.
    const CmdResult q = run_memfit(serve + " --out " + (dir / "q.jsonl").string() + " --kv-dtype int8");
    ASSERT_EQ(q.code, 0) << q.err;
    EXPECT_NE(q.err.find("KV cache paged, int8"), std::string::npos) << q.err;
    const auto [qp, qm] = planned_measured(q.err);
    EXPECT_EQ(qp, qm) << q.err;
    EXPECT_EQ(jsonl(dir / "q.jsonl").size(), prompts.size());

    // --memory-budget: the pool gets what the weights (489 KiB), activations and workspace leave.
    const CmdResult m = run_memfit(serve + " --out " + (dir / "m.jsonl").string() + " --memory-budget 1MiB");
    ASSERT_EQ(m.code, 0) << m.err;
    const std::string planned_line = planned_measured(m.err).first;
    EXPECT_NE(planned_line.find("KiB"), std::string::npos) << m.err;   // under 1 MiB
    expect_clean_failure(run_memfit(serve + " --out " + (dir / "m.jsonl").string() + " --memory-budget 400KiB"),
                         "--memory-budget 400.00 KiB: the weights, activations and workspace take");

    // The plan on this machine for that pool: 4 requests of 64 positions.
    const CmdResult p = run_memfit("plan --inference --hardware cpu --model " + hf.string() +
                                   " --weights fp32 --context 64 --concurrency 4 --kv-block 16 --json");
    ASSERT_EQ(p.code, 0) << p.err;
    const nlohmann::json j = nlohmann::json::parse(p.out);
    EXPECT_EQ(j["kv_cache"]["blocks"], 16);
    EXPECT_EQ(j["kv_cache"]["bytes"], 16 * 16 * j["kv_cache"]["bytes_per_token"].get<int64_t>());
    EXPECT_TRUE(j["fits"].get<bool>());

    // Mistakes: one line each, and the results file untouched.
    write(dir / "bad.jsonl", "{\"prompt\": \"x\"}\n{\"prompt\": \"y\", \"max_token\": 3}\n");
    expect_clean_failure(run_memfit(serve + "x --out " + (dir / "c.jsonl").string()), "no such file");
    expect_clean_failure(run_memfit("generate --model " + hf.string() + " --prompts " + (dir / "bad.jsonl").string() +
                                    " --out " + (dir / "a.jsonl").string()),
                         "bad.jsonl line 2: unknown key \"max_token\"");
    EXPECT_EQ(jsonl(dir / "a.jsonl").size(), prompts.size());
    write(dir / "chat.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    expect_clean_failure(run_memfit("generate --model " + hf.string() + " --prompts " + (dir / "chat.jsonl").string() +
                                    " --out " + (dir / "d.jsonl").string()),
                         "need a chat template");
    expect_clean_failure(run_memfit(serve), "--out RESULTS.jsonl");
    expect_clean_failure(run_memfit(serve + " --out " + (dir / "e.jsonl").string() + " --kv-memory 1KiB"),
                         "--kv-memory 1.00 KiB holds 0 KV blocks");
    // A prompt past the context is that request's error; the others run.
    write(dir / "long.jsonl", nlohmann::json{{"prompt", std::string(300, 'a')}}.dump() + "\n" +
                                  nlohmann::json{{"prompt", "ROMEO:"}, {"max_tokens", 4}}.dump() + "\n");
    const CmdResult l = run_memfit("generate --model " + hf.string() + " --prompts " + (dir / "long.jsonl").string() +
                                   " --out " + (dir / "f.jsonl").string() + " --seq 64");
    ASSERT_EQ(l.code, 0) << l.err;
    const std::vector<nlohmann::json> lr = jsonl(dir / "f.jsonl");
    ASSERT_EQ(lr.size(), 2u);
    EXPECT_NE(lr[0]["error"].get<std::string>().find("context of 64 positions"), std::string::npos) << lr[0];
    EXPECT_EQ(lr[1]["completion_tokens"], 4);
}
