// Runs that survive the real world, from the command line: a stop signal checkpoints and
// --resume auto continues bit for bit; a checkpoint, metrics or report write that fails costs
// the run nothing it already had; --skip-spikes leaves bad steps out and rolls back.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memfit {
namespace {

using namespace cli_test;

// Preemption: a SIGTERM in the middle of a run stops it with a checkpoint, a summary and exit 0;
// the same command with --resume auto continues (and starts fresh when there is nothing to
// continue), and the final state equals an uninterrupted run's bit for bit. With --stop-grace 0
// the step in flight is abandoned instead of finished, and the result is the same.
TEST(Cli, StopSignalsCheckpointAndResumeAutoIsBitwise) {
    const fs::path text = small_text("s23.txt"), data = scratch("s23_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    // Runs ARGS in the background and sends SIGTERM once metrics.jsonl logged step `at`.
    auto interrupted = [&](const std::string & args, const fs::path & out, int at, const std::string & log) {
        const std::string script = std::string(MEMFIT_BINARY) + " " + args + " --log-every 1 --out " + out.string() +
                                   " > " + log + " 2>&1 & P=$!; while ! grep -q '\"step\":" + std::to_string(at) +
                                   ",' " + (out / "metrics.jsonl").string() + " 2>/dev/null; do sleep 0.005; "
                                   "kill -0 $P 2>/dev/null || break; done; kill -TERM $P; wait $P";
        const int status = std::system(script.c_str());
        std::ifstream in(log);
        const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), said);
    };
    auto bytes = [](const fs::path & p) {
        std::ifstream in(p, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    for (const bool abandon : {false, true}) {
        // Abandoning needs steps long enough to be caught in flight: the larger model.
        const int steps = abandon ? 12 : 400;
        const std::string args = std::string("train --data ") + data.string() + " --sample 0 --eval-every 0 "
                                 "--progress quiet --threads 1 --checkpoint-every " + (abandon ? "6" : "100") +
                                 " --steps " + std::to_string(steps) + " " +
                                 (abandon ? "--model micro --seq 128 --micro-batch 8 --stop-grace 0"
                                          : "--model nano --seq 32 --micro-batch 2");
        const fs::path ref = scratch(abandon ? "s23_ref_a" : "s23_ref"), out = scratch(abandon ? "s23_a" : "s23");
        ASSERT_EQ(run_memfit(args + " --out " + ref.string()).code, 0);
        const std::string log = scratch("s23.log").string();
        for (const int at : {steps / 6, steps * 2 / 3}) {
            const auto [code, msg] = interrupted(args + " --resume auto", out, at, log);
            ASSERT_EQ(code, 0) << msg;
            EXPECT_NE(msg.find("memfit: stopped by SIGTERM at step "), std::string::npos) << msg;
            EXPECT_EQ(msg.find("abandoned") != std::string::npos, abandon) << msg;
            EXPECT_TRUE(fs::exists(out / "summary.json"));
            const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
            EXPECT_EQ(summary.value("stopped_by", ""), "SIGTERM");
            EXPECT_LT(summary.value("steps_done", steps), steps);
        }
        ASSERT_EQ(run_memfit(args + " --resume auto --out " + out.string()).code, 0);
        const std::string state = fmt::format("checkpoints/step-{:06d}/state.safetensors", steps);
        EXPECT_EQ(bytes(out / state), bytes(ref / state)) << "the interrupted run's final state differs";
        const CmdResult again = run_memfit(args + " --resume auto --out " + out.string());
        EXPECT_EQ(again.code, 0) << again.err;
        EXPECT_NE(again.out.find("the run is complete"), std::string::npos) << again.out;
    }
}

// A checkpoint that cannot be written (a real write error: a file-size limit, as a full disk
// would give) leaves the previous checkpoint intact and no partial folder; the run stops with one
// line, or with --on-checkpoint-error continue trains on and counts the failures; the intact
// checkpoint resumes.
TEST(Cli, CheckpointWriteFailureKeepsThePrevious) {
    const fs::path text = small_text("d23.txt"), data = scratch("d23_data"), out = scratch("d23");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --checkpoint-every 5 --out " + out.string();
    ASSERT_EQ(run_memfit(args + " --steps 5").code, 0);
    // nano's state is 1.5 MiB: a limit of 1000 KiB fails its write with EFBIG.
    const std::string err_path = scratch("d23.err").string();
    auto limited = [&](const std::string & more) {
        const std::string cmd = "bash -c 'ulimit -f 1000; " + std::string(MEMFIT_BINARY) + " " + args + more +
                                "' > /dev/null 2> " + err_path;
        const int status = std::system(cmd.c_str());
        std::ifstream in(err_path);
        CmdResult r;
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        return r;
    };
    auto folders = [&] {
        std::vector<std::string> v;
        for (const auto & e : fs::directory_iterator(out / "checkpoints")) v.push_back(e.path().filename().string());
        std::sort(v.begin(), v.end());
        return v;
    };
    CmdResult stop = limited(" --steps 10 --resume auto");
    // The write probe meets the limit first: its warning comes before the error (both on stderr).
    const std::string probe_warning = "memfit: warning: a checkpoint (1.52 MiB) may fail: a probe of its write failed";
    ASSERT_EQ(stop.err.rfind(probe_warning, 0), 0u) << stop.err;
    stop.err.erase(0, stop.err.find('\n') + 1);
    expect_clean_failure(stop, "the checkpoint of step 10 failed (" + (out / "checkpoints/step-000005").string() +
                                   " is intact)");
    EXPECT_EQ(folders(), std::vector<std::string>{"step-000005"}) << "a partial folder stayed";
    const CmdResult go_on = limited(" --steps 12 --resume auto --on-checkpoint-error continue");
    EXPECT_EQ(go_on.code, 0) << go_on.err;
    EXPECT_NE(go_on.err.find("memfit: warning: the checkpoint of step 12 failed"), std::string::npos) << go_on.err;
    EXPECT_EQ(folders(), std::vector<std::string>{"step-000005"});
    const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    EXPECT_EQ(summary.value("checkpoint_errors", 0), 2);
    ASSERT_EQ(run_memfit(args + " --steps 12 --resume auto").code, 0);
    EXPECT_EQ(folders(), (std::vector<std::string>{"step-000005", "step-000010", "step-000012"}));
}

// Metrics that cannot be written (metrics.jsonl past a 50 KiB file-size limit after ~100 steps)
// are lost, not the run: one warning, the count in summary.json, every step trained, exit 0. A
// report that cannot be written (report.html is ~65 KiB) is a warning too.
TEST(Cli, MetricsWriteFailureDoesNotStopTheRun) {
    const fs::path text = small_text("m23.txt"), data = scratch("m23_data"), out = scratch("m23");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string err_path = scratch("m23.err").string();
    const std::string cmd = "bash -c 'ulimit -f 50; " + std::string(MEMFIT_BINARY) + " train --model nano --data " +
                            data.string() + " --seq 32 --micro-batch 2 --sample 0 --eval-every 0 --progress quiet "
                            "--threads 1 --log-every 1 --steps 700 --save-final false --out " + out.string() +
                            "' > /dev/null 2> " + err_path;
    const int status = std::system(cmd.c_str());
    std::ifstream in(err_path);
    const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
    EXPECT_NE(err.find("metrics.jsonl: cannot write the line of step"), std::string::npos) << err;
    EXPECT_NE(err.find("memfit: warning: " + (out / "report.html").string()), std::string::npos) << err;
    EXPECT_EQ(err.find("memfit: error"), std::string::npos) << err;
    const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    EXPECT_EQ(summary["steps_done"].get<int>(), 700);
    const int lost = summary.value("metrics_lines_lost", 0);
    EXPECT_GT(lost, 300);
    EXPECT_LT(lost, 650);   // lines of about 500 bytes: about 100 written before the limit
    EXPECT_EQ(fs::file_size(out / "metrics.jsonl"), 50u * 1024u);
}

// --skip-spikes: an injected gradient spike, a bad batch (a loss spike) and an injected NaN
// gradient are not applied (the state after the step is the state before it, byte for byte) and
// the run goes on; three bad
// steps in a row roll the run back to its last checkpoint with their batches left out, and a
// resume from a later checkpoint leaves them out too (it ends equal to the run that did not stop).
TEST(Cli, SpikesAreSkippedAndRollBack) {
    const fs::path text = small_text("k23.txt"), data = scratch("k23_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string args = "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 --sample 0 "
                             "--eval-every 0 --progress quiet --threads 1 --log-every 1 --skip-spikes 6 "
                             "--checkpoint-every 1 --keep-checkpoints 100 --steps 40";
    auto bytes = [](const fs::path & p) {
        std::ifstream in(p, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    auto state = [](const fs::path & out, int step) {
        return out / fmt::format("checkpoints/step-{:06d}/state.safetensors", step);
    };
    // The injected spikes (MEMFIT_TEST_GRAD_SPIKES, read by the trainer) reach the child run.
    auto with_spikes = [](const char * spec, const std::string & cmd) {
        setenv("MEMFIT_TEST_GRAD_SPIKES", spec, 1);
        const CmdResult r = run_memfit(cmd);
        unsetenv("MEMFIT_TEST_GRAD_SPIKES");
        return r;
    };
    const fs::path a = scratch("k23_a");
    const CmdResult ra = with_spikes("25:1e4,32:nan", args + " --out " + a.string());
    ASSERT_EQ(ra.code, 0) << ra.err;
    EXPECT_TRUE(bytes(state(a, 24)) == bytes(state(a, 25))) << "the spike at step 25 was applied";
    EXPECT_TRUE(bytes(state(a, 31)) == bytes(state(a, 32))) << "the NaN gradient at step 32 was applied";
    EXPECT_TRUE(bytes(state(a, 25)) != bytes(state(a, 26)));
    const nlohmann::json sa = nlohmann::json::parse(std::ifstream(a / "summary.json"));
    EXPECT_EQ(sa["spikes"]["skipped"].get<int>(), 2) << sa["spikes"].dump();
    EXPECT_EQ(sa["spikes"]["loss_outliers"].get<int>(), 0);
    EXPECT_EQ(sa["spikes"]["rollbacks"].get<int>(), 0);
    EXPECT_TRUE(std::isfinite(sa["final_loss"].get<double>()));
    // A bad batch (every target the one token the text never has) once the window is warm and
    // steady (its 128 steps after the first 22): the loss is the outlier, decided before the
    // update, which leaves the state as it was.
    const fs::path l = scratch("k23_loss");
    const CmdResult rl = with_spikes("150:batch", "train --model nano --data " + data.string() + " --seq 32 "
                                     "--micro-batch 2 --sample 0 --eval-every 0 --progress quiet --threads 1 "
                                     "--log-every 1 --skip-spikes 3 --spike-rollback 0 --lr 1e-3 --steps 150 "
                                     "--checkpoint-every 1 --keep-checkpoints 2 --out " + l.string());
    ASSERT_EQ(rl.code, 0) << rl.err;
    EXPECT_TRUE(bytes(state(l, 149)) == bytes(state(l, 150))) << "the bad batch of step 150 was applied";
    std::string spike_150;
    std::ifstream ml(l / "metrics.jsonl");
    for (std::string line; std::getline(ml, line);)
        if (const auto m = nlohmann::json::parse(line); m.value("step", 0) == 150) spike_150 = m.value("spike", "");
    EXPECT_EQ(spike_150.rfind("loss ", 0), 0u) << spike_150;
    const nlohmann::json sl = nlohmann::json::parse(std::ifstream(l / "summary.json"));
    EXPECT_EQ(sl["spikes"]["loss_outliers"].get<int>(), 1) << sl["spikes"].dump();
    // Without --skip-spikes the NaN ends the run.
    expect_clean_failure(with_spikes("32:nan", "train --model nano --data " + data.string() + " --seq 32 --micro-batch 2 "
                                    "--sample 0 --eval-every 0 --progress quiet --threads 1 --steps 40 --out " +
                                    scratch("k23_nan").string()),
                         "gradient norm became nan at step 32");

    // Three in a row: back to the newest checkpoint (step 22's: skipped steps leave the state as
    // it was, so it holds the state before the spikes), the three batches left out from then on.
    const char * spikes = "20:1e4,21:1e4,22:1e4";
    const fs::path b = scratch("k23_b");
    const CmdResult rb = with_spikes(spikes, args + " --out " + b.string());
    ASSERT_EQ(rb.code, 0) << rb.err;
    const nlohmann::json sb = nlohmann::json::parse(std::ifstream(b / "summary.json"));
    EXPECT_EQ(sb["spikes"]["rollbacks"].get<int>(), 1) << sb["spikes"].dump();
    EXPECT_EQ(sb["spikes"]["batches_left_out"].get<int>(), 3);
    std::ifstream mb(b / "metrics.jsonl");
    std::vector<nlohmann::json> rollback_lines;
    for (std::string line; std::getline(mb, line);)
        if (const auto m = nlohmann::json::parse(line); m.value("event", "") == "rollback") rollback_lines.push_back(m);
    ASSERT_EQ(rollback_lines.size(), 1u);
    const nlohmann::json meta = nlohmann::json::parse(std::ifstream(b / "checkpoints/step-000030/meta.json"));
    EXPECT_EQ(meta["skipped_batches"].size(), 3u);
    EXPECT_EQ(rollback_lines[0]["skipped_batches"], meta["skipped_batches"]) << "metrics and checkpoint disagree";
    // Resumed from step 30, the same batches stay out: the end is the uninterrupted run's.
    const fs::path c = scratch("k23_c");
    fs::create_directories(c / "checkpoints");
    fs::copy(b / "checkpoints/step-000030", c / "checkpoints/step-000030", fs::copy_options::recursive);
    ASSERT_EQ(with_spikes(spikes, args + " --resume " + (c / "checkpoints").string() + " --out " + c.string()).code, 0);
    EXPECT_TRUE(bytes(state(c, 40)) == bytes(state(b, 40)));
}

}  // namespace
}  // namespace memfit
