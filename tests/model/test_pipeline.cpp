// Pipeline stages and schedules (model/pipeline.h): balanced contiguous stages, stage layouts that
// cover the model once (a tied table twice), and schedules that run every forward and backward
// once, in dependency order, without any stage waiting forever when sends go out at once and
// receives block (the interleaved schedule's transport; a simulation of all stages together).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/pipeline.h"
#include "test_util.h"

using namespace memfit;

namespace {

// Runs every stage's action list; a forward of virtual stage v needs v - 1's forward of the same
// micro-batch, a backward needs v + 1's backward and its own forward. Returns false on a stall.
bool simulate(PipeSchedule kind, int P, int m, int V, std::string & why) {
    std::vector<std::vector<PipeAction>> orders;
    for (int s = 0; s < P; ++s) orders.push_back(pipeline_schedule(kind, P, s, m, V));
    std::set<std::tuple<bool, int, int>> done;   // (fwd, mb, virtual stage)
    std::vector<size_t> next(size_t(P), 0);
    const int last = P * V - 1;
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < P; ++s) {
            if (next[size_t(s)] >= orders[size_t(s)].size()) continue;
            const PipeAction a = orders[size_t(s)][next[size_t(s)]];
            const int v = a.chunk * P + s;
            const bool ready = a.fwd ? (v == 0 || done.count({true, a.mb, v - 1}))
                                     : done.count({true, a.mb, v}) && (v == last || done.count({false, a.mb, v + 1}));
            if (!ready) continue;
            if (!done.insert({a.fwd, a.mb, v}).second) {
                why = "an action ran twice";
                return false;
            }
            ++next[size_t(s)];
            progress = true;
        }
    }
    for (int s = 0; s < P; ++s)
        if (next[size_t(s)] < orders[size_t(s)].size()) {
            why = "stage " + std::to_string(s) + " stalls at action " + std::to_string(next[size_t(s)]);
            return false;
        }
    if (done.size() != size_t(2 * m * P * V)) {
        why = "not every forward and backward ran";
        return false;
    }
    return true;
}

}  // namespace

TEST(PipelineSchedule, EveryScheduleRunsEachMicroBatchOnceWithoutStalling) {
    for (int P : {2, 3, 4})
        for (int m : {1, 2, 4, 8}) {
            std::string why;
            EXPECT_TRUE(simulate(PipeSchedule::gpipe, P, m, 1, why)) << "gpipe P " << P << " m " << m << ": " << why;
            EXPECT_TRUE(simulate(PipeSchedule::one_f_one_b, P, m, 1, why)) << "1f1b P " << P << " m " << m << ": " << why;
            for (int V : {2, 3}) {
                if (m % P) continue;
                EXPECT_TRUE(simulate(PipeSchedule::interleaved, P, m, V, why))
                    << "interleaved:" << V << " P " << P << " m " << m << ": " << why;
            }
        }
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostPMinusSMicroBatchesInFlight) {
    const int P = 4, m = 8;
    for (int s = 0; s < P; ++s) {
        int live = 0, most = 0;
        for (const PipeAction & a : pipeline_schedule(PipeSchedule::one_f_one_b, P, s, m)) {
            live += a.fwd ? 1 : -1;
            most = std::max(most, live);
        }
        EXPECT_EQ(most, P - s) << "stage " << s;
        int gp = 0, gmost = 0;
        for (const PipeAction & a : pipeline_schedule(PipeSchedule::gpipe, P, s, m)) {
            gp += a.fwd ? 1 : -1;
            gmost = std::max(gmost, gp);
        }
        EXPECT_EQ(gmost, m) << "gpipe holds every micro-batch";
    }
}

TEST(PipelineStages, BalancedContiguousAndTheLayoutsCoverTheModel) {
    for (bool llama : {false, true}) {
        const ModelConfig cfg = test::small_family(llama, 37, 32, 6, 4, 48);
        for (int P : {1, 2, 3, 6}) {
            const auto st = pipeline_stages(cfg, P, 16);
            ASSERT_EQ(st.size(), size_t(P));
            EXPECT_EQ(st.front().begin, 0);
            EXPECT_EQ(st.back().end, cfg.n_layer);
            std::map<std::string, int> seen;
            for (int s = 0; s < P; ++s) {
                EXPECT_LT(st[size_t(s)].begin, st[size_t(s)].end);
                if (s > 0) {
                    EXPECT_EQ(st[size_t(s)].begin, st[size_t(s) - 1].end);
                }
                for (const auto & p : stage_layout(cfg, st[size_t(s)], s == 0, s == P - 1).params) ++seen[p.name];
            }
            for (const auto & p : make_param_layout(cfg).params) {
                const bool twice = P > 1 && cfg.tied_head && p.name == "wte.weight";
                EXPECT_EQ(seen[p.name], twice ? 2 : 1) << p.name << " P " << P;
            }
        }
    }
    // The head's cost goes to the last stage: with a large vocabulary it takes fewer blocks.
    ModelConfig big = test::small_family(false, 4096, 32, 8, 4, 48);
    const auto st = pipeline_stages(big, 2, 16);
    EXPECT_LT(st[1].end - st[1].begin, st[0].end - st[0].begin);
    EXPECT_THROW(pipeline_stages(big, 9, 16), ConfigError);
}

