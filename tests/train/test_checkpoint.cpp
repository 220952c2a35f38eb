// Checkpoints: a round trip, keeping the newest K, a process killed mid-write leaving the previous
// checkpoint intact, clear errors for bad folders, and `--resume` continuing bit for bit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/checkpoint.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_ckpt_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    return p;
}

Checkpoint make(int step, size_t P = 37) {
    Checkpoint c;
    for (size_t i = 0; i < P; ++i) {
        c.state.params.push_back(float(step) + 0.25f * float(i));
        c.state.m.push_back(-float(i));
        c.state.v.push_back(float(i * i));
    }
    c.state.t = step;
    c.state.scaler = {1024.0f, 7, 2};
    c.meta = {{"step", step}, {"data", {{"train_epoch", 1}, {"train_cursor", 5}}}};
    return c;
}

}  // namespace

TEST(Checkpoint, RoundTripKeepsTheNewest) {
    const fs::path root = fresh_dir("rt");
    for (int s = 1; s <= 4; ++s) save_checkpoint(root.string(), make(s), 2);
    EXPECT_FALSE(fs::exists(root / "step-000001"));
    EXPECT_FALSE(fs::exists(root / "step-000002"));
    EXPECT_TRUE(fs::exists(root / "step-000003"));
    const Checkpoint c = load_checkpoint(root.string());   // the newest
    const Checkpoint want = make(4);
    EXPECT_EQ(c.meta["step"], 4);
    EXPECT_EQ(c.meta["data"]["train_cursor"], 5);
    EXPECT_EQ(c.state.params, want.state.params);
    EXPECT_EQ(c.state.m, want.state.m);
    EXPECT_EQ(c.state.v, want.state.v);
    EXPECT_EQ(c.state.t, 4);
    EXPECT_EQ(c.state.scaler.scale, 1024.0f);
    EXPECT_EQ(c.state.scaler.clean, 7);
    EXPECT_EQ(c.state.scaler.skipped, 2);
    EXPECT_EQ(load_checkpoint((root / "step-000003").string()).meta["step"], 3);
}

TEST(Checkpoint, KilledMidWriteLeavesThePreviousIntact) {
    const fs::path root = fresh_dir("kill");
    save_checkpoint(root.string(), make(1), 3);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {   // the child dies with SIGKILL after the first file of step 2
        save_checkpoint(root.string(), make(2), 3, [] { ::raise(SIGKILL); });
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    EXPECT_TRUE(fs::exists(root / ".step-000002.tmp"));   // the torn write, never renamed
    EXPECT_FALSE(fs::exists(root / "step-000002"));
    const Checkpoint c = load_checkpoint(root.string());
    EXPECT_EQ(c.meta["step"], 1);
    EXPECT_EQ(c.state.params, make(1).state.params);
    save_checkpoint(root.string(), make(2), 3);           // the next save replaces the leftover
    EXPECT_FALSE(fs::exists(root / ".step-000002.tmp"));
    EXPECT_EQ(load_checkpoint(root.string()).meta["step"], 2);
}

TEST(Checkpoint, BadFoldersGiveClearErrors) {
    const fs::path root = fresh_dir("bad");
    EXPECT_THROW(load_checkpoint((root / "nope").string()), IoError);
    fs::create_directories(root);
    try {
        load_checkpoint(root.string());
        ADD_FAILURE();
    } catch (const IoError & e) {
        EXPECT_NE(std::string(e.what()).find("no complete checkpoint"), std::string::npos) << e.what();
    }
    const std::string dir = save_checkpoint(root.string(), make(3), 3);
    std::ofstream(fs::path(dir) / "meta.json") << "{ not json";
    EXPECT_THROW(load_checkpoint(dir), FormatError);
    std::ofstream(fs::path(dir) / "meta.json") << R"({"format": "something-else", "step": 3})";
    EXPECT_THROW(load_checkpoint(dir), FormatError);
    const std::string dir2 = save_checkpoint(root.string(), make(4), 3);
    fs::resize_file(fs::path(dir2) / "state.safetensors", 40);   // truncated
    EXPECT_THROW(load_checkpoint(dir2), FormatError);
    // A number out of range is refused before it is converted (a float-to-int overflow is UB).
    const std::string dir3 = save_checkpoint(root.string(), make(5), 3);
    nlohmann::json meta = nlohmann::json::parse(std::ifstream(fs::path(dir3) / "meta.json"));
    for (const auto & [key, value] : {std::pair{"world_size", 0}, std::pair{"zero", 9}}) {
        nlohmann::json odd = meta;   // the layout it records, sharded or not, in range
        odd[key] = value;
        odd["meta_digest"] = meta_digest(odd);
        std::ofstream(fs::path(dir3) / "meta.json") << odd.dump();
        EXPECT_THROW(load_checkpoint_meta(dir3), FormatError) << key;
    }
    meta["optimizer_step"] = 3.2e52;
    meta["meta_digest"] = meta_digest(meta);   // rewritten whole, a digest of its own: still checked
    std::ofstream(fs::path(dir3) / "meta.json") << meta.dump();
    try {
        load_checkpoint(dir3);
        ADD_FAILURE();
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find("\"optimizer_step\" = 3.2e+52 is not a number in range"), std::string::npos)
            << e.what();
    }
}

