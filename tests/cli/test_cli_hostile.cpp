// Hostile files through the command line: every reader of JSON refuses one nested 200,000 levels
// deep (which used to end memfit with SIGSEGV: a recursive copy of the parsed value overflowed
// the stack) with one line naming the file and a non-zero exit: a --config of train and plan, a
// tokenizer.json, one record of an instruction JSONL (the whole prepare), a model's config.json,
// a checkpoint's meta.json, a safetensors header.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>

#include <sys/stat.h>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "train/checkpoint.h"

using namespace cli_test;

namespace {

std::string nested(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }
constexpr int kDeep = 200000;

fs::path write(const std::string & name, const std::string & text) {
    const fs::path p = scratch(name);
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
}

}  // namespace

TEST(CliHostile, DeeplyNestedJsonIsOneLineEverywhere) {
    const std::string deep = nested(kDeep);
    const fs::path cfg = write("deep_config.json", "{\"model\": " + deep + "}");
    expect_clean_failure(run_memfit("plan --config " + cfg.string()), "nested deeper than 512 levels");
    expect_clean_failure(run_memfit("train --steps 1 --config " + cfg.string()), "nested deeper than 512 levels");

    // The shapes that crashed: a normalizer Sequence of Sequences, and a JSONL record with a deep
    // value beside its messages (both converted recursively after parsing).
    std::string seq;
    for (int i = 0; i < kDeep / 2; ++i) seq += "{\"type\": \"Sequence\", \"normalizers\": [";
    for (int i = 0; i < kDeep / 2; ++i) seq += "]}";
    const fs::path tok = write("deep_tok/tokenizer.json",
                               "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, "
                               "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"normalizer\": " + seq + "}");
    const fs::path text = small_text("deep.txt");
    expect_clean_failure(run_memfit("prepare --tokenizer " + tok.string() + " --input " + text.string() + " --out " +
                                    scratch("deep_tok_out").string()),
                         "tokenizer.json: nested deeper than 512 levels");

    const fs::path jsonl = write("deep.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"
                                               "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"extra\": " +
                                                   deep + "}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
    const std::string qwen = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json";
    expect_clean_failure(run_memfit("prepare --format jsonl --tokenizer " + qwen + " --input " + jsonl.string() +
                                    " --out " + scratch("deep_jsonl_out").string()),
                         "deep.jsonl line 2: nested deeper than 512 levels");

    const fs::path model = write("deep_model/config.json", "{\"model_type\": \"llama\", \"rope_scaling\": " + deep + "}");
    expect_clean_failure(run_memfit("plan --model " + model.string()), "config.json: nested deeper than 512 levels");

    // A checkpoint whose meta.json was replaced: resuming from it is one line.
    const fs::path data = scratch("deep_data"), run = scratch("deep_run");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult t = run_memfit("train --quiet --model nano --seq 32 --batch 2 --steps 2 --checkpoint-every 2 "
                                   "--eval-every 0 --sample 0 --data " + data.string() + " --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err;
    const fs::path ckpt = run / "checkpoints" / "step-000002";
    ASSERT_TRUE(fs::exists(ckpt / "meta.json"));
    std::ofstream(ckpt / "meta.json") << "{\"format\": " << deep << "}";
    expect_clean_failure(run_memfit("train --quiet --model nano --seq 32 --batch 2 --steps 4 --eval-every 0 "
                                    "--sample 0 --data " + data.string() + " --out " + scratch("deep_run2").string() +
                                    " --resume " + ckpt.string()),
                         "meta.json: nested deeper than 512 levels");

    // A safetensors file whose header is nested deep.
    const std::string header = "{\"__metadata__\": {\"x\": " + deep + "}}";
    const fs::path st = write("deep_weights/model.safetensors", "");
    {
        std::ofstream out(st, std::ios::binary);
        const uint64_t n = header.size();
        char len[8];
        std::memcpy(len, &n, 8);
        out.write(len, 8);
        out << header;
    }
    std::ofstream(st.parent_path() / "config.json") << R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 8,
        "n_head": 2, "n_positions": 16, "vocab_size": 256})";
    expect_clean_failure(run_memfit("generate --model " + st.parent_path().string() + " --prompt hi"),
                         "model.safetensors: header: nested deeper than 512 levels");
}

