// The memfit command on bad input: one clear line on stderr, a non-zero exit, never a crash;
// and a short happy path through prepare and train.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using namespace cli_test;

// The help says what the flags take: --model LLaMA configs and folders too, --schedule all three.
TEST(Cli, TrainHelpNamesEveryChoice) {
    const CmdResult h = run_memfit("train --help");
    ASSERT_EQ(h.code, 0) << h.err;
    EXPECT_NE(h.out.find("a Hugging Face config.json (GPT-2 or LLaMA)"), std::string::npos) << h.out;
    EXPECT_NE(h.out.find("interleaved:V"), std::string::npos) << h.out;
}

// --version's first line names the version, the git revision and the build type, then a cpu and a
// cuda line (with or without a GPU, exit 0); the help's usage lines name the program.
TEST(Cli, VersionAndUsageNameTheProgram) {
    const CmdResult v = run_memfit("--version");
    ASSERT_EQ(v.code, 0) << v.err;
    const std::string first = v.out.substr(0, v.out.find('\n'));
    const std::regex first_line(R"(memfit [0-9]+\.[0-9]+\.[0-9]+ \(([0-9a-f]{7,}(-dirty)?|unknown), [A-Za-z]+\))");
    EXPECT_TRUE(std::regex_match(first, first_line)) << first;
    EXPECT_NE(v.out.find("\ncpu: "), std::string::npos) << v.out;
    EXPECT_NE(v.out.find("\ncuda: "), std::string::npos) << v.out;
    const CmdResult h = run_memfit("--help");
    ASSERT_EQ(h.code, 0) << h.err;
    EXPECT_EQ(h.out.find("Usage: memfit [OPTIONS] SUBCOMMAND"), 0u) << h.out;
    const CmdResult p = run_memfit("plan --help");
    ASSERT_EQ(p.code, 0) << p.err;
    EXPECT_NE(p.out.find("Usage: memfit plan [OPTIONS]"), std::string::npos) << p.out;
}

TEST(Cli, MissingDataFolder) {
    expect_clean_failure(run_memfit("train --data /nonexistent/memfit --steps 1"), "/nonexistent/memfit");
}

TEST(Cli, MissingTextFile) {
    expect_clean_failure(run_memfit("prepare --input /nonexistent/corpus.txt --out " + scratch("p0").string()),
                         "/nonexistent/corpus.txt");
}

TEST(Cli, EmptyTextFile) {
    const fs::path empty = scratch("empty.txt");
    std::ofstream(empty).flush();
    expect_clean_failure(run_memfit("prepare --input " + empty.string() + " --out " + scratch("p1").string()),
                         "empty");
}

TEST(Cli, TokenFileWithWrongHeader) {
    const fs::path dir = scratch("badheader");
    fs::create_directories(dir);
    std::ofstream(dir / "train.bin") << "this is not a token file at all, just some text padding it out";
    expect_clean_failure(run_memfit("train --model nano --data " + dir.string() + " --steps 1"), "train.bin");
}

TEST(Cli, UnknownPreset) {
    expect_clean_failure(run_memfit("train --model gpt7-ultra --steps 1"), "unknown model 'gpt7-ultra'");
}

TEST(Cli, MalformedFlag) {
    const CmdResult r = run_memfit("train --batch lots");
    expect_clean_failure(r, "--batch");
    const CmdResult r2 = run_memfit("train --no-such-flag");
    expect_clean_failure(r2, "no-such-flag");
}

// What the adversarial pass (scripts/adversarial.sh) found accepted: NaN and inf through the
// numeric checks (CLI11's Range lets NaN by), LoRA values with LoRA off, empty numbers, a
// wrapped generate seed, a missing calibration file, a config key given twice or naming
// another config, and a --tokenizer other than the one the --data was prepared with.
TEST(Cli, ValuesNoRunTakesAreRefused) {
    for (const char * flags : {"--lr nan", "--lr inf", "--min-lr-ratio nan", "--adam-beta1 nan", "--adam-epsilon inf",
                               "--lora-alpha -1", "--lora-dropout nan", "--zero ''", "--bucket-mb ''", "--clip 1e300"})
        expect_clean_failure(run_memfit(std::string("train --model nano --steps 1 ") + flags),
                             std::string(flags).substr(0, std::string(flags).find(' ')));
    expect_clean_failure(run_memfit("generate --model /nonexistent --top-p nan"), "--top-p");
    expect_clean_failure(run_memfit("generate --model /nonexistent --seed -1"), "--seed");
    expect_clean_failure(run_memfit("plan --calibration /nonexistent/cal.json"), "--calibration /nonexistent/cal.json");
    const fs::path twice = scratch("v22_twice.json"), nested = scratch("v22_nested.json");
    std::ofstream(twice) << R"({"model": "nano", "zero_optimization": {"stage": 1, "stage": 2}})";
    std::ofstream(nested) << R"({"config": "other.json"})";
    expect_clean_failure(run_memfit("train --steps 1 --config " + twice.string()), "\"stage\" appears twice");
    expect_clean_failure(run_memfit("train --steps 1 --config " + nested.string()), "cannot name another");
    const fs::path text = small_text("v22.txt"), data = scratch("v22_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    expect_clean_failure(run_memfit("train --model nano --steps 1 --tokenizer gpt2 --data " + data.string() +
                                    " --out " + scratch("v22_o").string()), "was prepared with bytes");
    expect_clean_failure(run_memfit("train --model nano --steps 1 --lora-targets nope --data " + data.string() +
                                    " --out " + scratch("v22_t").string()), "'nope' is not a GPT-2 module");
}

TEST(Cli, MalformedBudget) {
    expect_clean_failure(run_memfit("train --model nano --memory-budget 12xyz --steps 1"), "12xyz");
}

TEST(Cli, MissingFixture) {
    expect_clean_failure(run_memfit("verify /nonexistent/fixture.safetensors"), "/nonexistent/fixture.safetensors");
}

TEST(Cli, PrepareTrainAndBudget) {
    const fs::path text = small_text("small.txt");
    const fs::path data = scratch("data"), out = scratch("run");
    CmdResult p = run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string());
    ASSERT_EQ(p.code, 0) << p.err << p.out;
    ASSERT_TRUE(fs::exists(data / "train.bin"));

    // Too small a budget: refused before training, with the numbers.
    CmdResult b = run_memfit("train --model nano --data " + data.string() + " --batch 4 --seq 32 --steps 2 --memory-budget 256KiB");
    expect_clean_failure(b, "does not fit");
    EXPECT_NE(b.err.find("256.00 KiB"), std::string::npos) << b.err;

    CmdResult t = run_memfit("train --model nano --data " + data.string() + " --batch 4 --seq 32 --steps 6 --eval-every 3 "
                       "--eval-batches 2 --log-every 2 --sample 20 --memory-budget 64MiB --out " + out.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    EXPECT_NE(t.out.find("memory plan"), std::string::npos);
    EXPECT_NE(t.out.find("planned vs measured"), std::string::npos);
    EXPECT_EQ(t.out.find("differs"), std::string::npos) << t.out;
    nlohmann::json s = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    EXPECT_EQ(s["planned"]["peak_live"], s["measured"]["peak_live"]);
    EXPECT_EQ(s["planned"]["reserved"], s["measured"]["reserved"]);
    EXPECT_GT(s["peak_rss_bytes"].get<uint64_t>(), 0u);
    std::ifstream metrics(out / "metrics.jsonl");
    std::string line;
    int lines = 0;
    bool saw_val = false;
    while (std::getline(metrics, line)) {
        ++lines;
        saw_val |= nlohmann::json::parse(line).contains("val_loss");
    }
    EXPECT_GE(lines, 3);
    EXPECT_TRUE(saw_val);
}

