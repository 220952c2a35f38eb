// The optimizer choices from the command line: --optimizer adamw-bf16 halves the planned and
// measured optimizer states, adamw-8bit takes them to at most 0.27x; both train and resume bit
// for bit; an optimizer the engine does not run is one clear line. --offload optimizer moves the
// states into a file and changes nothing else.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "model/transformer.h"

namespace memfit {
namespace {

using namespace cli_test;

nlohmann::json summary(const fs::path & out) { return nlohmann::json::parse(std::ifstream(out / "summary.json")); }

// The bytes of a run's checkpoint state at `step` (two-digit steps: step-0000NN).
std::string state(const fs::path & out, int step) {
    std::ifstream in(out / ("checkpoints/step-0000" + std::to_string(step) + "/state.safetensors"), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(Cli, SmallerMomentsShrinkTheStatesAndResumeBitwise) {
    const fs::path text = small_text("o24.txt"), data = scratch("o24_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --checkpoint-every 20 ";
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

    // SGD with momentum: one fp32 buffer, half of AdamW's states; it trains, and resumes bit for bit.
    const fs::path sgd = scratch("o24_sgd"), sgd_resumed = scratch("o24_sgd_resumed");
    const std::string sgd_args = args + "--optimizer sgd --momentum 0.9 --lr 0.05 ";
    ASSERT_EQ(run_memfit(sgd_args + "--steps 40 --out " + sgd.string()).code, 0);
    ASSERT_EQ(run_memfit(sgd_args + "--steps 20 --out " + sgd_resumed.string()).code, 0);
    ASSERT_EQ(run_memfit(sgd_args + "--steps 40 --resume auto --out " + sgd_resumed.string()).code, 0);
    EXPECT_TRUE(state(sgd_resumed, 40) == state(sgd, 40));
    const nlohmann::json s = summary(sgd);
    EXPECT_EQ(s["run_config"]["optimizer"], "sgd");
    for (const char * kind : {"planned", "measured"})
        EXPECT_EQ(2 * s[kind]["peak_live"]["optimizer_states"].get<uint64_t>(),
                  a[kind]["peak_live"]["optimizer_states"].get<uint64_t>()) << kind;
    std::ifstream metrics(sgd / "metrics.jsonl");
    std::string first;
    std::getline(metrics, first);
    EXPECT_LT(s["final_loss"].get<double>(), 0.9 * nlohmann::json::parse(first)["loss"].get<double>()) << "SGD did not train";
}

// --master-weights bf16-sr: no master weights planned or measured, the run trains near the fp32
// master weights' loss and resumes bit for bit; without bf16 compute it is one clear line.
TEST(Cli, Bf16SrMasterWeightsTrainAndResume) {
    const fs::path text = small_text("sr24.txt"), data = scratch("sr24_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --checkpoint-every 10 --precision bf16 ";
    const fs::path fp32 = scratch("sr24_master"), sr = scratch("sr24_sr"), resumed = scratch("sr24_resumed");
    ASSERT_EQ(run_memfit(args + "--steps 20 --out " + fp32.string()).code, 0);
    const std::string flag = "--master-weights bf16-sr ";
    ASSERT_EQ(run_memfit(args + flag + "--steps 20 --out " + sr.string()).code, 0);
    ASSERT_EQ(run_memfit(args + flag + "--steps 10 --out " + resumed.string()).code, 0);
    ASSERT_EQ(run_memfit(args + flag + "--steps 20 --resume auto --out " + resumed.string()).code, 0);
    EXPECT_FALSE(state(sr, 20).empty());
    EXPECT_TRUE(state(resumed, 20) == state(sr, 20)) << "the resumed bf16-sr run ended elsewhere";
    const nlohmann::json a = summary(fp32), b = summary(sr);
    EXPECT_EQ(b["run_config"]["master-weights"], "bf16-sr");
    EXPECT_GT(a["planned"]["peak_live"]["master_weights"].get<uint64_t>(), 0u);
    for (const char * kind : {"planned", "measured"}) EXPECT_EQ(b[kind]["peak_live"]["master_weights"], 0) << kind;
    EXPECT_NEAR(b["final_loss"].get<double>(), a["final_loss"].get<double>(), 0.03 * a["final_loss"].get<double>());
    expect_clean_failure(run_memfit("train --model nano --data " + data.string() + " --steps 2 " + flag + "--out " +
                                    scratch("sr24_fp32").string()),
                         "--master-weights bf16-sr rounds the weights to bf16 stochastically: it needs --precision bf16");
}

// --offload optimizer --offload-dir DIR: the master weights and moments in a file, the same run
// bit for bit (and resumed from a checkpoint), the offloaded bytes planned and measured and the
// device's total lower by them (less three units' staging); where they cannot go, one line.
TEST(Cli, OffloadedOptimizerStatesTrainBitForBit) {
    const fs::path text = small_text("off24.txt"), data = scratch("off24_data"), dir = scratch("off24_dir");
    fs::create_directories(dir);
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --checkpoint-every 10 --precision bf16 ";
    const std::string off = "--offload optimizer --offload-dir " + dir.string() + " ";
    const fs::path mem = scratch("off24_mem"), a = scratch("off24_off"), b = scratch("off24_resumed");
    ASSERT_EQ(run_memfit(args + "--steps 20 --out " + mem.string()).code, 0);
    const CmdResult r = run_memfit(args + off + "--steps 20 --out " + a.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(state(a, 20).empty());
    EXPECT_TRUE(state(a, 20) == state(mem, 20)) << "the offloaded run ended elsewhere";
    ASSERT_EQ(run_memfit(args + off + "--steps 10 --out " + b.string()).code, 0);
    ASSERT_EQ(run_memfit(args + off + "--steps 20 --resume auto --out " + b.string()).code, 0);
    EXPECT_TRUE(state(b, 20) == state(mem, 20)) << "the resumed offloaded run ended elsewhere";
    EXPECT_TRUE(fs::is_empty(dir)) << "the offload file was left behind";
    const nlohmann::json sm = summary(mem), so = summary(a);
    EXPECT_EQ(so["run_config"]["offload"], "optimizer");
    const uint64_t moved = so["measured"]["peak_live"]["offloaded"].get<uint64_t>();
    EXPECT_EQ(moved, so["planned"]["peak_live"]["offloaded"].get<uint64_t>());
    EXPECT_EQ(moved, sm["measured"]["peak_live"]["master_weights"].get<uint64_t>() +
                         sm["measured"]["peak_live"]["optimizer_states"].get<uint64_t>());
    const uint64_t staging = 3 * uint64_t(kOffloadUnit) * 12;
    const uint64_t total_mem = sm["measured"]["peak_live"]["total"].get<uint64_t>(),
                   total_off = so["measured"]["peak_live"]["total"].get<uint64_t>();
    EXPECT_LE(total_off + moved, total_mem + staging);
    EXPECT_LT(total_off, total_mem);
    EXPECT_EQ(so["measured"]["peak_live"]["total"], so["planned"]["peak_live"]["total"]);

    // memfit plan on this machine records the engine's offloaded program: exact, the moved bytes host memory.
    const CmdResult plan = run_memfit("plan --model nano --hardware cpu --gpus 1 --seq 32 --global-batch 2 --precision "
                                      "bf16 --micro-batch 2 --recompute none --attention flash --json " + off);
    ASSERT_EQ(plan.code, 0) << plan.err;
    const nlohmann::json best = nlohmann::json::parse(plan.out)["best"][0]["memory"];
    EXPECT_TRUE(best["exact"].get<bool>());
    EXPECT_EQ(best["host"].get<uint64_t>(), moved);
    EXPECT_EQ(best["per_device"]["offloaded"].get<uint64_t>(), 0u);   // not the device's

    expect_clean_failure(run_memfit(args + "--steps 2 --offload optimizer --out " + scratch("off24_x").string()),
                         "--offload-dir DIR");
    expect_clean_failure(run_memfit(args + "--steps 2 --offload-dir " + dir.string() + " --out " + scratch("off24_y").string()),
                         "add --offload optimizer");
    expect_clean_failure(run_memfit(args + off + "--offload-fraction 0 --steps 2 --out " + scratch("off24_z").string()),
                         "--offload-fraction 0");
    expect_clean_failure(run_memfit(args + "--steps 2 --offload optimizer --offload-dir " + (dir / "none").string() +
                                    " --out " + scratch("off24_w").string()),
                         "not a directory");
}

// --offload optimizer+params: under ZeRO 3 (one process: a shard of the whole) the weights join
// the file; the run ends where the in-memory ZeRO-3 one does, says where its bytes went, and
// memfit plan records the same program: exact, the moved bytes host memory.
TEST(Cli, OffloadedWeightsTrainBitForBit) {
    const fs::path text = small_text("offp.txt"), data = scratch("offp_data"), dir = scratch("offp_dir");
    fs::create_directories(dir);
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --threads 1 --checkpoint-every 10 --steps 10 --precision bf16 ",
                      args = base + "--zero 3 ";
    const std::string off = "--offload optimizer+params --offload-dir " + dir.string() + " ";
    const fs::path mem = scratch("offp_mem"), a = scratch("offp_off");
    ASSERT_EQ(run_memfit(args + "--progress quiet --out " + mem.string()).code, 0);
    const CmdResult r = run_memfit(args + off + "--progress plain --out " + a.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("offload: the master weights, optimizer states and weights' ZeRO-3 shard to a file under " +
                         dir.string()),
              std::string::npos) << r.out;
    EXPECT_FALSE(state(a, 10).empty());
    EXPECT_TRUE(state(a, 10) == state(mem, 10)) << "the offloaded run ended elsewhere";
    EXPECT_TRUE(fs::is_empty(dir)) << "the offload file was left behind";
    const nlohmann::json sm = summary(mem), so = summary(a);
    EXPECT_EQ(so["run_config"]["offload"], "optimizer+params");
    const uint64_t moved = so["measured"]["peak_live"]["offloaded"].get<uint64_t>();
    EXPECT_GT(moved, sm["measured"]["peak_live"]["master_weights"].get<uint64_t>() +
                         sm["measured"]["peak_live"]["optimizer_states"].get<uint64_t>());
    EXPECT_LT(so["planned"]["peak_live"]["parameters"].get<uint64_t>(),
              sm["planned"]["peak_live"]["parameters"].get<uint64_t>());
    const CmdResult plan = run_memfit("plan --model nano --hardware cpu --gpus 1 --seq 32 --global-batch 2 --precision "
                                      "bf16 --micro-batch 2 --recompute none --attention flash --zero 3 --json " + off);
    ASSERT_EQ(plan.code, 0) << plan.err;
    const nlohmann::json best = nlohmann::json::parse(plan.out)["best"][0]["memory"];
    EXPECT_TRUE(best["exact"].get<bool>());
    EXPECT_EQ(best["host"].get<uint64_t>(), moved);
    expect_clean_failure(run_memfit(base + "--zero 1 " + off + "--out " + scratch("offp_x").string()), "add --zero 3");
}

// --offload activations: each layer's saved activations wait in the file between its forward and
// its backward; the run ends where the resident one does, with only the activations' bytes
// lower on the device, says so, writes the flag back, and memfit plan records the same program.
TEST(Cli, OffloadedActivationsTrainBitForBit) {
    const fs::path text = small_text("offa.txt"), data = scratch("offa_data"), dir = scratch("offa_dir");
    fs::create_directories(dir);
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model llama-micro --data " + data.string() + " --seq 64 --micro-batch 2 "
                             "--sample 0 --eval-every 0 --threads 1 --checkpoint-every 10 --precision bf16 "
                             "--recompute selective --steps 10 ";
    const std::string off = "--offload activations --offload-dir " + dir.string() + " ";
    const fs::path mem = scratch("offa_mem"), a = scratch("offa_off");
    ASSERT_EQ(run_memfit(args + "--progress quiet --out " + mem.string()).code, 0);
    const CmdResult r = run_memfit(args + off + "--out " + a.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE((r.out + r.err).find("offload: the saved activations of every layer to a file under"), std::string::npos)
        << r.out;
    EXPECT_FALSE(state(a, 10).empty());
    EXPECT_TRUE(state(a, 10) == state(mem, 10)) << "the run with its activations offloaded ended elsewhere";
    EXPECT_TRUE(fs::is_empty(dir)) << "the offload file was left behind";
    const nlohmann::json sm = summary(mem), so = summary(a);
    EXPECT_EQ(so["run_config"]["offload"], "activations");
    EXPECT_EQ(so["measured"]["peak_live"], so["planned"]["peak_live"]);
    const uint64_t moved = so["measured"]["peak_live"]["offloaded"].get<uint64_t>();
    EXPECT_GT(moved, 0u);
    const auto acts = [](const nlohmann::json & s) { return s["measured"]["peak_live"]["activations"].get<uint64_t>(); };
    EXPECT_LT(acts(so), acts(sm));
    EXPECT_EQ(so["measured"]["peak_live"]["parameters"], sm["measured"]["peak_live"]["parameters"]);

    // The plan of the same run on this machine: the engine's program, exact, the moved bytes the host's.
    const CmdResult plan = run_memfit("plan --model llama-micro --hardware cpu --gpus 1 --seq 64 --global-batch 2 "
                                      "--micro-batch 2 --precision bf16 --recompute selective --json " + off);
    ASSERT_EQ(plan.code, 0) << plan.err;
    const nlohmann::json best = nlohmann::json::parse(plan.out)["best"][0];
    EXPECT_EQ(best["layout"]["offload"], "activations");
    EXPECT_TRUE(best["memory"]["exact"].get<bool>());
    EXPECT_EQ(best["memory"]["host"].get<uint64_t>(), moved);

    expect_clean_failure(run_memfit(args + "--offload activations --out " + scratch("offa_x").string()), "--offload-dir DIR");
    expect_clean_failure(run_memfit(args + "--offload-activations-layers 2 --out " + scratch("offa_y").string()),
                         "add --offload activations");
    expect_clean_failure(run_memfit(args + off + "--offload-activations-layers -1 --out " + scratch("offa_z").string()),
                         "--offload-activations-layers -1");
    expect_clean_failure(run_memfit(args + "--offload none+activations --out " + scratch("offa_w").string()),
                         "write --offload activations");
    expect_clean_failure(run_memfit(args + "--offload activation --out " + scratch("offa_v").string()),
                         "optimizer+params+activations");
}

}  // namespace
}  // namespace memfit
