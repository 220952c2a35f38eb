// Fine-tuning on instruction data from the command line: JSON lines of conversations prepared
// with Qwen3's tokenizer.json and its chat template, then a LoRA fine-tune of a small LLaMA-family
// model, padded and packed. The loss counts only the assistant's tokens (the mask's own tests are
// Instruct.*; here: the trained-token counts the run reports are the mask's), the plan equals the
// measurement, and the exported model chats.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "cli_util.h"
#include "data/data_loader.h"
#include "data/token_file.h"

using namespace cli_test;

namespace {

const std::string kQwen3 = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json";

// Conversations of one to three turns of sums, with a system message in every third.
fs::path write_conversations(const std::string & name, int n) {
    const fs::path p = scratch(name);
    std::ofstream out(p);
    for (int i = 0; i < n; ++i) {
        nlohmann::ordered_json messages = nlohmann::ordered_json::array();
        if (i % 3 == 0) messages.push_back({{"role", "system"}, {"content", "Answer in one sentence."}});
        for (int t = 0; t <= i % 3; ++t) {
            const int a = 3 + 7 * i + t, b = 11 + 5 * t;
            messages.push_back({{"role", "user"}, {"content", "What is " + std::to_string(a) + " plus " +
                                                                  std::to_string(b) + "?"}});
            messages.push_back({{"role", "assistant"}, {"content", std::to_string(a) + " plus " + std::to_string(b) +
                                                                       " is " + std::to_string(a + b) + "."}});
        }
        out << nlohmann::ordered_json{{"messages", messages}}.dump() << "\n";
    }
    return p;
}

// A LLaMA-family model at Qwen3's vocabulary, small enough for a test.
fs::path write_model(const std::string & name) {
    const fs::path p = scratch(name);
    std::ofstream(p) << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 151669, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": false})";
    return p;
}

nlohmann::json read_json(const fs::path & p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
}

}  // namespace