TEST(Cli, VerifyFixture) {
    const CmdResult r = run_memfit(std::string("verify ") + MEMFIT_TEST_DATA + "/gpt2_tiny.safetensors");
    ASSERT_EQ(r.code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["ok"].get<bool>());
}

TEST(Cli, TokenizeStdin) {
    const fs::path text = scratch("hello.txt");
    std::ofstream(text) << "Hello world";
    const CmdResult r = run_memfit("tokenize --tokenizer gpt2 < " + text.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[15496,995]"));
    const CmdResult b = run_memfit("tokenize --tokenizer bytes < " + text.string());
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(nlohmann::json::parse(b.out), nlohmann::json::parse("[72,101,108,108,111,32,119,111,114,108,100]"));
}

TEST(Cli, ProfileWritesReportAndTrace) {
    const fs::path text = small_text("profile.txt");
    const fs::path data = scratch("pdata"), out = scratch("prof");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult r = run_memfit("profile --model nano --data " + data.string() + " --batch 2 --seq 32 --steps 2 "
                                   "--json --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    // --json: every stdout line is a JSON object.
    std::istringstream lines(r.out);
    std::string line;
    int status_lines = 0;
    while (std::getline(lines, line)) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains("step")) ++status_lines;
    }
    EXPECT_EQ(status_lines, 2);
    std::ifstream html(out / "report.html");
    const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
    EXPECT_NE(page.find("<svg"), std::string::npos);
    EXPECT_NE(page.find("data-peak-total"), std::string::npos);
    const auto trace = nlohmann::json::parse(std::ifstream(out / "trace.json"));
    EXPECT_TRUE(trace["traceEvents"].is_array());
    EXPECT_GT(trace["traceEvents"].size(), 10u);
}

TEST(Cli, MemoryTechniqueFlags) {
    const fs::path text = small_text("tech.txt");
    const fs::path data = scratch("tech_data"), out = scratch("tech_run"), ctl = scratch("budget.txt");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --model nano --data " + data.string() + " --seq 32 --steps 3 --eval-every 0 "
                             "--eval-batches 1 --sample 0 --progress plain --out " + out.string();

    // bf16 with accumulation: the plan says what is stored how; summary records the precision.
    CmdResult b = run_memfit(base + " --micro-batch 2 --grad-accum 2 --precision bf16");
    ASSERT_EQ(b.code, 0) << b.err << b.out;
    EXPECT_NE(b.out.find("bf16 with fp32 master weights, fp32 gradients (accumulated over micro-batches)"),
              std::string::npos) << b.out;
    nlohmann::json s = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    EXPECT_EQ(s["config"]["precision"], "bf16");
    EXPECT_EQ(s["planned"]["peak_live"], s["measured"]["peak_live"]);

    // fp16 reports its loss scale.
    CmdResult h = run_memfit(base + " --batch 2 --precision fp16");
    ASSERT_EQ(h.code, 0) << h.err << h.out;
    EXPECT_NE(h.out.find("fp16 loss scaling:"), std::string::npos) << h.out;

    // --fit auto keeps the global batch and says what it chose.
    CmdResult f = run_memfit(base + " --batch 8 --fit auto --precision auto --memory-budget 8MiB");
    ASSERT_EQ(f.code, 0) << f.err << f.out;
    EXPECT_NE(f.out.find("--fit auto chose"), std::string::npos) << f.out;
    EXPECT_NE(f.out.find("global batch 8 kept"), std::string::npos) << f.out;
    expect_clean_failure(run_memfit(base + " --batch 8 --fit auto --memory-budget 64KiB"), "smallest configuration");

    // --recompute budget explains its choice; a lowered budget file re-plans the run.
    CmdResult r = run_memfit(base + " --batch 4 --recompute budget --memory-budget 8MiB");
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_NE(r.out.find("--recompute budget:"), std::string::npos) << r.out;
    std::ofstream(ctl) << "3MiB\n";
    CmdResult c = run_memfit(base + " --batch 4 --budget-file " + ctl.string());
    ASSERT_EQ(c.code, 0) << c.err << c.out;
    EXPECT_NE(c.out.find("re-planned to micro-batch"), std::string::npos) << c.out;

    expect_clean_failure(run_memfit(base + " --precision fp8"), "--precision");
    expect_clean_failure(run_memfit(base + " --precision auto"), "--fit auto");
    expect_clean_failure(run_memfit(base + " --recompute sometimes"), "--recompute 'sometimes'");
}

