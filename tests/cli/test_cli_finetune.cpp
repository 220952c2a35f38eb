// Fine-tuning end to end as a user of torchtune, Unsloth or PEFT would run it: docs/fine-tune.md's
// recipe (read from docs/fine-tune.md, run as written on a tiny Llama with a 259-token ChatML tokenizer),
// the defaults a fine-tune takes (and a pretraining run keeps), the final checkpoint every run
// writes, and generation from a checkpoint folder and from a base with a PEFT adapter.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "core/text.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cli_test::CmdResult;
using cli_test::scratch;
using cli_test::slurp;

namespace {

const std::string kTiny = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/tiny-chat";

// `memfit ARGS` run inside `dir` (the recipe's commands use relative paths).
CmdResult run_in(const fs::path & dir, const std::string & args) { return cli_test::run_memfit(args, dir); }

// A folder with chat.jsonl (40 conversations), its prepared data (chat-data, the tiny tokenizer)
// and a base model folder `base` (a 2-layer, 64-wide Llama pretrained 20 steps, exported with the
// tokenizer files beside it).
fs::path chat_workspace(const std::string & name, const std::string & base = "base") {
    const fs::path dir = scratch(name);
    fs::create_directories(dir);
    const char * qa[][2] = {{"What is 2 plus 3?", "5."}, {"Say hello.", "Hello!"}, {"Name a colour.", "Blue."},
                            {"What is 1 plus 1?", "2."}};
    std::ofstream chat(dir / "chat.jsonl");
    for (int i = 0; i < 40; ++i)
        chat << nlohmann::json{{"messages",
                                {{{"role", "user"}, {"content", qa[i % 4][0]}},
                                 {{"role", "assistant"}, {"content", qa[i % 4][1]}}}}}.dump()
             << "\n";
    chat.close();
    std::ofstream(dir / "tiny.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 259, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";
    CmdResult r = run_in(dir, "prepare --format jsonl --input chat.jsonl --tokenizer " + kTiny +
                                  "/tokenizer.json --out pre-data");
    EXPECT_EQ(r.code, 0) << r.err;
    r = run_in(dir, "train --quiet --model tiny.json --data pre-data --steps 20 --seq 64 --eval-every 0 --sample 0 "
                    "--out pre");
    EXPECT_EQ(r.code, 0) << r.err;
    r = run_in(dir, "export pre/checkpoints --out " + base);
    EXPECT_EQ(r.code, 0) << r.err;
    return dir;
}

// docs/fine-tune.md's recipe: the code block that starts with `memfit prepare --format jsonl`.
std::vector<std::string> readme_recipe() {
    return cli_test::doc_commands(fs::path(MEMFIT_SOURCE_DIR) / "docs/fine-tune.md",
                                  "memfit prepare --format jsonl --input chat.jsonl");
}

}  // namespace

TEST(FineTune, TheDocumentedRecipeRunsAsWritten) {
    const std::vector<std::string> recipe = readme_recipe();
    ASSERT_EQ(recipe.size(), 4u) << "docs/fine-tune.md's recipe: prepare, train, export, generate";
    const fs::path dir = chat_workspace("recipe", "MODEL");
    std::vector<CmdResult> out;
    for (const std::string & cmd : recipe) {
        ASSERT_TRUE(cmd.starts_with("memfit ")) << cmd;
        out.push_back(run_in(dir, cmd.substr(7)));
        ASSERT_EQ(out.back().code, 0) << cmd << "\n" << out.back().err << out.back().out;
    }
    // The fine-tune defaults, printed: LoRA's learning rate and warmup, every projection adapted.
    const std::string & train = out[1].out;
    EXPECT_NE(train.find("schedule (LoRA fine-tune: MODEL/ holds weights"), std::string::npos) << train;
    EXPECT_NE(train.find("lr 0.0002 (the LoRA fine-tune default)"), std::string::npos) << train;
    EXPECT_NE(train.find("--epochs 3 of"), std::string::npos) << train;
    EXPECT_NE(train.find("on q,k,v,o,gate,up,down"), std::string::npos) << train;
    // The end-of-run sample is a chat turn: the first validation conversation's prompt.
    EXPECT_NE(train.find("sample (a turn of the validation split's first conversation"), std::string::npos) << train;
    EXPECT_NE(train.find("<|im_start|>user"), std::string::npos) << train;
    // The final checkpoint export read, written in the training precision with the stop ids.
    const nlohmann::json config = nlohmann::json::parse(slurp(dir / "tuned/config.json"));
    EXPECT_EQ(config["torch_dtype"], "bfloat16");
    EXPECT_EQ(config["eos_token_id"], 258);   // <|im_end|>: the tokenizer's eos and the turn's end
    EXPECT_EQ(nlohmann::json::parse(slurp(dir / "tuned/generation_config.json"))["eos_token_id"], 258);
    EXPECT_TRUE(fs::exists(dir / "tuned/tokenizer_config.json"));
    EXPECT_FALSE(out[3].out.empty());
    EXPECT_NE(out[3].err.find("generate: "), std::string::npos) << out[3].err;
}

TEST(FineTune, DefaultsFollowTheRunAndExplicitFlagsWin) {
    const fs::path dir = chat_workspace("defaults");
    // A preset pretrains: 3e-3 and 100 warmup steps (a short run, a test or a demo, is not warned
    // about them); a warmup the user chose that fills the run is.
    CmdResult r = run_in(dir, "train --model llama-nano --steps 30 --seq 32 --batch 2 --eval-every 0 --sample 0 "
                              "--out p");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("schedule (pretraining: a fresh model): 30 steps (--steps), lr 0.003 (the pretraining "
                         "default), warmup 100 steps (the pretraining default)"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("warning: the warmup"), std::string::npos) << r.out;
    r = run_in(dir, "train --model llama-nano --steps 30 --warmup 40 --seq 32 --batch 2 --eval-every 0 --sample 0 "
                    "--out p2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("warning: the warmup (40 steps) is not shorter than the run (30 steps)"), std::string::npos)
        << r.out;
    // A folder with weights, fully fine-tuned: 2e-5, 3% warmup; steps from --epochs.
    r = run_in(dir, "train --model base --data pre-data --epochs 2 --seq 64 --batch 4 --eval-every 0 --sample 0 "
                    "--out f");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("schedule (full fine-tune: base holds weights)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("lr 2e-05 (the full fine-tune default)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(3% of the steps, the full fine-tune default)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(--epochs 2 of "), std::string::npos) << r.out;
    // summary.json holds the values as a user writes them (2e-05, 0.1), not float32 noise.
    const std::string summary = slurp(dir / "f/summary.json");
    EXPECT_NE(summary.find("\"lr\": 2e-05"), std::string::npos);
    EXPECT_NE(summary.find("\"weight-decay\": 0.1,"), std::string::npos);
    EXPECT_EQ(summary.find("0.10000000149"), std::string::npos);
    // LoRA from the folder: 2e-4 on every projection; --warmup-ratio, then --warmup, win.
    r = run_in(dir, "train --model base --data pre-data --lora-rank 4 --steps 10 --warmup-ratio 0.5 --seq 64 --batch 4 "
                    "--eval-every 0 --sample 0 --out l");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("lr 0.0002 (the LoRA fine-tune default), warmup 5 steps (50% of the steps)"),
              std::string::npos) << r.out;
    EXPECT_NE(r.out.find("on q,k,v,o,gate,up,down"), std::string::npos) << r.out;
    r = run_in(dir, "train --model base --data pre-data --lora-rank 4 --lora-targets q,v --steps 10 --warmup 2 "
                    "--warmup-ratio 0.5 --lr 1e-3 --seq 64 --batch 4 --eval-every 0 --sample 0 --out l2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("lr 0.001, warmup 2 steps (--warmup)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("on q,v"), std::string::npos) << r.out;
    cli_test::expect_clean_failure(run_in(dir, "train --model base --data pre-data --steps 10 --epochs 1 --out x"),
                                   "--steps 10 and --epochs 1: give one");
}

TEST(FineTune, EveryRunEndsWithACheckpointThatReplacesAnotherRuns) {
    const fs::path dir = scratch("save-final");
    fs::create_directories(dir);
    const std::string run = "train --model llama-nano --seq 32 --batch 2 --eval-every 0 --sample 0 --out r ";
    CmdResult r = run_in(dir, run + "--steps 3");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir / "r/checkpoints/step-000003/meta.json"));
    EXPECT_NE(r.out.find("checkpoint r/checkpoints/step-000003"), std::string::npos) << r.out;
    // Another run into the same --out: warned at the start, and the earlier checkpoint goes only
    // once this run's is written.
    r = run_in(dir, run + "--steps 2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("holds 1 checkpoint of another run (newest step-000003)"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::exists(dir / "r/checkpoints/step-000002/meta.json"));
    EXPECT_FALSE(fs::exists(dir / "r/checkpoints/step-000003"));
    r = run_in(dir, "export r/checkpoints --out m");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("(step 2)"), std::string::npos) << r.out;
    // --save-final false: none, and export says what writes one.
    r = run_in(dir, "train --model llama-nano --seq 32 --batch 2 --eval-every 0 --sample 0 --out n --steps 2 "
                    "--save-final false");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(fs::exists(dir / "n/checkpoints/step-000002"));
    cli_test::expect_clean_failure(run_in(dir, "export n/checkpoints --out m2"), "--save-final");
}

// The adapters include the untied head's and embedding's (lm_head, embed_tokens): PEFT's folder
// lists them, its lora_embedding_A in PEFT's [r, V], and generate merges them.
TEST(FineTune, GenerateReadsACheckpointAndABaseWithAPeftAdapter) {
    const fs::path dir = chat_workspace("adapter");
    CmdResult r = run_in(dir, "train --quiet --model base --data pre-data --lora-rank 8 --lora-targets embed_tokens,all,lm_head "
                              "--lr 1e-2 --steps 15 --seq 64 --batch 4 --eval-every 0 --sample 0 --out lora");
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_EQ(run_in(dir, "export lora/checkpoints --out merged --merge-lora --dtype fp32").code, 0);
    ASSERT_EQ(run_in(dir, "export lora/checkpoints --out adapter --adapter-only").code, 0);
    const std::string config = memfit::test::read_text((dir / "adapter/adapter_config.json").string());
    EXPECT_NE(config.find("\"lm_head\""), std::string::npos) << config;
    EXPECT_NE(config.find("\"embed_tokens\""), std::string::npos) << config;
    EXPECT_EQ(memfit::SafetensorsFile::open((dir / "adapter/adapter_model.safetensors").string())
                  .info("base_model.model.model.embed_tokens.lora_embedding_A").shape,
              (std::vector<int64_t>{8, 259}));
    const std::string gen = " --prompt 'What is' --temperature 0 --max-new-tokens 24";
    const CmdResult merged = run_in(dir, "generate --model merged" + gen);
    const CmdResult peft = run_in(dir, "generate --model base --adapter adapter" + gen);
    const CmdResult ckpt = run_in(dir, "generate --model lora/checkpoints" + gen);
    ASSERT_EQ(merged.code, 0) << merged.err;
    ASSERT_EQ(peft.code, 0) << peft.err;
    ASSERT_EQ(ckpt.code, 0) << ckpt.err;
    EXPECT_GT(merged.out.size(), std::string("What is").size());
    EXPECT_EQ(peft.out, merged.out);
    EXPECT_EQ(ckpt.out, merged.out);
    const CmdResult plain = run_in(dir, "generate --model base" + gen);
    EXPECT_NE(plain.out, merged.out) << "the adapters changed nothing";
    cli_test::expect_clean_failure(run_in(dir, "generate --model nowhere" + gen), "neither a model folder");
    cli_test::expect_clean_failure(run_in(dir, "generate --model base --adapter base" + gen),
                                   "no adapter_config.json");
}

TEST(FineTune, SamplesEscapeControlBytes) {
    EXPECT_EQ(memfit::printable_text(std::string("a\x1b" "c\x07", 4) + std::string(1, '\0') + "\x7f"),
              "a\\x1bc\\x07\\x00\\x7f");
    EXPECT_EQ(memfit::printable_text("line\n\ttab \xc3\xa9"), "line\n\ttab \xc3\xa9");
}
