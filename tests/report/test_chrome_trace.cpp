#include "report/chrome_trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "core/error.h"
#include "core/units.h"
#include "memory/program.h"

namespace memfit {
namespace {

using nlohmann::json;

constexpr int kOps = 30;
constexpr int kPeakOp = 17;

const char * const kNames[] = {"embed_fwd", "matmul_fwd", "attention_fwd", "matmul_bwd", "adamw"};

Phase phase_of(int i) {
    if (i < 12) return Phase::forward;
    if (i < 24) return Phase::backward;
    if (i < 27) return Phase::optimizer;
    return Phase::other;
}

// 30 ops: forward, backward, optimizer, other; activations rise through the forward and the
// first backward ops, then fall; parameters/optimizer states constant; gradients grow in the
// backward. Ops have uneven durations, one of them zero-length.
ReportData synthetic_report() {
    ReportData r;
    r.title = "memfit profile: test, batch 2 x seq 8";
    r.config = {{"model", "gpt2-tiny"}, {"batch", 2}, {"seq", 8}, {"dtype", "fp32"}};
    r.timeline.program = "train";
    double t = 0;
    for (int i = 0; i < kOps; ++i) {
        TimelineEvent e;
        e.op = i;
        e.name = kNames[i % 5];
        e.phase = phase_of(i);
        e.layer = i < 27 ? (i % 12) / 4 : -1;
        e.live[Category::parameters] = 4 * MiB;
        e.live[Category::optimizer_states] = 8 * MiB;
        e.live[Category::activations] = uint64_t(i <= kPeakOp ? 1000 + 77777ull * i : 1000 + 77777ull * (2 * kPeakOp - i));
        e.live[Category::gradients] = e.phase == Phase::backward ? 12345ull * uint64_t(i - 11) : 0;
        e.live[Category::workspace] = i == 5 ? 333 : 0;   // non-zero at one op only
        e.begin_us = t;
        const double dur = i == 3 ? 0.0 : 10.0 + 1.5 * i;
        e.end_us = t + dur;
        t += dur + 2.0;
        r.timeline.events.push_back(e);
    }
    r.num_ops = kOps;
    r.peak_op = kPeakOp;
    r.planned_peak = r.timeline.events[kPeakOp].live;
    r.measured_peak = r.timeline.events[kPeakOp].live;
    r.measured_peak[Category::runtime] = 42;
    r.budget = 64 * MiB;
    return r;
}

std::vector<json> events_with_ph(const json & trace, const std::string & ph) {
    std::vector<json> out;
    for (const auto & e : trace["traceEvents"]) {
        if (e["ph"] == ph) out.push_back(e);
    }
    return out;
}

TEST(ChromeTrace, RoundTripsThroughText) {
    const ReportData r = synthetic_report();
    const json trace = json::parse(chrome_trace(r).dump());

    ASSERT_TRUE(trace.is_object());
    ASSERT_TRUE(trace["traceEvents"].is_array());
    EXPECT_EQ(trace["displayTimeUnit"], "ms");

    // Every event has ph, pid, tid; all but metadata have ts.
    for (const auto & e : trace["traceEvents"]) {
        ASSERT_TRUE(e.contains("ph")) << e.dump();
        ASSERT_TRUE(e.contains("pid")) << e.dump();
        ASSERT_TRUE(e.contains("tid")) << e.dump();
        ASSERT_TRUE(e.contains("name")) << e.dump();
        if (e["ph"] != "M") {
            ASSERT_TRUE(e.contains("ts")) << e.dump();
            ASSERT_TRUE(e["ts"].is_number()) << e.dump();
        }
    }
}

TEST(ChromeTrace, OneCompleteEventPerOp) {
    const ReportData r = synthetic_report();
    const json trace = json::parse(chrome_trace(r).dump());
    const auto xs = events_with_ph(trace, "X");
    ASSERT_EQ(xs.size(), size_t(kOps));
    for (int i = 0; i < kOps; ++i) {
        const auto & e = r.timeline.events[size_t(i)];
        const json & x = xs[size_t(i)];
        EXPECT_EQ(x["name"], e.name);
        EXPECT_EQ(x["cat"], phase_name(e.phase));
        EXPECT_DOUBLE_EQ(x["ts"].get<double>(), e.begin_us);
        const double dur = x["dur"].get<double>();
        if (e.end_us == e.begin_us) {
            EXPECT_GE(dur, 0.001);
            EXPECT_LT(dur, 0.01);
        } else {
            EXPECT_DOUBLE_EQ(dur, e.end_us - e.begin_us);
        }
        EXPECT_EQ(x["pid"], 1);
        EXPECT_EQ(x["tid"], 1);
        EXPECT_EQ(x["args"]["op"], i);
        EXPECT_EQ(x["args"]["layer"], e.layer);
        EXPECT_EQ(x["args"]["phase"], phase_name(e.phase));
        EXPECT_EQ(x["args"]["live_total"].get<uint64_t>(), e.live.total());
    }
}

TEST(ChromeTrace, CountersCarryExactBytesPerCategory) {
    const ReportData r = synthetic_report();
    const json trace = json::parse(chrome_trace(r).dump());

    std::vector<json> mem, total;
    for (const auto & e : events_with_ph(trace, "C")) {
        if (e["name"] == "memory") mem.push_back(e);
        else if (e["name"] == "memory.total") total.push_back(e);
        else ADD_FAILURE() << "unexpected counter " << e.dump();
    }
    ASSERT_EQ(mem.size(), size_t(kOps));
    ASSERT_EQ(total.size(), size_t(kOps));

    // Categories with bytes somewhere: exactly these keys in every sample (workspace included,
    // though non-zero at one op only); master_weights, communication, runtime never appear.
    const std::set<std::string> expected_keys = {"parameters", "optimizer_states", "gradients", "activations",
                                                 "workspace"};
    for (int i = 0; i < kOps; ++i) {
        const auto & e = r.timeline.events[size_t(i)];
        const json & c = mem[size_t(i)];
        EXPECT_DOUBLE_EQ(c["ts"].get<double>(), e.begin_us);
        std::set<std::string> keys;
        for (const auto & [k, v] : c["args"].items()) {
            keys.insert(k);
            ASSERT_TRUE(v.is_number_integer()) << k;
        }
        EXPECT_EQ(keys, expected_keys) << "op " << i;
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            const std::string name(kCategoryNames[cat]);
            if (!expected_keys.count(name)) continue;
            EXPECT_EQ(c["args"][name].get<uint64_t>(), e.live.v[cat]) << name << " at op " << i;
        }
        EXPECT_DOUBLE_EQ(total[size_t(i)]["ts"].get<double>(), e.begin_us);
        EXPECT_EQ(total[size_t(i)]["args"]["total"].get<uint64_t>(), e.live.total());
    }
}

TEST(ChromeTrace, MetadataAndPeak) {
    const ReportData r = synthetic_report();
    const json trace = json::parse(chrome_trace(r).dump());

    std::map<std::string, std::string> meta;
    for (const auto & m : events_with_ph(trace, "M")) meta[m["name"]] = m["args"]["name"];
    EXPECT_EQ(meta["process_name"], "memfit step");
    EXPECT_EQ(meta["thread_name"], "ops");

    const auto inst = events_with_ph(trace, "i");
    ASSERT_EQ(inst.size(), 1u);
    const auto & peak = r.timeline.events[kPeakOp];
    EXPECT_EQ(inst[0]["s"], "g");
    EXPECT_EQ(inst[0]["name"], fmt::format("peak {}", format_bytes(peak.live.total())));
    EXPECT_DOUBLE_EQ(inst[0]["ts"].get<double>(), peak.begin_us);

    const json & other = trace["otherData"];
    EXPECT_EQ(other["config"], r.config);
    EXPECT_EQ(other["planned_peak"]["activations"].get<uint64_t>(), r.planned_peak[Category::activations]);
    EXPECT_EQ(other["measured_peak"]["runtime"].get<uint64_t>(), 42u);
    EXPECT_EQ(other["planned_peak"]["runtime"].get<uint64_t>(), 0u);
    EXPECT_EQ(other["measured_peak"]["total"].get<uint64_t>(), r.measured_peak.total());
}

TEST(ChromeTrace, PeakFallsBackToLargestTotal) {
    ReportData r = synthetic_report();
    r.peak_op = -1;
    const json trace = chrome_trace(r);
    const auto inst = events_with_ph(trace, "i");
    ASSERT_EQ(inst.size(), 1u);
    EXPECT_DOUBLE_EQ(inst[0]["ts"].get<double>(), r.timeline.events[kPeakOp].begin_us);
}

TEST(ChromeTrace, EmptyTimelineIsStillValid) {
    ReportData r;
    const json trace = json::parse(chrome_trace(r).dump());
    ASSERT_TRUE(trace["traceEvents"].is_array());
    EXPECT_EQ(trace["traceEvents"].size(), 2u);   // the two metadata events
    EXPECT_TRUE(events_with_ph(trace, "i").empty());
    EXPECT_TRUE(trace["otherData"]["config"].is_object());
}

TEST(ChromeTrace, WritesFileAtomically) {
    const ReportData r = synthetic_report();
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("memfit_trace_{}", ::getpid());
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "trace.json").string();
    {
        std::ofstream old(path);
        old << "old contents";
    }
    write_chrome_trace(path, r);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    const json back = json::parse(ss.str());
    EXPECT_EQ(back, json::parse(chrome_trace(r).dump()));
    EXPECT_EQ(events_with_ph(back, "X").size(), size_t(kOps));
    std::filesystem::remove_all(dir);
}