// A state that a diverged run wrote (its digests vouch for it) or an older checkpoint without
// digests: a NaN or inf parameter or moment, or a negative second moment, is refused on load
// (AdamW would have made NaN weights of it at the first update).
TEST(Checkpoint, NonFiniteStateIsRefusedOnLoad) {
    const fs::path root = fresh_dir("nonfinite");
    struct Case {
        const char * part;
        float value;
        std::string needle;
    };
    const std::string pw = "the parameters hold 1 implausible (non-finite or above 1e+08) value (the first, element 9, ";
    const std::string mw = "the first moments hold 1 implausible (non-finite or above 1e+10) value (the first, element 9";
    const std::string vw = "the second moments hold 1 implausible (non-finite, negative or above 1e+20) value (the first, "
                          "element 9, is ";
    const std::vector<Case> cases = {{"params", NAN, pw + "is nan)"}, {"m", INFINITY, mw}, {"v", -1.0f, vw + "-1)"},
                                     // Finite but implausible: a flipped exponent bit.
                                     {"params", -3e9f, pw + "is -3000000000)"}, {"m", 2e12f, mw}, {"v", 1e30f, vw + "1e+30)"}};
    for (const Case & c : cases) {
        fs::remove_all(root);
        Checkpoint ck = make(3);
        std::vector<float> & v = std::string(c.part) == "params" ? ck.state.params
                                 : std::string(c.part) == "m"    ? ck.state.m
                                                                 : ck.state.v;
        v[9] = c.value;
        const std::string dir = save_checkpoint(root.string(), ck, 3);
        try {
            load_checkpoint(dir);
            ADD_FAILURE() << c.part;
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
        }
        // A range that leaves the bad element out loads (a ZeRO shard is only its own elements).
        EXPECT_EQ(load_state_range(dir, load_checkpoint_meta(dir), 10, 37).params.size(), 27u);
    }
}

// A checkpoint that records digests records every file's: a damaged "checksums" is refused, not
// skipped; meta.json is covered by its own digest; one without digests (an older memfit's, or
// "checksums" deleted) loads only with --allow-unverified.
TEST(Checkpoint, DamagedChecksumRecordIsRefused) {
    const fs::path root = fresh_dir("checksums");
    const std::string dir = save_checkpoint(root.string(), make(3), 3);
    const fs::path meta_path = fs::path(dir) / "meta.json";
    const nlohmann::json good = nlohmann::json::parse(std::ifstream(meta_path));
    for (const nlohmann::json & bad : {nlohmann::json("x"), nlohmann::json::object(), nlohmann::json(-1),
                                       nlohmann::json{{"state.safetensors", 7}}}) {
        nlohmann::json m = good;
        m["checksums"] = bad;
        std::ofstream(meta_path) << m.dump();
        try {
            load_checkpoint(dir);
            ADD_FAILURE() << bad.dump();
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find("meta.json changed after the checkpoint was written"), std::string::npos)
                << e.what();
        }
        m["meta_digest"] = meta_digest(m);
        std::ofstream(meta_path) << m.dump();
        try {
            load_checkpoint(dir);
            ADD_FAILURE() << bad.dump();
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find("\"checksums\" records no digest string"), std::string::npos)
                << e.what();
        }
    }
    nlohmann::json old = good;
    old.erase("checksums");
    old.erase("meta_digest");
    std::ofstream(meta_path) << old.dump();
    try {
        load_checkpoint(dir);
        ADD_FAILURE() << "a checkpoint without digests loaded";
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find("pass --allow-unverified"), std::string::npos) << e.what();
    }
    set_unverified_checkpoints_allowed(true);
    EXPECT_EQ(load_checkpoint(dir).state.params.size(), 37u);
    set_unverified_checkpoints_allowed(false);
}
