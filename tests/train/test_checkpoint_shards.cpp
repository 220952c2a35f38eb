// Sharded checkpoints (data parallel): every rank's file written separately, meta.json and the
// rename by rank 0 only after all of them; read back whole or re-sharded to another number of
// ranks; a missing or corrupt shard file is an error naming the file. No MPI: the per-rank
// functions are called with explicit ranks, and the collective save with the single communicator.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "train/checkpoint.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_shard_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    return p;
}

constexpr size_t kTotal = 1003;   // not a multiple of 4 or 2

float param_at(size_t i) { return 0.5f * float(i) - 3.0f; }
float m_at(size_t i) { return -0.001f * float(i); }
float v_at(size_t i) { return 1e-6f * float(i * i); }

// Elements [lo, hi) of the reference state.
TrainState slice(size_t lo, size_t hi) {
    TrainState s;
    for (size_t i = lo; i < hi; ++i) {
        s.params.push_back(param_at(i));
        s.m.push_back(m_at(i));
        s.v.push_back(v_at(i));
    }
    s.offset = lo;
    s.total = kTotal;
    s.t = 12;
    s.scaler = {2048.0f, 3, 1};
    return s;
}

nlohmann::json meta(int step) { return {{"step", step}, {"seq", 32}}; }

// The ranges a 4-rank ZeRO run would have: equal padded shards of ceil(total/4), the last short.
std::vector<ShardRange> zero_ranges(size_t total, int world) {
    const size_t size = (total + size_t(world) - 1) / size_t(world);
    std::vector<ShardRange> r;
    for (int k = 0; k < world; ++k) {
        const size_t lo = std::min(total, size_t(k) * size), hi = std::min(total, lo + size);
        r.push_back({k, lo, hi - lo});
    }
    return r;
}

// Writes a world-rank checkpoint of `ranges` under root, each rank on its own.
std::string write_sharded(const fs::path & root, int step, const std::vector<ShardRange> & ranges, int zero = 1) {
    const int world = int(ranges.size());
    const std::string tmp = begin_checkpoint(root.string(), step);
    for (const ShardRange & r : ranges)
        write_state_shard(tmp, slice(r.offset, r.offset + r.count), r.rank, world);
    Checkpoint c{slice(0, 0), meta(step)};
    return commit_checkpoint(root.string(), tmp, c, ranges, world, zero, 3);
}

void expect_slice(const TrainState & s, size_t lo, size_t hi) {
    ASSERT_EQ(s.params.size(), hi - lo);
    ASSERT_EQ(s.m.size(), hi - lo);
    ASSERT_EQ(s.v.size(), hi - lo);
    EXPECT_EQ(s.offset, lo);
    EXPECT_EQ(s.total, kTotal);
    EXPECT_EQ(s.t, 12);
    EXPECT_EQ(s.scaler.scale, 2048.0f);
    EXPECT_EQ(s.scaler.clean, 3);
    EXPECT_EQ(s.scaler.skipped, 1);
    for (size_t i = lo; i < hi; ++i) {
        ASSERT_EQ(s.params[i - lo], param_at(i)) << i;
        ASSERT_EQ(s.m[i - lo], m_at(i)) << i;
        ASSERT_EQ(s.v[i - lo], v_at(i)) << i;
    }
}

}  // namespace

TEST(CheckpointShards, EvenShardsTileTheState) {
    for (int world : {1, 2, 3, 4, 7}) {
        size_t next = 0;
        for (int r = 0; r < world; ++r) {
            const ShardRange s = even_shard(kTotal, r, world);
            EXPECT_EQ(s.rank, r);
            EXPECT_EQ(s.offset, next);
            next += s.count;
        }
        EXPECT_EQ(next, kTotal);
    }
    EXPECT_EQ(state_shard_file(3, 16), "state-rank-00003-of-00016.safetensors");
}

TEST(CheckpointShards, FourRanksReadBackAsTwoAndOne) {
    const fs::path root = fresh_dir("reshard");
    const std::string dir = write_sharded(root, 5, zero_ranges(kTotal, 4));
    EXPECT_EQ(fs::path(dir).filename(), "step-000005");
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(fs::path(dir) / state_shard_file(r, 4))) << r;
    EXPECT_FALSE(fs::exists(root / ".step-000005.tmp"));

    const nlohmann::json m = load_checkpoint_meta(find_checkpoint(root.string()));
    EXPECT_EQ(m["world_size"], 4);
    EXPECT_EQ(m["zero"], 1);
    EXPECT_EQ(m["total"], kTotal);
    ASSERT_EQ(m["shards"].size(), 4u);
    EXPECT_EQ(m["shards"][1]["offset"], 251);
    EXPECT_EQ(m["seq"], 32);
    EXPECT_EQ(checkpoint_total(dir, m), kTotal);

    // The same 4 ranges, 2 ZeRO ranks' ranges (spanning shard boundaries), 3 uneven ones, one whole.
    for (const auto & ranges : {zero_ranges(kTotal, 4), zero_ranges(kTotal, 2), zero_ranges(kTotal, 3),
                                std::vector<ShardRange>{{0, 0, kTotal}}})
        for (const ShardRange & r : ranges) expect_slice(load_state_range(dir, m, r.offset, r.offset + r.count),
                                                         r.offset, r.offset + r.count);
    expect_slice(load_state_range(dir, m, 100, 100), 100, 100);   // empty

    // load_checkpoint consolidates (what `memfit export` reads).
    const Checkpoint c = load_checkpoint(root.string());
    expect_slice(c.state, 0, kTotal);
    EXPECT_EQ(c.meta["step"], 5);

    // A range beyond the state is an error, not a read past the end.
    EXPECT_THROW(load_state_range(dir, m, 10, kTotal + 1), FormatError);
}