// A stop signal as `memfit train` starts (before the trainer has loaded anything) is a stop like
// one at a step boundary: exit 0 and one line, nothing to save. Before, a SIGTERM in the first
// fraction of a second (two seconds on a loaded machine) killed the run with exit 143. With
// --stop-signals none the signal keeps its default action.
TEST(CliHostile, StopSignalAsTheRunStartsIsAStop) {
    const fs::path out = scratch("stop_at_start"), log = scratch("stop_at_start.log");
    auto run = [&](const std::string & extra) {
        const std::string cmd = "MEMFIT_TEST_SIGNAL_AT_START=TERM " + std::string(MEMFIT_BINARY) +
                                " train --model nano --steps 5 --sample 0 --eval-every 0 --out " + out.string() + extra +
                                " >" + log.string() + " 2>&1";
        const int status = std::system(cmd.c_str());
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    };
    EXPECT_EQ(run(""), 0);
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("stopped by SIGTERM at step 0 of 5 (at a step boundary; before the first step: nothing to "
                        "save)"), std::string::npos) << text;
    EXPECT_FALSE(fs::exists(out / "checkpoints" / "step-000001"));
    EXPECT_EQ(run(" --stop-signals none --out " + scratch("stop_none").string()), 128 + SIGTERM);
}

namespace {

// `memfit ARGS` with an environment and a time limit (a FIFO must not block the test forever).
CmdResult run_env(const std::string & env, const std::string & args) {
    const fs::path out = scratch("env_out.txt"), err = scratch("env_err.txt");
    const std::string cmd = env + " timeout 60 " + std::string(MEMFIT_BINARY) + " " + args + " >" + out.string() +
                            " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    CmdResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream o(out), e(err);
    r.out.assign(std::istreambuf_iterator<char>(o), std::istreambuf_iterator<char>());
    r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
    return r;
}

}  // namespace

// The small ones of the third adversarial pass, each one line with a non-zero exit.
TEST(CliHostile, SmallOnesAreOneLine) {
    const fs::path text = small_text("small_ones.txt");
    expect_clean_failure(run_memfit("train --model nano --steps 1 --out ''"), "--out: an empty name");
    expect_clean_failure(run_memfit("prepare --input " + text.string() + " --out ''"), "--out: an empty name");
    expect_clean_failure(run_memfit("train --model nano --steps 1 --teacher-weights int3"),
                         "--teacher-weights int3: expected");
    expect_clean_failure(run_memfit("train --model nano --steps 1 --distill-alpha 0.3"), "they need --teacher DIR");
    expect_clean_failure(run_memfit("train --model nano --steps 1e30"), "--steps 1e30: not a value this flag takes");
    // A weight decay that flips the weights' sign each update: refused, not blamed on the learning rate.
    expect_clean_failure(run_memfit("train --model nano --steps 3 --weight-decay 1e10"),
                         "--weight-decay 1e+10 with --lr 0.003: each update would scale the weights by");

    // A FIFO named model.safetensors: refused at once, not waited on.
    const fs::path dir = scratch("fifo_model");
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2,
        "n_positions": 16, "vocab_size": 256})";
    ASSERT_EQ(mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
    expect_clean_failure(run_env("", "generate --model " + dir.string() + " --tokenizer bytes --prompt hi"),
                         "not a regular file");

    // A chat template that raises ten megabytes: the message is cut.
    const fs::path tpl = scratch("raise.jinja");
    std::ofstream(tpl) << "{{ raise_exception('A' * 10000000) }}";
    const fs::path jsonl = scratch("raise.jsonl");
    {
        std::ofstream out(jsonl);
        for (int i = 0; i < 4; ++i)
            out << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" << "\n";
    }
    const std::string qwen = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json";
    const CmdResult raised = run_memfit("prepare --format jsonl --tokenizer " + qwen + " --chat-template " +
                                        tpl.string() + " --input " + jsonl.string() + " --out " +
                                        scratch("raise_out").string());
    expect_clean_failure(raised, "(10000000 bytes)");
    EXPECT_LT(raised.err.size(), 1000u);

    // A hardware entry of 1e300 GiB: refused, not clamped to 8 EiB (where everything fits).
    const fs::path data = scratch("huge_hw");
    fs::create_directories(data);
    std::ifstream catalog(std::string(MEMFIT_DATA_DIR) + "/hardware.json");
    std::string hw((std::istreambuf_iterator<char>(catalog)), std::istreambuf_iterator<char>());
    const std::string from = "\"memory_gib\": 80,";
    ASSERT_NE(hw.find(from), std::string::npos);
    hw.replace(hw.find(from), from.size(), "\"memory_gib\": 1e300,");
    std::ofstream(data / "hardware.json") << hw;
    expect_clean_failure(run_env("MEMFIT_DATA_DIR=" + data.string(), "plan --model llama2-7b"), "is past any device");
}