TEST(ChromeTrace, WriteFailureThrowsIoError) {
    const ReportData r = synthetic_report();
    EXPECT_THROW(write_chrome_trace("/nonexistent-memfit-dir/sub/trace.json", r), IoError);
}


// ---------------------------------------------------------------------------------------------
// Multi-process runs and failed steps.

constexpr int kRank1Ops = 12;

// Two ranks: rank 0's timeline is the synthetic one, rank 1's its first 12 ops with more
// activations, its origin `rank1_offset_s` after rank 0's.
ReportData two_rank_report(double rank1_offset_s) {
    ReportData r = synthetic_report();
    r.timeline.origin_s = 5000.0;
    for (int k = 0; k < 2; ++k) {
        RankView rv;
        rv.rank = k;
        rv.label = fmt::format("rank {}", k);
        rv.timeline = r.timeline;
        if (k == 1) {
            rv.timeline.events.resize(kRank1Ops);
            for (auto & e : rv.timeline.events) e.live[Category::activations] += 1 * MiB;
            rv.timeline.origin_s += rank1_offset_s;
        }
        rv.planned_peak = rv.measured_peak = rv.timeline.events.back().live;
        rv.peak_rss = uint64_t(k + 1) * GiB;
        r.ranks.push_back(rv);
    }
    return r;
}