TEST(CheckpointShards, ResaveWithOtherWorldSizes) {
    // 4 ranks -> read on 2 -> saved by 2 -> read on 1 -> saved as one file -> read on 4.
    const fs::path root = fresh_dir("chain");
    std::string dir = write_sharded(root, 1, zero_ranges(kTotal, 4));
    nlohmann::json m = load_checkpoint_meta(dir);
    std::vector<ShardRange> two = zero_ranges(kTotal, 2);
    {
        const std::string tmp = begin_checkpoint(root.string(), 2);
        for (const ShardRange & r : two)
            write_state_shard(tmp, load_state_range(dir, m, r.offset, r.offset + r.count), r.rank, 2);
        dir = commit_checkpoint(root.string(), tmp, Checkpoint{slice(0, 0), meta(2)}, two, 2, 2, 3);
    }
    m = load_checkpoint_meta(dir);
    EXPECT_EQ(m["world_size"], 2);
    Checkpoint whole{load_state_range(dir, m, 0, kTotal), meta(3)};
    expect_slice(whole.state, 0, kTotal);
    dir = save_checkpoint(root.string(), whole, 3);   // the one-process layout
    EXPECT_TRUE(fs::exists(fs::path(dir) / "state.safetensors"));
    m = load_checkpoint_meta(dir);
    EXPECT_FALSE(m.contains("shards"));
    EXPECT_EQ(checkpoint_total(dir, m), kTotal);
    for (const ShardRange & r : zero_ranges(kTotal, 4))
        expect_slice(load_state_range(dir, m, r.offset, r.offset + r.count), r.offset, r.offset + r.count);
    // The newest of the three.
    EXPECT_EQ(find_checkpoint(root.string()), dir);
}

TEST(CheckpointShards, CollectiveSaveOnOneProcess) {
    const fs::path root = fresh_dir("single");
    auto comm = make_single_communicator();
    const std::string dir = save_checkpoint_sharded(root.string(), Checkpoint{slice(0, kTotal), meta(7)}, 2, 0, *comm);
    EXPECT_TRUE(fs::exists(fs::path(dir) / state_shard_file(0, 1)));
    const Checkpoint c = load_checkpoint(dir);
    expect_slice(c.state, 0, kTotal);
    EXPECT_EQ(c.meta["world_size"], 1);
    EXPECT_EQ(c.meta["zero"], 0);
}

TEST(CheckpointShards, UnfinishedSaveLeavesThePreviousOne) {
    // Ranks 0..2 wrote, rank 3 died before writing: nothing is committed, and rank 0 would refuse
    // to commit a folder missing a rank's file.
    const fs::path root = fresh_dir("unfinished");
    write_sharded(root, 1, zero_ranges(kTotal, 4));
    const auto ranges = zero_ranges(kTotal, 4);
    const std::string tmp = begin_checkpoint(root.string(), 2);
    for (int r = 0; r < 3; ++r)
        write_state_shard(tmp, slice(ranges[size_t(r)].offset, ranges[size_t(r)].offset + ranges[size_t(r)].count), r, 4);
    EXPECT_EQ(load_checkpoint(root.string()).meta["step"], 1);
    try {
        commit_checkpoint(root.string(), tmp, Checkpoint{slice(0, 0), meta(2)}, ranges, 4, 1, 3);
        ADD_FAILURE();
    } catch (const IoError & e) {
        EXPECT_NE(std::string(e.what()).find("rank 3 wrote no state-rank-00003-of-00004.safetensors"),
                  std::string::npos) << e.what();
    }
    EXPECT_EQ(find_checkpoint(root.string()), (root / "step-000001").string());
    // Ranges that leave a gap are refused too.
    auto gap = ranges;
    gap[2].offset += 1;
    EXPECT_THROW(commit_checkpoint(root.string(), tmp, Checkpoint{slice(0, 0), meta(2)}, gap, 4, 1, 3), Error);
}

TEST(CheckpointShards, MissingOrCorruptShardNamesTheFile) {
    const fs::path root = fresh_dir("broken");
    const std::string dir = write_sharded(root, 4, zero_ranges(kTotal, 4));
    const nlohmann::json m = load_checkpoint_meta(dir);
    const fs::path f2 = fs::path(dir) / state_shard_file(2, 4), f3 = fs::path(dir) / state_shard_file(3, 4);

    // Missing: only ranges that touch the file fail.
    fs::rename(f2, root / "aside");
    try {
        load_checkpoint(dir);
        ADD_FAILURE();
    } catch (const IoError & e) {
        EXPECT_NE(std::string(e.what()).find(f2.string()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
    }
    expect_slice(load_state_range(dir, m, 0, 502), 0, 502);   // ranks 0 and 1's files only
    fs::rename(root / "aside", f2);

    // Truncated.
    fs::resize_file(f3, 64);
    try {
        load_state_range(dir, m, 900, kTotal);
        ADD_FAILURE();
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find(f3.string()), std::string::npos) << e.what();
    }

    // A shard of another checkpoint (another range) in its place.
    fs::copy_file(fs::path(dir) / state_shard_file(1, 4), f3, fs::copy_options::overwrite_existing);
    try {
        load_state_range(dir, m, 900, kTotal);
        ADD_FAILURE();
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find(f3.string()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("meta.json says offset"), std::string::npos) << e.what();
    }

    // A shard table that does not tile the state.
    nlohmann::json bad = m;
    bad["shards"][1]["count"] = 10;
    EXPECT_THROW(load_state_range(dir, bad, 0, 10), FormatError);
    bad = m;
    bad["shards"][0]["file"] = "../../etc/passwd";
    EXPECT_THROW(load_state_range(dir, bad, 0, 10), FormatError);
}
