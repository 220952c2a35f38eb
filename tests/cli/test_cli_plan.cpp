// From `memfit plan` to a running job on the CPU: the planner's row carries the command that runs
// it and writes it as memfit's config file and as DeepSpeed's; `memfit train` under mpirun runs
// each file, and every rank measures the peak live bytes the plan printed, category by category
// (a pipeline's ranks their stage's). Also: what the planner refuses and answers in one line.
#include <gtest/gtest.h>

#include <cstdlib>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"

using namespace cli_test;

namespace {

// `memfit ARGS` under mpirun with n ranks, one thread each, as the mpi_train scripts launch it.
int mpirun(int n, const std::string & args, const fs::path & log) {
    const std::string cmd = std::string(MEMFIT_MPIEXEC) + " --oversubscribe --allow-run-as-root --bind-to none -n " +
                            std::to_string(n) + " -x OMP_NUM_THREADS=1 " + MEMFIT_BINARY + " " + args + " >" +
                            log.string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

nlohmann::json read_json(const fs::path & p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
}

// Every rank of a run measured what `row` (a plan's best row) planned for its stage: each
// category of the most loaded stage's ranks, and every stage's total; and each rank's own plan
// (summary.json's per_rank.by_rank[i].planned) is its measurement.
void expect_planned_on_every_rank(const nlohmann::json & row, const fs::path & run) {
    const nlohmann::json summary = read_json(run / "summary.json");
    const nlohmann::json & ranks = summary["per_rank"]["by_rank"];
    const nlohmann::json & L = row["layout"];
    const int tp = L["tp"], pp = L["pp"], dp = L["dp"].get<int>() * L["cp"].get<int>();   // context ranks in the data axis
    ASSERT_EQ(ranks.size(), size_t(tp * pp * dp));
    const nlohmann::json & stages = row["memory"]["stages"];
    uint64_t largest = 0;
    for (const auto & s : stages) largest = std::max(largest, s.get<uint64_t>());
    for (const auto & r : ranks) {
        const int stage = r["rank"].get<int>() / (tp * dp);   // tp innermost, then dp, then pp
        SCOPED_TRACE("rank " + r["rank"].dump() + ", stage " + std::to_string(stage));
        const nlohmann::json & live = r["peak_live"];
        EXPECT_EQ(r["planned"]["peak_live"], live) << "the rank's own program's plan against its measurement";
        EXPECT_EQ(r["planned"]["reserved"], r["reserved"]);
        if (pp > 1) {
            EXPECT_EQ(live["total"].get<uint64_t>(), stages[size_t(stage)].get<uint64_t>());
        }
        if (pp > 1 && stages[size_t(stage)].get<uint64_t>() != largest) continue;
        for (const auto & [cat, bytes] : row["memory"]["per_device"].items()) {
            if (cat != "runtime") {
                EXPECT_EQ(live[cat], bytes) << cat;
            }
        }
    }
}

}  // namespace

TEST(PlanToRun, EmittedConfigsTrainAsPlannedOnEveryRank) {
    const fs::path text = small_text("plan_run.txt"), data = scratch("plan_run_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string plan = "plan --model llama-nano --hardware cpu --calibration '' --gpus 2 --seq 32 "
                             "--global-batch 8 --precision fp32 --top 1 --json";
    const std::string train = " --data " + data.string() + " --steps 2 --eval-every 0 --sample 0 --progress plain";
    int k = 0;
    for (const std::string fixed : {"", " --tp 2", " --pp 2 --schedule 1f1b", " --zero 3 --lora-rank 4 --base-weights nf4",
                                    " --cp 2"}) {
        SCOPED_TRACE("plan" + fixed);
        const fs::path cfg = scratch("cfg" + std::to_string(k) + ".json"), ds = scratch("ds" + std::to_string(k) + ".json");
        // The plan records the CPU's gemms with the threads the ranks will have: oneDNN's scratch
        // depends on them (what the flash backward's scratch hides in the other layouts).
        const char * was = std::getenv("OMP_NUM_THREADS");
        const std::string before = was ? was : "";
        ::setenv("OMP_NUM_THREADS", "1", 1);
        const CmdResult p = run_memfit(plan + fixed + " --emit-config " + cfg.string() + " --emit-deepspeed " + ds.string());
        if (was) ::setenv("OMP_NUM_THREADS", before.c_str(), 1);
        else ::unsetenv("OMP_NUM_THREADS");
        ASSERT_EQ(p.code, 0) << p.err;
        const nlohmann::json row = nlohmann::json::parse(p.out)["best"][0];
        EXPECT_TRUE(row["runnable"].get<bool>()) << row["runnable_why"];
        EXPECT_EQ(row["runnable_why"], "");
        EXPECT_TRUE(row["memory"]["exact"].get<bool>());
        EXPECT_EQ(row["command"].get<std::string>().rfind("mpirun -np 2 memfit train --model llama-nano --seq 32", 0), 0u)
            << row["command"];
        EXPECT_NE(p.err.find("wrote " + cfg.string()), std::string::npos) << p.err;

        const fs::path run = scratch("plan_run" + std::to_string(k));
        ASSERT_EQ(mpirun(2, "train --config " + cfg.string() + train + " --out " + run.string(), run.string() + ".log"), 0)
            << slurp(run.string() + ".log");
        expect_planned_on_every_rank(row, run);
        // The DeepSpeed file holds the batch and ZeRO (and AutoTP's size); the model, the
        // sequence and what DeepSpeed has no key for come from the command line.
        if (row["layout"]["pp"] == 1 && row["layout"]["cp"] == 1) {   // DeepSpeed's file has no --cp
            // LoRA is the training script's, not DeepSpeed's file's (the plan's note says so).
            const std::string lora = fixed.find("--lora-rank") != std::string::npos ? " --lora-rank 4 --base-weights nf4" : "";
            const fs::path dsrun = scratch("plan_dsrun" + std::to_string(k));
            ASSERT_EQ(mpirun(2, "train --config " + ds.string() + " --model llama-nano --seq 32 --attention flash "
                                "--recompute " + row["recompute"].get<std::string>() +
                                (row["layout"]["sp"].get<bool>() ? " --sp" : "") + lora + train + " --out " + dsrun.string(),
                             dsrun.string() + ".log"),
                      0)
                << slurp(dsrun.string() + ".log");
            expect_planned_on_every_rank(row, dsrun);
        }
        ++k;
    }
}

// The planner's own refusals: one line with the numbers and what to change.
TEST(PlanToRun, ContradictionsAreOneClearLine) {
    const std::string base = "plan --model llama2-70b --hardware h100-80g";
    expect_clean_failure(run_memfit(base + " --gpus 1 --micro-batch 4 --grad-accum 4 --global-batch 8"),
                         "--micro-batch 4 x --grad-accum 4 = 16 sequences per data-parallel rank do not divide "
                         "--global-batch 8");
    expect_clean_failure(run_memfit(base + " --gpus 8 --tp 3"), "--tp 3 does not divide --gpus 8; tensor-parallel "
                                                                  "sizes that do: 1, 2, 4, 8");
    expect_clean_failure(run_memfit(base + " --gpus 8 --tp 16"), "--tp 16 does not divide --gpus 8");
    expect_clean_failure(run_memfit(base + " --gpus 64 --tp 6"), "--tp 6 does not divide --gpus 64");
    expect_clean_failure(run_memfit(base + " --gpus 12"), "use --gpus 8 or 16");
    expect_clean_failure(run_memfit(base + " --gpus 16 --nodes 1"), "at most 8 devices; use --nodes 2");
    expect_clean_failure(run_memfit(base + " --gpus 8 --pp 3"), "--pp 3 does not divide the 8 devices");
    expect_clean_failure(run_memfit(base + " --gpus 8 --global-batch 12 --micro-batch 8"),
                         "--micro-batch 8 divides no layout's per-rank batch");
    expect_clean_failure(run_memfit(base + " --gpus 8 --max-seq --max-model"), "each ask one question");
    expect_clean_failure(run_memfit(base + " --gpus 8 --max-micro-batch --global-batch 64"), "drop --global-batch 64");
    expect_clean_failure(run_memfit("plan --max-model nonsense"), "--max-model nonsense: no preset");
    // A switch given false is fixed off, not searched.
    const CmdResult off = run_memfit("plan --model llama2-7b --gpus 8 --tp 2 --sp=false --json --top 3");
    ASSERT_EQ(off.code, 0) << off.err;
    const nlohmann::json off_json = nlohmann::json::parse(off.out);   // alive for the loop
    for (const auto & b : off_json["best"]) EXPECT_FALSE(b["layout"]["sp"].get<bool>());
    const CmdResult no = run_memfit("plan --model llama2-7b --gpus 8 --tp 2 --no-sp --json --top 3");
    ASSERT_EQ(no.code, 0) << no.err;
    const nlohmann::json no_json = nlohmann::json::parse(no.out);   // alive for the loop
    for (const auto & b : no_json["best"]) EXPECT_FALSE(b["layout"]["sp"].get<bool>());
}

// Every search docs/plan.md shows as a command (each line that starts with `memfit plan `; the
// `$ memfit plan` lines of output blocks are checked by scripts/check-docs.sh) runs, and lists only what fits: every row at most the device's memory, by the bytes it
// carries, and train's verdict on each (a search with --include-plan-only: a reason for each row
// train does not run). The documentation cannot drift into a crash or a row that does not fit.
TEST(PlanToRun, EveryDocumentedSearchListsOnlyWhatFits) {
    std::ifstream doc(std::string(MEMFIT_SOURCE_DIR) + "/docs/plan.md");
    ASSERT_TRUE(doc) << "docs/plan.md";
    std::string line;
    int searches = 0;
    while (std::getline(doc, line)) {
        const std::string prefix = "memfit plan ";
        if (line.rfind(prefix, 0) != 0) continue;
        std::string args = line.substr(prefix.size() - 5);   // "plan ..."
        args = args.substr(0, args.find('#'));
        if (const size_t at = args.find("--emit-config "); at != std::string::npos)
            args = args.substr(0, at) + "--emit-config " + scratch("doc_plan.json").string();
        SCOPED_TRACE(args);
        ++searches;
        const CmdResult r = run_memfit(args + " --json --calibration ''");
        EXPECT_LT(r.code, 128) << r.err;
        ASSERT_FALSE(r.out.empty()) << r.err;
        const nlohmann::json j = nlohmann::json::parse(r.out);
        EXPECT_EQ(r.code == 0, !j["best"].empty()) << r.err;
        // --include-plan-only asks for what train does not run yet: each such row says why.
        const bool plan_only = args.find("--include-plan-only") != std::string::npos;
        for (const auto & b : j["best"]) {
            EXPECT_TRUE(b["fits"].get<bool>());
            EXPECT_LE(b["memory"]["total"].get<uint64_t>(), j["device_memory"].get<uint64_t>());
            if (plan_only && !b["runnable"].get<bool>()) {
                EXPECT_FALSE(b["runnable_why"].get<std::string>().empty());
                continue;
            }
            EXPECT_TRUE(b["runnable"].get<bool>()) << b["runnable_why"];
            EXPECT_FALSE(b["command"].get<std::string>().empty());
        }
    }
    EXPECT_GE(searches, 7);
}

// What the output knows and what it does not: "exact" defined, borrowed efficiencies said (and
// the speeds rounded), and 120 columns unless --wide.
TEST(PlanToRun, OutputSaysWhatItKnowsInOneHundredTwentyColumns) {
    const std::vector<std::string> searches = {
        "plan --model llama2-70b --hardware h100-80g --gpus 64 --seq 4096 --global-batch 1024 --explain",
        "plan --model llama2-70b --hardware h100-80g --gpus 64 --seq 4096 --global-batch 1024 --include-plan-only",
        "plan --model llama3-8b --hardware h200 --gpus 1 --seq 8192 --global-batch 8",
        "plan --model llama3-70b --hardware h200 --gpus 1 --seq 2048 --global-batch 8",
        "plan --model llama2-70b --hardware l40s --gpus 1 --seq 512 --global-batch 1 --lora-rank 16 --base-weights nf4",
        "plan --model llama3.2-3b --hardware rtx4090 --gpus 1 --max-seq",
        "plan --model llama-nano --hardware cpu --calibration '' --gpus 2 --seq 32 --global-batch 8 --pp 2",
    };
    for (const std::string & args : searches) {
        SCOPED_TRACE(args);
        const CmdResult r = run_memfit(args);
        EXPECT_LT(r.code, 128) << r.err;
        std::istringstream lines(r.out);
        std::string l;
        while (std::getline(lines, l)) EXPECT_LE(l.size(), 120u) << l;
        if (r.code != 0) continue;
        EXPECT_NE(r.out.find("plan: exact = the byte-exact step program"), std::string::npos);
        const bool borrowed = args.find("h200") != std::string::npos || args.find("l40s") != std::string::npos ||
                              args.find("rtx4090") != std::string::npos;
        EXPECT_EQ(r.out.find("efficiencies are h100-80g's") != std::string::npos, borrowed) << r.out;
    }
    const std::string wide_args = "plan --model llama2-70b --hardware h100-80g --gpus 64 --seq 4096 --global-batch 1024 "
                                  "--wide";
    const CmdResult wide = run_memfit(wide_args + " --offload none");
    ASSERT_EQ(wide.code, 0) << wide.err;
    EXPECT_NE(wide.out.find("dp 32 x tp 2 x pp 1, ZeRO-3, sp "), std::string::npos) << wide.out;   // torchtitan's 2D
    // Every offload searched: the layout column is as wide as its longest name.
    const CmdResult all = run_memfit(wide_args);
    ASSERT_EQ(all.code, 0) << all.err;
    EXPECT_NE(all.out.find("+activations"), std::string::npos) << all.out;
    std::istringstream rows(all.out);
    size_t at = std::string::npos;
    for (std::string l; std::getline(rows, l);) {
        const size_t mb = l.find("micro-batch ");
        if (mb == std::string::npos || l.find("  dp ") == std::string::npos) continue;
        if (at == std::string::npos) at = mb;
        EXPECT_EQ(mb, at) << all.out;
    }
    const CmdResult h200 = run_memfit("plan --model llama3-8b --hardware h200 --gpus 1 --seq 8192 --global-batch 8 --json");
    ASSERT_EQ(h200.code, 0) << h200.err;
    const nlohmann::json j = nlohmann::json::parse(h200.out);
    EXPECT_EQ(j["efficiencies_from"], "h100-80g");
    EXPECT_NE(j["exact_means"].get<std::string>().find("measured on one H200"), std::string::npos);
    const CmdResult h100 = run_memfit("plan --model llama3-8b --hardware h100-80g --gpus 1 --seq 8192 --global-batch 8 "
                                      "--json");
    ASSERT_EQ(h100.code, 0) << h100.err;
    EXPECT_TRUE(nlohmann::json::parse(h100.out)["efficiencies_from"].is_null());
}