TEST(Cli, ResumeContinuesBitForBit) {
    const fs::path text = small_text("resume.txt");
    const fs::path data = scratch("resume_data"), a = scratch("resume_a"), b = scratch("resume_b"),
                   c = scratch("resume_c");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --model nano --data " + data.string() + " --micro-batch 2 --grad-accum 2 --seq 32 "
                             "--eval-every 3 --eval-batches 1 --sample 0 --progress quiet --checkpoint-every 5 ";
    ASSERT_EQ(run_memfit(base + "--steps 10 --out " + a.string()).code, 0);
    ASSERT_EQ(run_memfit(base + "--steps 5 --out " + b.string()).code, 0);
    const CmdResult r = run_memfit(base + "--steps 10 --resume " + (b / "checkpoints").string() + " --out " + c.string());
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    auto slurp = [](const fs::path & p) {
        std::ifstream in(p, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    const std::string straight = slurp(a / "checkpoints/step-000010/state.safetensors");
    ASSERT_GT(straight.size(), 1000u);
    EXPECT_TRUE(straight == slurp(c / "checkpoints/step-000010/state.safetensors"))
        << "10 straight steps and 5 + resume + 5 differ";
    expect_clean_failure(run_memfit(base + "--steps 10 --seq 16 --resume " + (b / "checkpoints").string()), "seq");
    expect_clean_failure(run_memfit(base + "--steps 5 --resume " + (b / "checkpoints").string()), "must be larger");
    expect_clean_failure(run_memfit(base + "--steps 10 --resume " + (b / "nothing").string()), "no such checkpoint");
}

TEST(Cli, ExportAndTrainFromTheFolder) {
    const fs::path text = small_text("export.txt");
    const fs::path data = scratch("export_data"), run = scratch("export_run"), hf = scratch("export_hf"),
                   again = scratch("export_again");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --data " + data.string() + " --batch 2 --seq 32 --eval-every 0 "
                             "--eval-batches 1 --sample 0 ";
    ASSERT_EQ(run_memfit(base + "--quiet --model nano --steps 3 --checkpoint-every 3 --out " + run.string()).code, 0);
    const CmdResult e = run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string());
    ASSERT_EQ(e.code, 0) << e.err;
    ASSERT_TRUE(fs::exists(hf / "config.json"));
    ASSERT_TRUE(fs::exists(hf / "model.safetensors"));
    const CmdResult t = run_memfit(base + "--progress plain --model " + hf.string() + " --steps 2 --out " +
                                   again.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    EXPECT_NE(t.out.find("weights from " + hf.string()), std::string::npos) << t.out;
    expect_clean_failure(run_memfit("export " + (run / "nothing").string() + " --out " + hf.string()),
                         "no such checkpoint");
}

// --share-layers through the commands: the run's report names the sharing and its parameters, the
// checkpoint resumes, export writes a plain model (every block; no sharing key) that trains
// unshared, and bench (a run configuration too) plans the divided parameters.
TEST(Cli, ShareLayersTrainResumeExportAndBench) {
    const fs::path text = small_text("share.txt");
    const fs::path data = scratch("share_data"), run = scratch("share_run"), hf = scratch("share_hf"),
                   again = scratch("share_again");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --data " + data.string() + " --batch 2 --seq 32 --eval-every 0 "
                             "--eval-batches 1 --sample 0 --model nano ";
    const CmdResult t = run_memfit(base + "--progress plain --share-layers 2 --steps 3 --checkpoint-every 3 --out " +
                                   run.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    EXPECT_NE(t.out.find("1 blocks shared 2 ways"), std::string::npos) << t.out;
    const CmdResult r = run_memfit(base + "--quiet --share-layers 2 --steps 5 --resume " + (run / "checkpoints").string() +
                                   " --out " + run.string());
    EXPECT_EQ(r.code, 0) << r.err;
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    std::ifstream cf(hf / "config.json");
    const nlohmann::json cfg = nlohmann::json::parse(cf);
    EXPECT_EQ(cfg.at("n_layer"), 2);
    EXPECT_FALSE(cfg.contains("memfit_share_layers")) << cfg.dump();
    const CmdResult u = run_memfit(base.substr(0, base.find("--model")) + "--progress plain --model " + hf.string() +
                                   " --steps 1 --out " + again.string());
    ASSERT_EQ(u.code, 0) << u.err << u.out;
    EXPECT_EQ(u.out.find("shared"), std::string::npos) << u.out;
    auto bench_params = [&](int g) {
        const CmdResult b = run_memfit("bench --model nano --batch 2 --seq 32 --steps 1 --warmup 0 --threads 1 "
                                       "--share-layers " + std::to_string(g));
        EXPECT_EQ(b.code, 0) << b.err;
        return nlohmann::json::parse(b.out.substr(0, b.out.find('\n'))).at("params").get<int64_t>();
    };
    EXPECT_LT(bench_params(2), bench_params(0));
}

TEST(Cli, GenerateFromAnExportedFolder) {
    const fs::path text = small_text("gen.txt");
    const fs::path data = scratch("gen_data"), run = scratch("gen_run"), hf = scratch("gen_hf");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    // nano has 256 positions; trained at --seq 32, the sample stays within 32 of them.
    ASSERT_EQ(run_memfit("train --quiet --model nano --data " + data.string() + " --batch 2 --seq 32 --steps 2 "
                         "--eval-every 0 --eval-batches 1 --sample 80 --checkpoint-every 2 --out " + run.string()).code,
              0);
    std::ifstream sf(run / "summary.json");
    const nlohmann::json summary = nlohmann::json::parse(sf);
    EXPECT_EQ(summary["sample_positions"], 32);
    EXPECT_FALSE(summary["sample"].get<std::string>().empty());
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    std::ifstream cf(hf / "config.json");
    const nlohmann::json config = nlohmann::json::parse(cf);
    EXPECT_EQ(config["n_positions"], 256);
    EXPECT_EQ(config["memfit_trained_context"], 32);
    const std::string gen = "generate --model " + hf.string() + " --prompt ROMEO: --max-new-tokens 24 ";
    const CmdResult a = run_memfit(gen + "--seed 3 --top-k 5 --top-p 0.9");
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_EQ(a.out.rfind("ROMEO:", 0), 0u) << a.out;
    EXPECT_EQ(a.out.size(), std::string("ROMEO:").size() + 24 + 1) << a.out;   // bytes: one char per token, "\n"
    // The KV cache (the prompt plus 24 tokens, two layers) is planned and measured.
    EXPECT_NE(a.err.find("KV cache 30.00 KiB (30 positions x 2 layers)"), std::string::npos) << a.err;
    EXPECT_EQ(run_memfit(gen + "--seed 3 --top-k 5 --top-p 0.9").out, a.out);   // same seed, same text
    const CmdResult greedy = run_memfit(gen + "--seed 3 --temperature 0");
    ASSERT_EQ(greedy.code, 0) << greedy.err;
    EXPECT_EQ(run_memfit(gen + "--temperature 0 --seed 99").out, greedy.out);   // greedy ignores the seed
    // Past the trained context the window slides (32 positions), unless --seq asks for more:
    // then a warning.
    const std::string longer = "generate --model " + hf.string() + " --prompt ROMEO: --max-new-tokens 100 ";
    const CmdResult slide = run_memfit(longer);
    ASSERT_EQ(slide.code, 0) << slide.err;
    EXPECT_EQ(slide.out.size(), std::string("ROMEO:").size() + 100 + 1) << slide.out;
    EXPECT_NE(slide.err.find("(32 positions x 2 layers)"), std::string::npos) << slide.err;
    EXPECT_EQ(slide.err.find("warning"), std::string::npos) << slide.err;
    const CmdResult asked = run_memfit(longer + "--seq 64");
    ASSERT_EQ(asked.code, 0) << asked.err;
    EXPECT_NE(asked.err.find("(64 positions x 2 layers)"), std::string::npos) << asked.err;
    EXPECT_NE(asked.err.find("warning: --seq 64 goes past the 32 positions this model was trained on (of 256)"),
              std::string::npos) << asked.err;
    expect_clean_failure(run_memfit("generate --model " + run.string() + " --prompt x"), "neither a model folder");
}

// The issue's "done when": a LLaMA-style model trains on the corpus from the CLI, is exported,
// re-imported with --model, and generates.
TEST(Cli, LlamaTrainsExportsReimportsAndGenerates) {
    const fs::path text = small_text("llama.txt");
    const fs::path data = scratch("llama_data"), run = scratch("llama_run"), hf = scratch("llama_hf"),
                   again = scratch("llama_again");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult t = run_memfit("train --model llama-nano --data " + data.string() +
                                   " --batch 2 --seq 32 --steps 6 --eval-every 0 --sample 16 --checkpoint-every 6 "
                                   "--progress plain --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    EXPECT_NE(t.out.find("llama, 2 layers, 64 channels, 4 heads (2 KV), MLP 176"), std::string::npos) << t.out;
    EXPECT_NE(t.out.find("sample (temperature 0.8):"), std::string::npos) << t.out;
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    std::ifstream cfg(hf / "config.json");
    const nlohmann::json j = nlohmann::json::parse(cfg);
    EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(j["num_key_value_heads"], 2);
    EXPECT_EQ(j["rms_norm_eps"], 1e-5);
    // Training from the folder starts from the exported weights (their values round-trip
    // bitwise: HfWeights tests).
    const CmdResult r = run_memfit("train --model " + hf.string() + " --data " + data.string() +
                                   " --batch 2 --seq 32 --steps 1 --eval-every 0 --sample 0 --progress plain --out " +
                                   again.string());
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_NE(r.out.find("weights from " + hf.string()), std::string::npos) << r.out;
    const CmdResult g = run_memfit("generate --model " + hf.string() + " --prompt ROMEO: --max-new-tokens 12 --seed 1");
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(g.out.size(), std::string("ROMEO:").size() + 12 + 1) << g.out;
    EXPECT_NE(g.err.find("KV cache"), std::string::npos) << g.err;
}

namespace {
// The training losses a run logged (metrics.jsonl's step lines), in order.
std::vector<double> step_losses(const fs::path & run) {
    std::ifstream metrics(run / "metrics.jsonl");
    std::vector<double> losses;
    for (std::string line; std::getline(metrics, line);) {
        const nlohmann::json m = nlohmann::json::parse(line);
        if (m.contains("loss") && m.contains("step")) losses.push_back(m["loss"].get<double>());
    }
    return losses;
}
}  // namespace

// A Llama-3.1-style config.json (rope_scaling of rope_type llama3) trains from the CLI, its loss
// falls, the export writes the rope_scaling back, and the folder generates with its KV cache.
TEST(Cli, LlamaWithRopeScalingTrainsAndExports) {
    const fs::path text = small_text("llama31.txt");
    const fs::path data = scratch("llama31_data"), run = scratch("llama31_run"), hf = scratch("llama31_hf");
    const fs::path config = scratch("llama31_config.json");
    const nlohmann::json rope = {{"rope_type", "llama3"}, {"factor", 4.0}, {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
    std::ofstream(config) << nlohmann::json{{"model_type", "llama"}, {"vocab_size", 256}, {"hidden_size", 64},
                                            {"intermediate_size", 176}, {"num_hidden_layers", 2},
                                            {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                            {"max_position_embeddings", 64}, {"rope_theta", 10000.0},
                                            {"rope_scaling", rope}}
                                 .dump();
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult t = run_memfit("train --model " + config.string() + " --data " + data.string() +
                                   " --batch 4 --seq 48 --steps 30 --lr 3e-3 --log-every 1 --eval-every 0 --sample 0 "
                                   "--checkpoint-every 30 --progress plain --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    const std::vector<double> losses = step_losses(run);
    ASSERT_GE(losses.size(), 30u);
    EXPECT_LT(losses.back(), 0.8 * losses.front()) << losses.front() << " -> " << losses.back();
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    std::ifstream cfg(hf / "config.json");
    EXPECT_EQ(nlohmann::json::parse(cfg)["rope_scaling"], rope);
    const CmdResult g = run_memfit("generate --model " + hf.string() + " --prompt ROMEO: --max-new-tokens 40 --seed 1");
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(g.out.size(), std::string("ROMEO:").size() + 40 + 1) << g.out;
}

// Qwen2 and Mistral config.json files train as LLaMA blocks: Qwen2 with its q, k and v biases,
// exported as Qwen2ForCausalLM with them; Mistral with its sliding window below --seq, flash and
// naive attention giving the same losses; generating past the window runs on its rolling cache.
TEST(Cli, Qwen2AndMistralTrainFromTheirConfigs) {
    const fs::path text = small_text("qwen.txt");
    const fs::path data = scratch("qwen_data"), run = scratch("qwen_run"), hf = scratch("qwen_hf");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const nlohmann::json shape = {{"vocab_size", 256}, {"hidden_size", 64}, {"intermediate_size", 160},
                                  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2}, {"max_position_embeddings", 64}};
    auto config = [&](const char * file, nlohmann::json j) {
        j.update(shape);
        const fs::path p = scratch(file);
        std::ofstream(p) << j.dump();
        return p.string();
    };
    const std::string qwen = config("qwen2_config.json", {{"model_type", "qwen2"}, {"tie_word_embeddings", true}});
    const CmdResult t = run_memfit("train --model " + qwen + " --data " + data.string() +
                                   " --batch 2 --seq 32 --steps 4 --eval-every 0 --sample 0 --checkpoint-every 4 "
                                   "--progress plain --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    std::ifstream cfg(hf / "config.json");
    EXPECT_EQ(nlohmann::json::parse(cfg)["architectures"][0], "Qwen2ForCausalLM");
    std::ifstream wf(hf / "model.safetensors", std::ios::binary);
    const std::string weights((std::istreambuf_iterator<char>(wf)), std::istreambuf_iterator<char>());
    EXPECT_NE(weights.find("model.layers.1.self_attn.v_proj.bias"), std::string::npos);
    const CmdResult again = run_memfit("train --model " + hf.string() + " --data " + data.string() +
                                       " --batch 2 --seq 32 --steps 1 --eval-every 0 --sample 0 --progress plain "
                                       "--out " + scratch("qwen_again").string());
    ASSERT_EQ(again.code, 0) << again.err << again.out;

    const std::string mistral = config("mistral_config.json", {{"model_type", "mistral"}, {"sliding_window", 16}});
    std::vector<double> first_losses;
    for (const char * attention : {"naive", "flash"}) {
        const fs::path out = scratch(std::string("mistral_") + attention);
        const CmdResult m = run_memfit("train --model " + mistral + " --data " + data.string() + " --attention " +
                                       attention + " --batch 2 --seq 48 --steps 3 --log-every 1 --eval-every 0 "
                                       "--sample 0 --checkpoint-every 3 --progress plain --out " + out.string());
        ASSERT_EQ(m.code, 0) << m.err << m.out;
        std::ifstream metrics(out / "metrics.jsonl");
        std::string line;
        std::getline(metrics, line);
        first_losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
        if (std::string(attention) == "flash") {
            const fs::path mhf = scratch("mistral_hf");
            ASSERT_EQ(run_memfit("export " + (out / "checkpoints").string() + " --out " + mhf.string()).code, 0);
            const CmdResult g = run_memfit("generate --model " + mhf.string() + " --prompt ROMEO: --max-new-tokens 40");
            EXPECT_EQ(g.code, 0) << g.err;
            EXPECT_EQ(g.out.size(), std::string("ROMEO:").size() + 40 + 1) << g.out;
        }
    }
    EXPECT_NEAR(first_losses[0], first_losses[1], 1e-4 * first_losses[0]);
}

// Qwen3 from its config.json trains with TiledMLP under full recomputation (the loss falls) and
// exports as Qwen3ForCausalLM with its q/k norms; --attention-window turns a llama preset into a
// Mistral that exports its window and generates past it; what does not combine is one line.
TEST(Cli, Qwen3TiledMlpAndAttentionWindow) {
    const fs::path text = small_text("qwen3.txt");
    const fs::path data = scratch("qwen3_data"), run = scratch("qwen3_run"), hf = scratch("qwen3_hf");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const fs::path config = scratch("qwen3_config.json");
    std::ofstream(config) << nlohmann::json{{"model_type", "qwen3"}, {"vocab_size", 256}, {"hidden_size", 64},
                                            {"intermediate_size", 160}, {"num_hidden_layers", 2},
                                            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                                            {"max_position_embeddings", 64}, {"tie_word_embeddings", true}}
                                 .dump();
    const CmdResult t = run_memfit("train --model " + config.string() + " --data " + data.string() +
                                   " --batch 4 --seq 48 --steps 20 --lr 3e-3 --log-every 1 --eval-every 0 --sample 0 "
                                   "--mlp-chunk 40 --recompute full --checkpoint-every 20 --progress plain --out " +
                                   run.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    const std::vector<double> losses = step_losses(run);
    ASSERT_GE(losses.size(), 20u);
    EXPECT_LT(losses.back(), 0.9 * losses.front()) << losses.front() << " -> " << losses.back();
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    std::ifstream cfg(hf / "config.json");
    const nlohmann::json exported = nlohmann::json::parse(cfg);
    EXPECT_EQ(exported["architectures"][0], "Qwen3ForCausalLM");
    EXPECT_EQ(exported["head_dim"], 32);
    std::ifstream wf(hf / "model.safetensors", std::ios::binary);
    const std::string weights((std::istreambuf_iterator<char>(wf)), std::istreambuf_iterator<char>());
    EXPECT_NE(weights.find("model.layers.1.self_attn.k_norm.weight"), std::string::npos);

    const fs::path win = scratch("window_run"), whf = scratch("window_hf");
    const CmdResult w = run_memfit("train --model llama-nano --data " + data.string() +
                                   " --attention-window 8 --batch 2 --seq 32 --steps 2 --eval-every 0 --sample 0 "
                                   "--checkpoint-every 2 --progress plain --out " + win.string());
    ASSERT_EQ(w.code, 0) << w.err << w.out;
    ASSERT_EQ(run_memfit("export " + (win / "checkpoints").string() + " --out " + whf.string()).code, 0);
    std::ifstream wcfg(whf / "config.json");
    const nlohmann::json wj = nlohmann::json::parse(wcfg);
    EXPECT_EQ(wj["architectures"][0], "MistralForCausalLM");
    EXPECT_EQ(wj["sliding_window"], 8);
    const CmdResult g = run_memfit("generate --model " + whf.string() + " --prompt ROMEO: --max-new-tokens 24");
    ASSERT_EQ(g.code, 0) << g.err;   // 30 positions over a rolling cache of 8 + 63 rows
    EXPECT_EQ(g.out.size(), std::string("ROMEO:").size() + 24 + 1) << g.out;

    expect_clean_failure(run_memfit("train --model nano --data " + data.string() + " --attention-window 8 --steps 1"),
                         "no sliding-window form");
    expect_clean_failure(run_memfit("train --model llama-nano --data " + data.string() +
                                    " --mlp-chunk 16 --lora-rank 4 --steps 1"),
                         "--mlp-chunk 16 with LoRA");
}

// memfit plan: the issue's example prints a ranked table; --json parses; and on one `cpu`
// device the plan's bytes per category are what `memfit train` then measures.
TEST(Cli, PlanRanksExplainsAndMatchesTraining) {
    const CmdResult t = run_memfit("plan --model llama2-70b --hardware h100-80g --gpus 64 --seq 4096 "
                                   "--global-batch 1024 --explain --top 3");
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_NE(t.out.find("configurations evaluated"), std::string::npos) << t.out;
    EXPECT_NE(t.out.find("dp x tp x pp"), std::string::npos) << t.out;
    EXPECT_NE(t.out.find("\n  1   "), std::string::npos) << t.out;
    EXPECT_NE(t.out.find("memfit train --model llama2-70b"), std::string::npos) << t.out;   // how to run #1
    EXPECT_NE(t.out.find("rejected (fastest first)"), std::string::npos) << t.out;
    expect_clean_failure(run_memfit("plan --model llama2-70b --hardware h100-81g"), "unknown hardware");
    expect_clean_failure(run_memfit("plan --model llama2-70b --hardware rtx4090 --gpus 1 --global-batch 1"),
                         "nothing fits");
    // Extreme inputs: one line and a bound (2^31 - 1 devices used to run for minutes), or a
    // plan (a global batch of 2^31 - 1 used to grow to 24 GB recording its pipelines).
    expect_clean_failure(run_memfit("plan --gpus 2147483647"), "at most 1048576 devices");
    expect_clean_failure(run_memfit("plan --nodes 2147483647"), "at most 1048576 devices");   // no int overflow (UBSan)
    const CmdResult huge = run_memfit("plan --global-batch 2147483647 --gpus 8 --json");
    ASSERT_EQ(huge.code, 0) << huge.err;
    const nlohmann::json huge_json = nlohmann::json::parse(huge.out);   // alive for the loop
    for (const auto & b : huge_json["best"])
        EXPECT_LE(b["memory"]["total"].get<uint64_t>(), 80ull << 30);
    // A pipeline holds the whole step's token ids, targets and losses: 96 TiB here, so nothing
    // fits (the analytic model once listed the offloaded layouts).
    expect_clean_failure(run_memfit("plan --model llama2-7b --global-batch 2147483647 --gpus 2 --pp 2 --schedule 1f1b"),
                         "nothing fits");
    const fs::path wide = scratch("wide_config.json");
    std::ofstream(wide) << R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 176,
        "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 2000000000, "max_position_embeddings": 128})";
    expect_clean_failure(run_memfit("plan --model " + wide.string()), "head_dim = 2000000000");

    const fs::path text = small_text("plan.txt");
    const fs::path data = scratch("plan_data"), run = scratch("plan_run");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string shape = " --seq 32 --precision fp32 --attention flash --recompute selective";
    const CmdResult tr = run_memfit("train --quiet --model llama-nano --data " + data.string() + shape +
                                    " --batch 2 --steps 1 --eval-every 0 --sample 0 --out " + run.string());
    ASSERT_EQ(tr.code, 0) << tr.err;
    const CmdResult p = run_memfit("plan --model llama-nano --hardware cpu --json --global-batch 2 --micro-batch 2" +
                                   shape + " --calibration ''");
    ASSERT_EQ(p.code, 0) << p.err;
    const nlohmann::json plan = nlohmann::json::parse(p.out);
    std::ifstream sf(run / "summary.json");
    const nlohmann::json summary = nlohmann::json::parse(sf);
    const nlohmann::json & best = plan["best"][0];
    EXPECT_TRUE(best["memory"]["exact"].get<bool>());
    for (const char * cat : {"parameters", "optimizer_states", "gradients", "activations", "workspace"})
        EXPECT_EQ(best["memory"]["per_device"][cat], summary["measured"]["peak_live"][cat]) << cat;
}

namespace memfit {
namespace {

// A DeepSpeed config trains as it says: batch sizes, precision, ZeRO stage, clipping, AdamW and
// the cosine schedule are what the run used; keys memfit does not implement are one warning line.
TEST(Cli, ConfigFileDeepSpeedTrainsAsItSays) {
    const fs::path text = small_text("ds.txt");
    const fs::path data = scratch("ds_data"), out = scratch("ds_run"), ds = scratch("ds.json");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    std::ofstream(ds) << R"({
      "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 0.5, "steps_per_print": 2, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 1, "overlap_comm": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.05}},
      "scheduler": {"type": "WarmupCosineLR",
                    "params": {"total_num_steps": 6, "warmup_num_steps": 2, "cos_min_ratio": 0.2, "warmup_type": "linear"}},
      "activation_checkpointing": {"partition_activations": false},
      "wall_clock_breakdown": false})";
    const CmdResult r = run_memfit("train --model nano --seq 32 --data " + data.string() + " --config " + ds.string() +
                                   " --eval-every 0 --eval-batches 1 --sample 0 --progress plain --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("ignored: zero_optimization.overlap_comm, activation_checkpointing.partition_activations, "
                         "wall_clock_breakdown"), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("batch 2 x seq 32 x 4 accumulated micro-batches"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("ZeRO stage 1"), std::string::npos) << r.out;
    const nlohmann::json s = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    const nlohmann::json & c = s["run_config"];
    EXPECT_EQ(c["micro-batch"], 2);
    EXPECT_EQ(c["grad-accum"], 4);
    EXPECT_EQ(c["global-batch"], 8);
    EXPECT_EQ(c["precision"], "bf16");
    EXPECT_EQ(c["zero"], 1);
    EXPECT_EQ(c["recompute"], "full");
    EXPECT_EQ(c["steps"], 6);
    EXPECT_EQ(c["warmup"], 2);
    EXPECT_FLOAT_EQ(c["clip"].get<float>(), 0.5f);
    EXPECT_FLOAT_EQ(c["adam-beta1"].get<float>(), 0.8f);
    EXPECT_FLOAT_EQ(c["adam-beta2"].get<float>(), 0.99f);
    EXPECT_FLOAT_EQ(c["weight-decay"].get<float>(), 0.05f);
    // The schedule the run took: linear warmup to 0.002 over 2 steps, cosine to 0.2 x 0.002 at step 6.
    std::vector<double> lr;
    std::ifstream m(out / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) lr.push_back(nlohmann::json::parse(line)["lr"].get<double>());
    ASSERT_EQ(lr.size(), 4u);   // steps 1, 2, 4, 6 (steps_per_print 2)
    EXPECT_NEAR(lr[0], 0.001, 1e-7);
    EXPECT_NEAR(lr[1], 0.002, 1e-7);
    EXPECT_NEAR(lr[3], 0.0004, 1e-7);
    // Values memfit cannot honour and keys that are no flag: one clear line each.
    std::ofstream(ds) << R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})";
    expect_clean_failure(run_memfit("train --model nano --config " + ds.string()), "needs \"nvme_path\"");
    std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 2, "mirco-batch": 4})";
    expect_clean_failure(run_memfit("train --model nano --config " + ds.string()), "\"mirco-batch\" is not a flag");
    std::ofstream(ds) << R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})";
    expect_clean_failure(run_memfit("train --model nano --steps 1 --config " + ds.string()), "--offload optimizer");
    // ZeRO-Infinity's NVMe offload of the optimizer: memfit's --offload-dir.
    const fs::path nvme = scratch("ds_nvme");
    fs::create_directories(nvme);
    std::ofstream(ds) << R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                      << nvme.string() << R"("}}})";
    const fs::path nvme_run = scratch("ds_nvme_run");
    const CmdResult nv = run_memfit("train --model nano --steps 2 --seq 32 --micro-batch 2 --sample 0 --eval-every 0 "
                                    "--progress quiet --config " + ds.string() + " --out " + nvme_run.string());
    ASSERT_EQ(nv.code, 0) << nv.err;
    const nlohmann::json nvs = nlohmann::json::parse(std::ifstream(nvme_run / "summary.json"));
    EXPECT_EQ(nvs["run_config"]["offload-dir"], nvme.string());
    EXPECT_GT(nvs["measured"]["peak_live"]["offloaded"].get<uint64_t>(), 0u);
    expect_clean_failure(run_memfit("train --config /nonexistent/ds.json"), "/nonexistent/ds.json");
    std::ofstream(ds) << "{ not json";
    expect_clean_failure(run_memfit("train --config " + ds.string()), "not valid JSON");
}