TEST(CliInstruct, LoraFineTunesOnConversationsPaddedAndPackedAsPlanned) {
    const fs::path jsonl = write_conversations("chat.jsonl", 30), model = write_model("tiny-llama.json");
    const fs::path data = scratch("chat_data");
    const CmdResult p = run_memfit("prepare --format jsonl --input " + jsonl.string() + " --tokenizer " + kQwen3 +
                                   " --val-fraction 0.2 --out " + data.string());
    ASSERT_EQ(p.code, 0) << p.err;
    EXPECT_NE(p.out.find("prepared 30 records (0 left out: no trained token) with chat template "), std::string::npos)
        << p.out;
    const nlohmann::json meta = read_json(data / "meta.json");
    EXPECT_EQ(meta["format"], "jsonl");
    EXPECT_EQ(meta["records"], 30);
    const memfit::TokenFile train((data / "train.bin").string());
    ASSERT_TRUE(train.documents());
    EXPECT_EQ(train.num_docs(), 24u);
    EXPECT_EQ(train.pad_id(), 151643);   // Qwen's pad_token, <|endoftext|>

    const int B = 4, T = 64, steps = 3;
    for (const bool packing : {false, true}) {
        SCOPED_TRACE(packing ? "packed" : "padded");
        const fs::path run = scratch(packing ? "chat_run_packed" : "chat_run_padded");
        const std::string args = "train --model " + model.string() + " --data " + data.string() + " --seq " +
                                 std::to_string(T) + " --micro-batch " + std::to_string(B) + " --lora-rank 4 "
                                 "--lora-targets q,k,v,o --loss-chunk 64 --lr 1e-3 --warmup 0 --eval-every 0 "
                                 "--eval-batches 2 --sample 0 --log-every 1 --progress plain --checkpoint-every 3 ";
        const CmdResult t = run_memfit(args + "--steps " + std::to_string(steps) + " --out " + run.string() +
                                       (packing ? " --packing" : ""));
        ASSERT_EQ(t.code, 0) << t.err << t.out;
        EXPECT_NE(t.out.find(packing ? "(no document sees another)" : "one per row in 24 rows of 64 (padded)"),
                  std::string::npos) << t.out;
        // Planned = measured, category by category.
        const nlohmann::json s = read_json(run / "summary.json");
        EXPECT_EQ(s["planned"]["peak_live"], s["measured"]["peak_live"]);
        EXPECT_EQ(s["planned"]["reserved"], s["measured"]["reserved"]);
        // Packing adds one persistent buffer of document starts: 4 bytes a token.
        EXPECT_EQ(s["run_config"]["packing"], packing);
        // The trained tokens the run counted are the mask's: the same rows again from the loader.
        memfit::DataLoader loader((data / "train.bin").string(), B, T, 1337, packing);
        std::vector<int32_t> in(size_t(B) * T), tg(in.size()), ds(in.size());
        long long trained = 0;
        for (int i = 0; i < steps; ++i) {
            loader.next(in.data(), tg.data(), ds.data());
            for (const int32_t x : tg) trained += x != -100 ? 1 : 0;
        }
        EXPECT_EQ(s["trained_tokens"].get<long long>(), trained);
        EXPECT_LT(trained, (long long) B * T * steps);   // prompts and padding do not train
        std::ifstream metrics(run / "metrics.jsonl");
        std::string line;
        long long logged = 0;
        while (std::getline(metrics, line)) logged += nlohmann::json::parse(line)["trained_tokens"].get<long long>();
        EXPECT_EQ(logged, trained);
        EXPECT_TRUE(std::isfinite(s["final_val_loss"].get<double>()));
        if (!packing) continue;
        // The fine-tuned model answers a chat turn (reply only, up to the end-of-turn token).
        const fs::path hf = scratch("chat_hf");
        ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --merge-lora --out " + hf.string()).code, 0);
        // The export carries the run's tokenizer.json and tokenizer_config.json (its chat template).
        EXPECT_TRUE(fs::exists(hf / "tokenizer.json") && fs::exists(hf / "tokenizer_config.json"));
        const CmdResult g = run_memfit("generate --model " + hf.string() +
                                       " --chat --system 'Be brief.' --prompt 'What is 2 plus 3?' --max-new-tokens 6 "
                                       "--temperature 0");
        ASSERT_EQ(g.code, 0) << g.err;
        EXPECT_EQ(g.out.find("What is 2 plus 3?"), std::string::npos) << g.out;
        EXPECT_NE(g.err.find("generate: "), std::string::npos) << g.err;
        expect_clean_failure(run_memfit("generate --model " + hf.string() + " --chat --prompt hi --tokenizer bytes"),
                             "no chat template");
        // The rows depend on packing: a resume keeps it.
        const std::string resume = "--steps 4 --resume " + (run / "checkpoints").string() + " --out " +
                                   scratch("chat_resumed").string();
        expect_clean_failure(run_memfit(args + resume), "packing");
        const CmdResult r = run_memfit(args + resume + " --packing");
        EXPECT_EQ(r.code, 0) << r.err;
    }
    // --packing needs documents, and stays off tensor parallelism.
    expect_clean_failure(run_memfit("train --model nano --seq 32 --steps 1 --packing --out " +
                                    scratch("chat_text").string()),
                         "the bundled corpus is text");
    expect_clean_failure(run_memfit("plan --model nano --seq 32 --hardware cpu --gpus 2 --tp 2 --packing"),
                         "--packing with --tp 2");
}

TEST(CliInstruct, BadInstructionDataIsOneLine) {
    const fs::path bad = scratch("bad.jsonl");
    std::ofstream(bad) << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                          "\"content\": \"yo\"}]}\n{not json}\n";
    expect_clean_failure(run_memfit("prepare --input " + bad.string() + " --tokenizer " + kQwen3 + " --out " +
                                    scratch("bad_out").string()),
                         "bad.jsonl line 2: not valid JSON at line 1, column 2");
    expect_clean_failure(run_memfit("prepare --input " + bad.string() + " --tokenizer bytes --out " +
                                    scratch("bad_out").string()),
                         "needs a chat template");
    expect_clean_failure(run_memfit("prepare --input " + bad.string() + " --tokenizer bytes --chat-template nope "
                                    "--out " + scratch("bad_out").string()),
                         "--chat-template 'nope'");
}
