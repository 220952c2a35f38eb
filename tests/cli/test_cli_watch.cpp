// Watching a run: --tensorboard's event files (read back by an independent reader that checks
// every record's CRCs), run.json and metrics.jsonl's per-rank memory, `memfit monitor` of a
// finished and of a missing run, and the report an out-of-memory step leaves (the injected
// allocation failure of MEMFIT_TEST_FAIL_ACQUIRE).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "report/tfevents_reader.h"

namespace memfit {
namespace {

using namespace cli_test;
using namespace memfit::test;

nlohmann::json read_json(const fs::path & p) { return nlohmann::json::parse(std::ifstream(p)); }

// A nano run on a small corpus, 6 steps logged at 1, 2, 4, 6.
struct NanoRun {
    fs::path data, out, tb;
    CmdResult result;
};
NanoRun nano_run(const std::string & name, const std::string & extra, int micro_batch = 2) {
    NanoRun r;
    const fs::path text = small_text(name + ".txt");
    r.data = scratch(name + "_data");
    r.out = scratch(name + "_out");
    r.tb = scratch(name + "_tb");
    EXPECT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + r.data.string()).code, 0);
    r.result = run_memfit("train --model nano --data " + r.data.string() + " --seq 32 --micro-batch " +
                          std::to_string(micro_batch) + " --sample 0 "
                          "--eval-every 4 --eval-batches 1 --log-every 2 --progress quiet --threads 1 --steps 6 --out " +
                          r.out.string() + " " + extra);
    return r;
}