TEST(PipelineStages, ScheduleNames) {
    int V = 0;
    EXPECT_EQ(parse_schedule("gpipe", &V), PipeSchedule::gpipe);
    EXPECT_EQ(V, 1);
    EXPECT_EQ(parse_schedule("interleaved:3", &V), PipeSchedule::interleaved);
    EXPECT_EQ(V, 3);
    for (const char * bad : {"foo", "interleaved", "interleaved:1", "interleaved:x", "interleaved:99999"})
        EXPECT_THROW(parse_schedule(bad, &V), ConfigError) << bad;
}

// NCCL matches a pair of ranks' messages in the order they were sent, whatever their tags: in the
// interleaved schedule each stage receives every neighbour's messages in the order that
// neighbour sends them (activations and gradients alike, two stages being each other's
// neighbour both ways), so its receives need no reordering on GPUs.
TEST(PipelineSchedule, InterleavedNeighboursAgreeOnMessageOrder) {
    for (int P : {2, 3, 4, 8})
        for (int V : {2, 3, 4})
            for (int m : {P, 2 * P, 3 * P, 8 * P}) {
                SCOPED_TRACE("P " + std::to_string(P) + " V " + std::to_string(V) + " m " + std::to_string(m));
                std::vector<std::vector<PipeMessage>> msgs;
                for (int s = 0; s < P; ++s) msgs.push_back(interleaved_messages(P, s, m, V));
                size_t pairs = 0;
                for (int s = 0; s < P; ++s)
                    for (int q : {(s + 1) % P, (s + P - 1) % P}) {
                        std::vector<int> sent, got;
                        for (const PipeMessage & x : msgs[size_t(q)])
                            if (x.send && x.peer == s) sent.push_back(x.tag);
                        for (const PipeMessage & x : msgs[size_t(s)])
                            if (!x.send && x.peer == q) got.push_back(x.tag);
                        EXPECT_FALSE(got.empty());
                        EXPECT_EQ(sent, got) << "stage " << q << " to stage " << s;
                        ++pairs;
                    }
                EXPECT_EQ(pairs, size_t(2 * P));
            }
}

// The interleaved schedule's messages as the engine posts them, sends completed where
// interleaved_send_waits says: simulated over every stage at once (a receive blocks until its
// message was sent; a send's wait blocks until the peer has received it), nothing stalls, every
// message is received once, and the sends in flight on a stage (each a boundary activation or
// gradient held by the transport) stay bounded as the micro-batches grow: Megatron's in-flight
// bound, where waiting at the step's end held every send of the step (up to 2 V m).
TEST(PipelineSchedule, InterleavedSendsCompleteEarlyWithoutStalling) {
    for (int P : {2, 3, 4})
        for (int V : {2, 3}) {
            std::vector<int> pending_by_m;
            for (int m : {P, 2 * P, 4 * P, 8 * P}) {
                SCOPED_TRACE("P " + std::to_string(P) + " V " + std::to_string(V) + " m " + std::to_string(m));
                std::vector<std::vector<PipeMessage>> msgs;
                std::vector<std::vector<int>> waits;
                for (int s = 0; s < P; ++s) {
                    msgs.push_back(interleaved_messages(P, s, m, V));
                    waits.push_back(interleaved_send_waits(P, s, m, V));
                }
                std::set<int> posted, received;   // tags
                std::vector<size_t> next(size_t(P), 0);
                // Per stage, the position in its messages and whether the waits after the current
                // receive are still to be done.
                std::vector<bool> waiting(size_t(P), false);
                for (bool progress = true; progress;) {
                    progress = false;
                    for (int s = 0; s < P; ++s) {
                        auto & mine = msgs[size_t(s)];
                        size_t & i = next[size_t(s)];
                        if (i >= mine.size()) continue;
                        if (waiting[size_t(s)]) {   // the sends this receive completes: peers have them
                            bool all = true;
                            for (size_t k = 0; k < mine.size(); ++k)
                                if (waits[size_t(s)][k] == int(i) && !received.count(mine[k].tag)) all = false;
                            if (!all) continue;
                            waiting[size_t(s)] = false;
                            ++i;
                            progress = true;
                            continue;
                        }
                        const PipeMessage & x = mine[i];
                        if (x.send) {
                            posted.insert(x.tag);
                            ++i;
                        } else {
                            if (!posted.count(x.tag)) continue;
                            EXPECT_TRUE(received.insert(x.tag).second);
                            waiting[size_t(s)] = true;
                        }
                        progress = true;
                    }
                }
                for (int s = 0; s < P; ++s) EXPECT_EQ(next[size_t(s)], msgs[size_t(s)].size()) << "stage " << s;
                EXPECT_EQ(posted, received);
                int most = 0;
                for (int s = 0; s < P; ++s) most = std::max(most, interleaved_pending_sends(P, s, m, V));
                pending_by_m.push_back(most);
                EXPECT_LT(most, 2 * V * m - 1);
            }
            // Bounded: no more at 8P micro-batches than at 2P.
            EXPECT_EQ(pending_by_m[1], pending_by_m[3]) << "P " << P << " V " << V;
        }
}