// --teacher-weights sparse24 keeps 2 of every 4 weights: a dense teacher is refused rather than
// silently halved.
TEST(CliHostile, Sparse24TeacherMustBeTwoFourSparse) {
    const fs::path text = small_text("teacher.txt"), data = scratch("teacher_data"), run = scratch("teacher_run"),
                   teacher = scratch("teacher_export");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string shape = " --model nano --seq 32 --batch 2 --eval-every 0 --sample 0 --data " + data.string();
    const CmdResult t = run_memfit("train --quiet --steps 1 --checkpoint-every 1" + shape + " --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err;
    const CmdResult e = run_memfit("export " + (run / "checkpoints").string() + " --out " + teacher.string());
    ASSERT_EQ(e.code, 0) << e.err;
    expect_clean_failure(run_memfit("train --quiet --steps 1" + shape + " --teacher " + teacher.string() +
                                    " --teacher-weights sparse24 --out " + scratch("student").string()),
                         "is not 2:4 sparse");
}

// Two runs with different --out but one --checkpoint-dir: the second is refused at start (they
// used to race on the checkpoints' temporary names, the loser calling the winner's checkpoint
// intact), and the first goes on.
TEST(CliHostile, OneCheckpointFolderOneRun) {
    const fs::path ckpt = scratch("shared_ckpt"), a = scratch("run_a"), b = scratch("run_b"),
                   pid_file = scratch("run_a.pid"), log = scratch("run_a.log");
    const std::string args = " --model nano --seq 32 --batch 2 --eval-every 0 --sample 0 --progress plain "
                             "--checkpoint-every 50 --checkpoint-dir " + ckpt.string();
    const std::string first = std::string(MEMFIT_BINARY) + " train --steps 100000" + args + " --out " + a.string() +
                              " > " + log.string() + " 2>&1 & echo $! > " + pid_file.string();
    ASSERT_EQ(std::system(first.c_str()), 0);
    std::string pid;
    std::ifstream(pid_file) >> pid;
    ASSERT_FALSE(pid.empty());
    for (int i = 0; i < 300 && !fs::exists(a / "metrics.jsonl"); ++i) ::usleep(50000);   // its folders are locked
    const bool started = fs::exists(a / "metrics.jsonl");
    const CmdResult second = started ? run_memfit("train --steps 2" + args + " --out " + b.string()) : CmdResult{};
    EXPECT_EQ(std::system(("kill -KILL " + pid).c_str()), 0);
    ASSERT_TRUE(started) << "the first run did not start";
    expect_clean_failure(second, "--checkpoint-dir " + ckpt.string() + ": another memfit run is writing there");
}

// The checkpoint's trust boundary: meta.json is covered by its own digest, a checkpoint without
// digests loads only with --allow-unverified, and `memfit export` copies the tokenizer files a
// checkpoint names only while their content is the run's (the path is followed as written: it
// used to copy whatever .json it named).
TEST(CliHostile, CheckpointTrustBoundary) {
    const fs::path tok = scratch("trust_tok");
    fs::create_directories(tok);
    const std::string qwen = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/";
    fs::copy_file(qwen + "tokenizer.json", tok / "tokenizer.json");
    fs::copy_file(qwen + "tokenizer_config.json", tok / "tokenizer_config.json");
    const fs::path model = write("trust_model.json", R"({"model_type": "llama", "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": 151669, "max_position_embeddings": 64, "tie_word_embeddings": true})");
    const fs::path text = small_text("trust.txt"), data = scratch("trust_data"), run = scratch("trust_run");
    ASSERT_EQ(run_memfit("prepare --tokenizer " + (tok / "tokenizer.json").string() + " --input " + text.string() +
                         " --out " + data.string()).code, 0);
    const CmdResult t = run_memfit("train --quiet --model " + model.string() + " --seq 32 --batch 2 --steps 1 "
                                   "--checkpoint-every 1 --eval-every 0 --sample 0 --data " + data.string() +
                                   " --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err;
    const std::string ckpt = (run / "checkpoints").string();
    const fs::path e1 = scratch("trust_e1"), e2 = scratch("trust_e2"), e3 = scratch("trust_e3");
    const CmdResult x1 = run_memfit("export " + ckpt + " --out " + e1.string());
    ASSERT_EQ(x1.code, 0) << x1.err;
    EXPECT_TRUE(fs::exists(e1 / "tokenizer.json") && fs::exists(e1 / "tokenizer_config.json"));
    // The file the checkpoint names changed since the run: not copied, and said.
    std::ofstream(tok / "tokenizer.json", std::ios::app) << "\n";
    const CmdResult x2 = run_memfit("export " + ckpt + " --out " + e2.string());
    ASSERT_EQ(x2.code, 0) << x2.err;
    EXPECT_FALSE(fs::exists(e2 / "tokenizer.json"));
    EXPECT_NE((x2.out + x2.err).find("is not the one the run used"), std::string::npos) << x2.out << x2.err;
    // meta.json without its digests: refused, or loaded with a warning under --allow-unverified.
    const fs::path meta = run / "checkpoints" / "step-000001" / "meta.json";
    nlohmann::json m = nlohmann::json::parse(std::ifstream(meta));
    m.erase("checksums");
    m.erase("meta_digest");
    std::ofstream(meta) << m.dump();
    expect_clean_failure(run_memfit("export " + ckpt + " --out " + e3.string()), "pass --allow-unverified");
    const CmdResult x3 = run_memfit("export " + ckpt + " --out " + e3.string() + " --allow-unverified");
    EXPECT_EQ(x3.code, 0) << x3.err;
    EXPECT_NE(x3.err.find("records no digests: loaded unverified"), std::string::npos) << x3.err;
}

// A checkpoint whose digests vouch for a damaged state (as a faulty host would write it): the
// weights scaled 30x, finite and within the plausibility bounds. The resumed loss is orders of
// magnitude above the one the checkpoint recorded: the run stops naming the checkpoint, not --lr.
// The undamaged checkpoint resumes as before.
TEST(CliHostile, ResumedLossThatExplodesNamesTheCheckpoint) {
    const fs::path text = small_text("resumed.txt"), data = scratch("resumed_data"), run = scratch("resumed_run");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string flags = "train --quiet --model nano --seq 32 --batch 2 --eval-every 0 --sample 0 --data " +
                              data.string();
    const CmdResult t = run_memfit(flags + " --steps 3 --checkpoint-every 3 --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err;
    const fs::path root = run / "checkpoints", dir = root / "step-000003";
    memfit::Checkpoint ck = memfit::load_checkpoint(dir.string());
    ASSERT_TRUE(ck.meta.contains("loss")) << ck.meta.dump();
    const double recorded = ck.meta["loss"].get<double>();
    EXPECT_GT(recorded, 0.5);
    const CmdResult good = run_memfit(flags + " --steps 5 --out " + scratch("resumed_good").string() + " --resume " +
                                      dir.string());
    EXPECT_EQ(good.code, 0) << good.err;
    for (float & w : ck.state.params) w *= 30;
    fs::remove_all(dir);
    memfit::save_checkpoint(root.string(), ck, 1);
    const CmdResult bad = run_memfit(flags + " --steps 5 --out " + scratch("resumed_bad").string() + " --resume " +
                                     dir.string());
    expect_clean_failure(bad, "the checkpoint " + dir.string() + " recorded at step 3: the resumed state does not "
                              "continue its run");
    EXPECT_EQ(bad.err.find("--lr"), std::string::npos) << bad.err;
}

// Pipes and devices where a file goes never block or stream forever (they used to: prepare
// --input /dev/zero, a FIFO as --input or --tokenizer); monitor names a run.json whose process is
// not a memfit (an older run.json, without "pid_start", whose pid was reused) and a run that
// ended without summary.json, with --once too; --emit-config "" is refused like --out "".
TEST(CliHostile, SpecialFilesAndDeadRunsAreOneLine) {
    const fs::path dir = scratch("special");
    fs::create_directories(dir);
    const std::string fifo = (dir / "fifo.jsonl").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::string qwen = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json";
    for (const std::string & input : {std::string("/dev/zero"), fifo}) {
        expect_clean_failure(run_memfit("prepare --format jsonl --tokenizer " + qwen + " --input " + input + " --out " +
                                        (dir / "o1").string()),
                             "not a regular file (a pipe or a device?)");
        expect_clean_failure(run_memfit("prepare --format text --tokenizer bytes --input " + input + " --out " +
                                        (dir / "o2").string()),
                             "not a regular file (a pipe or a device?)");
    }
    const std::string fifo_tok = (dir / "tokenizer.json").string();
    ASSERT_EQ(::mkfifo(fifo_tok.c_str(), 0600), 0);
    expect_clean_failure(run_memfit("prepare --tokenizer " + fifo_tok + " --out " + (dir / "o3").string()),
                         "not a regular file (a pipe or a device?)");

    const fs::path run = scratch("special_run");
    fs::create_directories(run);
    std::ofstream(run / "run.json") << "{\"pid\": " << getppid() << "}";   // alive, not a memfit
    expect_clean_failure(run_memfit("monitor " + run.string() + " --wait 1"), "is not running and wrote no summary.json");
    expect_clean_failure(run_memfit("monitor " + run.string() + " --once"), "is not running and wrote no summary.json");
    expect_clean_failure(run_memfit("plan --model nano --hardware cpu --emit-config ''"), "--emit-config");
}