// summary.json's run_config reruns the run: the same losses step by step; flags override the file.
TEST(Cli, ConfigFileSummaryRerunsTheRun) {
    const fs::path text = small_text("rerun.txt");
    const fs::path data = scratch("rerun_data"), a = scratch("rerun_a"), b = scratch("rerun_b"), c = scratch("rerun_c");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult first = run_memfit("train --model nano --data " + data.string() + " --seq 32 --batch 4 --steps 6 "
                                       "--log-every 1 --lr 0.01 --warmup 2 --lr-scheduler linear --fit auto "
                                       "--precision auto --memory-budget 8MiB --eval-every 3 --eval-batches 1 "
                                       "--sample 0 --progress quiet --out " + a.string());
    ASSERT_EQ(first.code, 0) << first.err;
    const CmdResult again = run_memfit("train --config " + (a / "summary.json").string() + " --progress quiet --out " +
                                       b.string());
    ASSERT_EQ(again.code, 0) << again.err;
    auto losses = [](const fs::path & dir) {
        std::vector<double> v;
        std::ifstream m(dir / "metrics.jsonl");
        for (std::string line; std::getline(m, line);) v.push_back(nlohmann::json::parse(line)["loss"].get<double>());
        return v;
    };
    EXPECT_EQ(losses(a).size(), 6u);
    EXPECT_EQ(losses(a), losses(b));
    const nlohmann::json sa = nlohmann::json::parse(std::ifstream(a / "summary.json"));
    const nlohmann::json sb = nlohmann::json::parse(std::ifstream(b / "summary.json"));
    EXPECT_EQ(sa["run_config"], sb["run_config"]);
    EXPECT_EQ(sa["run_config"]["fit"], "off");   // resolved: what --fit auto chose
    EXPECT_EQ(sa["final_val_loss"], sb["final_val_loss"]);
    const CmdResult shorter = run_memfit("train --config " + (a / "summary.json").string() + " --steps 3 --progress "
                                         "quiet --out " + c.string());
    ASSERT_EQ(shorter.code, 0) << shorter.err;
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(c / "summary.json"))["run_config"]["steps"], 3);
    // Another command takes the flags it has and names the ones it does not use.
    const CmdResult plan = run_memfit("plan --hardware cpu --config " + (a / "summary.json").string());
    EXPECT_EQ(plan.code, 0) << plan.err << plan.out;
    EXPECT_NE(plan.err.find("memfit plan does not use"), std::string::npos) << plan.err;
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// Issue 22's findings, the groups fixed so far: a resumed run keeps its metrics; corrupt
// checkpoint numbers are errors, not aborts; a closed pipe does not kill the run; a zero budget
// and an out-of-range seed are refused.
TEST(Cli, ResumeKeepsTheMetricsAndRefusesCorruptNumbers) {
    const fs::path text = small_text("r22.txt");
    const fs::path data = scratch("r22_data"), a = scratch("r22_a"), b = scratch("r22_b");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --model nano --data " + data.string() + " --micro-batch 2 --seq 32 --eval-every 0 "
                             "--eval-batches 1 --sample 0 --progress quiet --log-every 2 --checkpoint-every 4 ";
    ASSERT_EQ(run_memfit(base + "--steps 8 --out " + a.string()).code, 0);
    ASSERT_EQ(run_memfit(base + "--steps 4 --out " + b.string()).code, 0);
    ASSERT_EQ(run_memfit(base + "--steps 8 --resume " + (b / "checkpoints").string() + " --out " + b.string()).code, 0);
    auto steps = [](const fs::path & dir) {
        std::vector<std::pair<int, double>> v;
        std::ifstream m(dir / "metrics.jsonl");
        for (std::string line; std::getline(m, line);) {
            const nlohmann::json j = nlohmann::json::parse(line);
            v.emplace_back(j["step"].get<int>(), j["loss"].get<double>());
        }
        return v;
    };
    EXPECT_EQ(steps(a).size(), 5u);   // steps 1, 2, 4, 6, 8
    EXPECT_EQ(steps(a), steps(b)) << "the resumed run's metrics are the uninterrupted run's";

    // meta.json edited: refused by its own digest; rewritten whole with a digest of its own (the
    // digest is not a signature), its numbers are still checked.
    const fs::path meta = b / "checkpoints/step-000008/meta.json";
    const nlohmann::json good = nlohmann::json::parse(std::ifstream(meta));
    {
        nlohmann::json edited = good;
        edited["seed"] = 7;
        std::ofstream(meta) << edited.dump();
        expect_clean_failure(run_memfit(base + "--steps 12 --resume " + (b / "checkpoints").string()),
                             "meta.json changed after the checkpoint was written");
    }
    for (const auto & [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
             {"optimizer_step", -100}, {"optimizer_step", 2147483647}, {"step", -5}}) {
        nlohmann::json bad = good;
        bad[key] = value;
        bad["meta_digest"] = memfit::meta_digest(bad);
        std::ofstream(meta) << bad.dump();
        expect_clean_failure(run_memfit(base + "--steps 12 --resume " + (b / "checkpoints").string()),
                             "\"" + key + "\" = " + value.dump());
    }
    nlohmann::json no_data = good;
    no_data.erase("data");
    no_data["meta_digest"] = memfit::meta_digest(no_data);
    std::ofstream(meta) << no_data.dump();
    const CmdResult no_data_run = run_memfit(base + "--steps 12 --resume " + (b / "checkpoints").string());
    expect_clean_failure(no_data_run, "meta.json has no \"data\" object");
    EXPECT_EQ(no_data_run.err.find("json.exception"), std::string::npos) << no_data_run.err;   // not the library's words
    std::ofstream(meta) << good.dump();

    // A closed pipe: the run goes on and writes its outputs.
    const fs::path piped = scratch("r22_pipe"), code = scratch("r22_code.txt");
    const std::string cmd = "sh -c '" + std::string(MEMFIT_BINARY) + " train --model nano --data " + data.string() +
                            " --seq 32 --sample 0 --progress plain --steps 6 --log-every 1 --out " + piped.string() + " 2>/dev/null; echo $? > " + code.string() +
                            "' | head -1 > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    std::string rc;
    std::ifstream(code) >> rc;
    EXPECT_EQ(rc, "0");
    EXPECT_TRUE(fs::exists(piped / "summary.json"));

    // Preflight: an unwritable checkpoint folder and a validation file of another vocabulary fail
    // before the first step; a bad value in the budget file is a warning, not the end of the run.
    const fs::path blocker = scratch("r22_file");
    std::ofstream(blocker) << "a file, not a folder";
    const fs::path no_out = scratch("r22_no_out");
    const CmdResult cd = run_memfit(base + "--steps 4 --checkpoint-dir " + (blocker / "ck").string() + " --out " +
                                    no_out.string());
    expect_clean_failure(cd, "--checkpoint-dir " + (blocker / "ck").string());
    EXPECT_FALSE(fs::exists(no_out / "metrics.jsonl"));
    const fs::path gdata = scratch("r22_gpt2"), mixed = scratch("r22_mixed");
    ASSERT_EQ(run_memfit("prepare --tokenizer gpt2 --input " + text.string() + " --out " + gdata.string()).code, 0);
    fs::create_directories(mixed);
    fs::copy_file(data / "train.bin", mixed / "train.bin");
    fs::copy_file(gdata / "val.bin", mixed / "val.bin");
    expect_clean_failure(run_memfit("train --model nano --steps 2 --data " + mixed.string()),
                         (mixed / "val.bin").string() + ": its vocabulary (50257 tokens)");
    const fs::path ctl = scratch("r22_budget.txt"), ctl_out = scratch("r22_ctl");
    std::ofstream(ctl) << "lots\n";
    const CmdResult bf = run_memfit("train --model nano --data " + data.string() + " --seq 32 --steps 3 --sample 0 "
                                    "--progress plain --budget-file " + ctl.string() + " --out " + ctl_out.string());
    ASSERT_EQ(bf.code, 0) << bf.err << bf.out;
    EXPECT_NE(bf.out.find("warning: --budget-file " + ctl.string()), std::string::npos) << bf.out;
    EXPECT_TRUE(fs::exists(ctl_out / "summary.json"));

    // A new run does not prune another run's checkpoints: it refuses the folder; the run that
    // wrote them resumes there.
    const CmdResult other = run_memfit(base + "--steps 8 --lr 1e-4 --out " + b.string());
    expect_clean_failure(other, "holds the checkpoints of another run (newest step-000008)");
    EXPECT_TRUE(fs::exists(b / "checkpoints/step-000008/meta.json"));
    ASSERT_EQ(run_memfit(base + "--steps 12 --resume " + (b / "checkpoints").string() + " --out " + b.string()).code, 0);
    EXPECT_TRUE(fs::exists(b / "checkpoints/step-000012/meta.json"));
    // One run at a time on an --out: a second one (here: this test holding the lock) is refused.
    const fs::path busy = scratch("r22_busy");
    fs::create_directories(busy);
    const int fd = ::open((busy / ".memfit.lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    expect_clean_failure(run_memfit(base + "--steps 2 --out " + busy.string()), "another memfit run is writing there");
    ::close(fd);
    EXPECT_EQ(run_memfit(base + "--steps 2 --out " + busy.string()).code, 0);

    // Changed bytes in a checkpoint's state: its digest no longer matches, on resume and on export.
    const fs::path state = b / "checkpoints/step-000012/state.safetensors";
    {
        std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(2000);
        f.write(std::string(64, '\x5a').data(), 64);
    }
    expect_clean_failure(run_memfit(base + "--steps 16 --resume " + (b / "checkpoints").string() + " --out " +
                                    b.string()), "content digest");
    expect_clean_failure(run_memfit("export " + (b / "checkpoints").string() + " --out " + scratch("r22_x").string()),
                         "content digest");

    // stdout closed: metrics.jsonl stays JSON Lines. A report that cannot be written (a folder in
    // its place) is a warning: summary.json is written, the exit status 0.
    const fs::path closed = scratch("r22_closed");
    const std::string short_run = std::string(MEMFIT_BINARY) + " train --model nano --data " + data.string() +
                                  " --seq 32 --sample 0 --steps 3 --log-every 1 --progress plain --out ";
    ASSERT_EQ(std::system(("sh -c '" + short_run + closed.string() + " >&- 2>/dev/null'").c_str()), 0);
    std::ifstream mj(closed / "metrics.jsonl");
    int json_lines = 0;
    for (std::string line; std::getline(mj, line); ++json_lines)
        EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
    EXPECT_EQ(json_lines, 3);
    const fs::path blocked = scratch("r22_blocked");
    fs::create_directories(blocked / "report.html");
    const CmdResult rb = run_memfit("train --model nano --data " + data.string() + " --seq 32 --sample 0 --steps 2 "
                                    "--progress quiet --out " + blocked.string());
    EXPECT_EQ(rb.code, 0) << "a report that cannot be written is a warning: " << rb.err;
    EXPECT_NE(rb.err.find("memfit: warning: cannot rename"), std::string::npos) << rb.err;
    EXPECT_NE(rb.err.find("summary.json were written"), std::string::npos) << rb.err;
    EXPECT_TRUE(fs::exists(blocked / "summary.json"));

    expect_clean_failure(run_memfit("train --model nano --memory-budget 0B --steps 1"), "--memory-budget 0B");
    expect_clean_failure(run_memfit("train --model nano --seed -1 --steps 1"), "--seed -1");
    expect_clean_failure(run_memfit("train --model nano --seed 99999999999999999999 --steps 1"), "--seed 9999");
}

// The messages of issue 22's group 8 name the real cause: a resume of the same model by another
// path goes on, another model's names the fields that differ; a LoRA run's base is its weights
// (another base is refused on resume and on export); a diverging LoRA scale, NaN weights in a
// folder (train and generate) each get their own line.
TEST(Cli, MessagesNameTheCause) {
    const fs::path text = small_text("m22.txt");
    const fs::path data = scratch("m22_data"), a = scratch("m22_a"), b = scratch("m22_b");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string common = " --data " + data.string() + " --micro-batch 2 --seq 32 --eval-every 0 --sample 0 "
                               "--progress quiet --checkpoint-every 4 ";
    ASSERT_EQ(run_memfit("train --model nano --steps 4 --out " + a.string() + common).code, 0);
    ASSERT_EQ(run_memfit("train --model nano --steps 4 --seed 9 --out " + b.string() + common).code, 0);
    const fs::path base1 = scratch("m22_base1"), base2 = scratch("m22_base2"), copy1 = scratch("m22_copy1");
    ASSERT_EQ(run_memfit("export " + (a / "checkpoints").string() + " --out " + base1.string()).code, 0);
    ASSERT_EQ(run_memfit("export " + (b / "checkpoints").string() + " --out " + base2.string()).code, 0);
    fs::copy(base1, copy1);

    // The same model by another path (its exported folder) resumes; another model is refused
    // with the fields that differ, not two dumps of the whole config.
    const CmdResult other = run_memfit("train --model micro --steps 8 --resume " + (a / "checkpoints").string() +
                                       common + "--out " + a.string());
    expect_clean_failure(other, "the checkpoint's model differs from this run's (");
    EXPECT_NE(other.err.find("n_layer 2 in the checkpoint, 4 in this run"), std::string::npos) << other.err;
    EXPECT_LT(other.err.size(), 400u) << other.err;
    ASSERT_EQ(run_memfit("train --model " + base1.string() + " --steps 8 --resume " + (a / "checkpoints").string() +
                         common + "--out " + a.string()).code, 0);

    // LoRA: the base is recorded by its weights. The same weights elsewhere merge and resume;
    // a same-shaped other base is refused on export and on resume.
    const fs::path l = scratch("m22_lora");
    const std::string lora = " --lora-rank 4" + common + "--out " + l.string();
    ASSERT_EQ(run_memfit("train --model " + base1.string() + " --steps 4" + lora).code, 0);
    const std::string ck = (l / "checkpoints").string();
    expect_clean_failure(run_memfit("export " + ck + " --merge-lora --base-model " + base2.string() + " --out " +
                                    scratch("m22_x").string()), "holds other weights");
    ASSERT_EQ(run_memfit("export " + ck + " --merge-lora --base-model " + copy1.string() + " --out " +
                         scratch("m22_y").string()).code, 0);
    expect_clean_failure(run_memfit("train --model " + base2.string() + " --steps 8 --resume " + ck + lora),
                         "the checkpoint's adapters were trained on the base " + fs::absolute(base1).string());
    ASSERT_EQ(run_memfit("train --model " + copy1.string() + " --steps 8 --resume " + ck + lora).code, 0);

    // A LoRA scale that makes the gradients overflow: one line naming it, a non-zero exit.
    expect_clean_failure(run_memfit("train --model " + base1.string() + " --steps 3 --lora-rank 4 --lora-alpha 1e30" +
                                    common + "--out " + scratch("m22_alpha").string()),
                         "the LoRA scale (alpha / rank, or alpha / sqrt(rank) with --use-rslora) is 2.5e+29");

    // fp16 loss scales: 1 / scale must be a number; a static scale that overflows every step
    // ends the run (it used to skip every update and exit 0).
    expect_clean_failure(run_memfit("train --model nano --steps 3 --precision fp16 --loss-scale 1e-45" + common +
                                    "--out " + scratch("m22_ls").string()), "--loss-scale 1.4013e-45: expected 0");
    expect_clean_failure(run_memfit("train --model nano --steps 3 --precision fp16 --min-loss-scale 1e6" + common +
                                    "--out " + scratch("m22_ls").string()), "is above --initial-loss-scale 65536");
    const CmdResult stuck = run_memfit("train --model nano --steps 30 --precision fp16 --loss-scale 4294967296" +
                                       common + "--out " + scratch("m22_stuck").string());
    expect_clean_failure(stuck, "fp16: the last 10 steps overflowed at loss scale 4.29497e+09, which is static");

    // NaN weights in a folder: refused where they are read, naming the tensor.
    {
        std::fstream f(copy1 / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        uint64_t header = 0;
        f.read(reinterpret_cast<char *>(&header), 8);
        const float nan = NAN;
        f.seekp(std::streamoff(8 + header + 16));   // a value of the first tensor
        f.write(reinterpret_cast<const char *>(&nan), 4);
    }
    expect_clean_failure(run_memfit("generate --model " + copy1.string() + " --prompt hi --max-new-tokens 4"),
                         "non-finite value");
    expect_clean_failure(run_memfit("train --model " + copy1.string() + " --steps 2" + common + "--out " +
                                    scratch("m22_nan").string()), "non-finite value");
}

}  // namespace
}  // namespace memfit