std::vector<json> of_pid(const std::vector<json> & events, int pid) {
    std::vector<json> out;
    for (const auto & e : events)
        if (e["pid"] == pid) out.push_back(e);
    return out;
}

TEST(ChromeTrace, OneProcessPerRank) {
    const ReportData r = two_rank_report(0.25);
    const json trace = json::parse(chrome_trace(r).dump());

    std::map<int, std::string> process, thread;
    for (const auto & m : events_with_ph(trace, "M")) {
        auto & names = m["name"] == "process_name" ? process : thread;
        EXPECT_TRUE(names.emplace(m["pid"].get<int>(), m["args"]["name"]).second) << m.dump();
    }
    EXPECT_EQ(process, (std::map<int, std::string>{{1, "rank 0"}, {2, "rank 1"}}));
    EXPECT_EQ(thread, (std::map<int, std::string>{{1, "ops"}, {2, "ops"}}));
    std::set<int> pids;
    for (const auto & e : trace["traceEvents"]) pids.insert(e["pid"].get<int>());
    EXPECT_EQ(pids, (std::set<int>{1, 2}));

    const auto xs = events_with_ph(trace, "X"), cs = events_with_ph(trace, "C");
    const double shift[2] = {0.0, 250000.0};   // rank 1 started 0.25 s after rank 0
    for (int k = 0; k < 2; ++k) {
        const auto & ev = r.ranks[size_t(k)].timeline.events;
        const auto x = of_pid(xs, k + 1);
        ASSERT_EQ(x.size(), ev.size()) << "rank " << k;
        std::vector<json> mem, total;
        for (const auto & c : of_pid(cs, k + 1)) (c["name"] == "memory" ? mem : total).push_back(c);
        ASSERT_EQ(mem.size(), ev.size());
        ASSERT_EQ(total.size(), ev.size());
        for (size_t i = 0; i < ev.size(); ++i) {
            EXPECT_EQ(x[i]["args"]["op"], ev[i].op);
            EXPECT_NEAR(x[i]["ts"].get<double>(), ev[i].begin_us + shift[k], 1e-3) << "rank " << k << " op " << i;
            EXPECT_NEAR(mem[i]["ts"].get<double>(), ev[i].begin_us + shift[k], 1e-3);
            EXPECT_EQ(mem[i]["args"]["activations"].get<uint64_t>(), ev[i].live[Category::activations]);
            EXPECT_EQ(total[i]["name"], "memory.total");
            EXPECT_EQ(total[i]["args"]["total"].get<uint64_t>(), ev[i].live.total());
        }
    }
    // The peak stays on rank 0's process, at rank 0's time.
    const auto inst = events_with_ph(trace, "i");
    ASSERT_EQ(inst.size(), 1u);
    EXPECT_EQ(inst[0]["pid"], 1);
    EXPECT_DOUBLE_EQ(inst[0]["ts"].get<double>(), r.timeline.events[kPeakOp].begin_us);

    const json & ranks = trace["otherData"]["ranks"];
    ASSERT_EQ(ranks.size(), 2u);
    EXPECT_EQ(ranks[1]["pid"], 2);
    EXPECT_NEAR(ranks[1]["shift_us"].get<double>(), 250000.0, 1e-3);
    EXPECT_EQ(ranks[1]["peak_rss"].get<uint64_t>(), 2 * GiB);
}