TEST(CliWatch, TensorBoardFilesHoldTheLossAndEveryCategoryAtEveryLogStep) {
    const NanoRun run = nano_run("w_tb", "--tensorboard " + scratch("w_tb_tb").string());
    ASSERT_EQ(run.result.code, 0) << run.result.err;
    const std::vector<std::string> files = tfevents_files((run.tb / "rank0").string());
    ASSERT_EQ(files.size(), 1u);
    std::string error;
    const std::vector<TfEvent> events = read_tfevents(files[0], &error);
    ASSERT_EQ(error, "");   // every record's length and data CRCs check
    ASSERT_EQ(events.size(), 5u);   // the file_version record, then steps 1, 2, 4, 6
    EXPECT_EQ(events[0].file_version, "brain.Event:2");
    // Each logged step's loss is metrics.jsonl's; the last step's peaks are summary.json's.
    std::map<int64_t, double> loss;
    std::ifstream m(run.out / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
        const nlohmann::json j = nlohmann::json::parse(line);
        loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    const nlohmann::json peak = read_json(run.out / "summary.json")["measured"]["peak_live"];
    const std::vector<int64_t> steps = {1, 2, 4, 6};
    for (size_t i = 0; i < steps.size(); ++i) {
        const TfEvent & e = events[i + 1];
        SCOPED_TRACE(e.step);
        EXPECT_EQ(e.step, steps[i]);
        std::map<std::string, float> v(e.values.begin(), e.values.end());
        ASSERT_TRUE(v.count("train/loss"));
        EXPECT_FLOAT_EQ(v["train/loss"], float(loss.at(e.step)));
        for (const char * tag : {"train/lr", "train/grad_norm", "train/tokens_per_s", "memory/rss"}) {
            ASSERT_TRUE(v.count(tag)) << tag;
            EXPECT_GT(v[tag], 0) << tag;
        }
        EXPECT_EQ(v.count("train/val_loss"), e.step == 4 || e.step == 6 ? 1u : 0u);
        for (const char * c : {"parameters", "gradients", "optimizer_states", "activations"}) {
            ASSERT_TRUE(v.count(std::string("memory/peak/") + c)) << c;
            ASSERT_TRUE(v.count(std::string("memory/live/") + c)) << c;
            EXPECT_GT(v[std::string("memory/peak/") + c], 0) << c;
            if (e.step == 6) {
                EXPECT_FLOAT_EQ(v[std::string("memory/peak/") + c], peak[c].get<float>()) << c;
            }
        }
        // Weights, gradients and moments live between steps: their live bytes are their peaks.
        EXPECT_EQ(v["memory/live/parameters"], v["memory/peak/parameters"]);
    }
    // Resumed from step 4's checkpoint into the same folder: a second file whose first event after
    // its file_version is a SessionLog START at step 5 (TensorBoard drops the old steps 5.. then),
    // then step 6 (the next log step).
    const fs::path tb = scratch("w_tb_r");
    const NanoRun first = nano_run("w_tb_resume", "--checkpoint-every 4 --tensorboard " + tb.string());
    ASSERT_EQ(first.result.code, 0) << first.result.err;
    const CmdResult again = run_memfit("train --model nano --data " + first.data.string() + " --seq 32 --micro-batch 2 "
                                       "--sample 0 --eval-every 4 --eval-batches 1 --log-every 2 --progress quiet "
                                       "--threads 1 --steps 6 --out " + first.out.string() + " --resume " +
                                       (first.out / "checkpoints/step-000004").string() + " --tensorboard " +
                                       tb.string());
    ASSERT_EQ(again.code, 0) << again.err;
    const std::vector<std::string> both = tfevents_files((tb / "rank0").string());
    ASSERT_EQ(both.size(), 2u);
    const std::vector<TfEvent> resumed = read_tfevents(both[1], &error);
    ASSERT_EQ(error, "");
    ASSERT_EQ(resumed.size(), 3u);   // file_version, START at 5, step 6
    EXPECT_EQ(resumed[0].session_status, 0);
    EXPECT_EQ(resumed[1].session_status, 1);
    EXPECT_EQ(resumed[1].step, 5);
    EXPECT_EQ(resumed[2].step, 6);
    EXPECT_EQ(resumed[2].session_status, 0);
    // A folder that cannot be made is one line before the first step.
    const CmdResult bad = run_memfit("train --model nano --data " + run.data.string() + " --seq 32 --steps 2 "
                                     "--sample 0 --progress quiet --out " + scratch("w_tb_bad").string() +
                                     " --tensorboard /dev/null/tb");
    expect_clean_failure(bad, "cannot create the TensorBoard folder /dev/null/tb/rank0");
}

TEST(CliWatch, MetricsCarryEachRanksMemoryAndTheMonitorShowsIt) {
    const NanoRun run = nano_run("w_mon", "");
    ASSERT_EQ(run.result.code, 0) << run.result.err;
    const nlohmann::json plan = read_json(run.out / "run.json");
    EXPECT_EQ(plan["steps"], 6);
    EXPECT_EQ(plan["world"], 1);
    ASSERT_EQ(plan["ranks"].size(), 1u);
    const nlohmann::json summary = read_json(run.out / "summary.json");
    EXPECT_EQ(plan["ranks"][0]["planned_peak_total"], summary["planned"]["peak_live"]["total"]);
    std::string last;
    std::ifstream m(run.out / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) last = line;
    const nlohmann::json j = nlohmann::json::parse(last);
    ASSERT_EQ(j["ranks"].size(), 1u);
    EXPECT_EQ(j["ranks"][0]["peak"]["activations"], summary["measured"]["peak_live"]["activations"]);
    EXPECT_GT(j["ranks"][0]["rss"].get<uint64_t>(), 0u);

    const CmdResult mon = run_memfit("monitor " + run.out.string() + " --once");
    ASSERT_EQ(mon.code, 0) << mon.err;
    EXPECT_NE(mon.out.find("done (summary.json written)"), std::string::npos) << mon.out;
    EXPECT_NE(mon.out.find("step 6/6"), std::string::npos) << mon.out;
    EXPECT_NE(mon.out.find("optimizer_states"), std::string::npos) << mon.out;
    EXPECT_NE(mon.out.find("peak 100.0% of plan"), std::string::npos) << mon.out;   // plan == measurement

    expect_clean_failure(run_memfit("monitor " + scratch("w_none").string() + " --wait 0.2"), "no run.json after");
    EXPECT_TRUE(plan["pid_start"].is_number_unsigned()) << plan.dump();

    // A garbage run.json is named as such, at once (it is written whole, so it will not become one).
    const fs::path garbage = scratch("w_garbage");
    fs::create_directories(garbage);
    std::ofstream(garbage / "run.json") << "not json at all";
    expect_clean_failure(run_memfit("monitor " + garbage.string() + " --wait 30"), "not a memfit run's run.json");
    // The run's pid now belongs to another process (here this test's): not the run, which has
    // ended; the monitor used to watch that process forever.
    nlohmann::json reused = plan;
    reused["pid"] = ::getpid();
    reused["pid_start"] = plan["pid_start"].get<uint64_t>() + 12345;
    const fs::path other = scratch("w_reused");
    fs::create_directories(other);
    std::ofstream(other / "run.json") << reused.dump();
    const CmdResult gone = run_memfit("monitor " + other.string() + " --interval 0.05");
    EXPECT_EQ(gone.code, 1) << gone.out << gone.err;
    EXPECT_NE(gone.out.find("ended without summary.json"), std::string::npos) << gone.out;
}

TEST(CliWatch, AnAllocationThatFailsLeavesTheReportOfItsStep) {
    // Micro-batch 1 cannot be halved: the injected failure (the 50th buffer the steps acquire,
    // in step 1 or 2) ends the run, and the picture of that step up to the failing op stays.
    setenv("MEMFIT_TEST_FAIL_ACQUIRE", "50", 1);
    const NanoRun run = nano_run("w_oom", "", 1);
    unsetenv("MEMFIT_TEST_FAIL_ACQUIRE");
    expect_clean_failure(run.result, "failed (injected); step ");
    EXPECT_NE(run.result.err.find((run.out / "report.html").string()), std::string::npos) << run.result.err;
    const std::string html = slurp(run.out / "report.html");
    const size_t banner = html.find("class=\"failure\"");
    ASSERT_NE(banner, std::string::npos);
    EXPECT_NE(html.find("failed (injected)", banner), std::string::npos);
    const nlohmann::json trace = read_json(run.out / "trace.json");
    const int failed = trace["otherData"]["failed_op"].get<int>();
    EXPECT_GE(failed, 0);
    EXPECT_NE(run.result.err.find("memory up to op " + std::to_string(failed) + " "), std::string::npos) << run.result.err;
    EXPECT_NE(trace["otherData"]["failure"].get<std::string>().find("failed (injected)"), std::string::npos);
    // The last op in the trace is the one that failed; nothing after it ran.
    int last_op = -1;
    for (const auto & e : trace["traceEvents"])
        if (e["ph"] == "X") last_op = e["args"]["op"].get<int>();
    EXPECT_EQ(last_op, failed);
    EXPECT_FALSE(fs::exists(run.out / "summary.json"));
}

// A plan refused before it runs: a fixed configuration over --memory-budget, and --fit auto
// when even its smallest configuration does not fit (whose plan the report then draws).
TEST(CliWatch, ARefusedPlanLeavesThePlansPictureUpToWhereItPassesTheBudget) {
    for (const auto & [extra, budget] : {std::pair<std::string, uint64_t>{"", 2500000}, {"--fit auto ", 2300000}}) {
        SCOPED_TRACE(extra);
        const NanoRun run = nano_run("w_refused", extra + "--memory-budget " + std::to_string(budget));
        expect_clean_failure(run.result, "does not fit: the plan needs ");
        EXPECT_NE(run.result.err.find("where its live bytes pass the budget: " + (run.out / "report.html").string()),
                  std::string::npos) << run.result.err;
        const nlohmann::json trace = read_json(run.out / "trace.json");
        const int failed = trace["otherData"]["failed_op"].get<int>();
        EXPECT_NE(run.result.err.find("up to op " + std::to_string(failed) + " "), std::string::npos) << run.result.err;
        // The planned bytes rise past the budget at that op and not before.
        std::vector<uint64_t> totals;
        for (const auto & e : trace["traceEvents"])
            if (e["ph"] == "C" && e["name"] == "memory.total") totals.push_back(e["args"]["total"].get<uint64_t>());
        ASSERT_GT(failed, 0);   // the weights fit: the step's activations pass the budget
        ASSERT_EQ(totals.size(), size_t(failed) + 1);
        EXPECT_GT(totals.back(), budget);
        for (size_t i = 0; i + 1 < totals.size(); ++i) EXPECT_LE(totals[i], budget) << i;
        EXPECT_NE(slurp(run.out / "report.html").find("class=\"failure\""), std::string::npos);
        EXPECT_FALSE(fs::exists(run.out / "run.json"));   // the run never started
    }
}

}  // namespace
}  // namespace memfit