TEST(ChromeTrace, RankClocksOfOtherHostsAreNotShifted) {
    for (double offset : {-0.5, 3600.0, -61.0}) {
        const ReportData r = two_rank_report(offset);
        const auto x = of_pid(events_with_ph(chrome_trace(r), "X"), 2);
        ASSERT_EQ(x.size(), size_t(kRank1Ops));
        const double shift = std::abs(offset) <= 60 ? offset * 1e6 : 0.0;
        for (size_t i = 0; i < x.size(); ++i)
            EXPECT_NEAR(x[i]["ts"].get<double>(), r.ranks[1].timeline.events[i].begin_us + shift, 1e-3) << offset;
    }
}

TEST(ChromeTrace, SingleProcessTraceIsUnchanged) {
    const ReportData r = synthetic_report();
    const json trace = chrome_trace(r);
    for (const auto & e : trace["traceEvents"]) EXPECT_EQ(e["pid"], 1) << e.dump();
    EXPECT_EQ(trace["traceEvents"].size(), size_t(2 + 3 * kOps + 1));
    EXPECT_FALSE(trace["otherData"].contains("ranks"));
    EXPECT_FALSE(trace["otherData"].contains("failure"));
    // One RankView is one process: the same trace as none.
    ReportData one = r;
    one.ranks.push_back({0, "rank 0", r.planned_peak, r.measured_peak, 1, r.timeline});
    one.ranks[0].timeline.origin_s = 99;
    EXPECT_EQ(chrome_trace(one), trace);
}

TEST(ChromeTrace, FailureAddsAnOutOfMemoryEvent) {
    constexpr int kFailed = 20;
    ReportData r = synthetic_report();
    r.timeline.events.resize(kFailed + 1);
    r.timeline.events.back().end_us = r.timeline.events.back().begin_us;
    r.timeline.failed_op = kFailed;
    r.peak_op = kFailed;
    r.failure = "allocation of h.3.attn.probs (1.50 MiB) failed";
    const json trace = json::parse(chrome_trace(r).dump());

    const auto & failed = r.timeline.events.back();
    std::vector<json> oom;
    for (const auto & e : events_with_ph(trace, "i"))
        if (e["name"].get<std::string>().starts_with("out of memory")) oom.push_back(e);
    ASSERT_EQ(oom.size(), 1u);
    EXPECT_EQ(oom[0]["name"], "out of memory: " + r.failure);
    EXPECT_EQ(oom[0]["s"], "g");
    EXPECT_DOUBLE_EQ(oom[0]["ts"].get<double>(), failed.begin_us);
    EXPECT_EQ(oom[0]["args"]["op"], kFailed);
    EXPECT_EQ(oom[0]["args"]["name"], failed.name);
    EXPECT_EQ(oom[0]["args"]["live"]["total"].get<uint64_t>(), failed.live.total());
    EXPECT_EQ(oom[0]["args"]["live"]["activations"].get<uint64_t>(), failed.live[Category::activations]);
    EXPECT_EQ(trace["otherData"]["failure"], r.failure);
    EXPECT_EQ(trace["otherData"]["failed_op"], kFailed);
    EXPECT_EQ(events_with_ph(trace, "X").size(), size_t(kFailed + 1));
}

}  // namespace
}  // namespace memfit
