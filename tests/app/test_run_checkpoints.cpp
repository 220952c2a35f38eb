// A run's checkpoint preflight: the free-space check refuses a folder without room for one
// checkpoint and warns without room for keep + 1; the cost probe measures a folder it can write
// and reports (instead of throwing) one it cannot.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "app/run_checkpoints.h"
#include "core/error.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

fs::path fresh(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_run_ckpt_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
}

TEST(RunCheckpoints, FreeSpaceIsCheckedBeforeTheFirstStep) {
    const fs::path dir = fresh("space");
    const uint64_t free = fs::space(dir).available;
    std::string warned;
    auto warn = [&](const std::string & w) { warned = w; };
    try {
        check_free_space(dir.string(), free + (uint64_t(1) << 40), 3, warn);
        ADD_FAILURE() << "a checkpoint larger than the free space was accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("free, a checkpoint needs"), std::string::npos) << e.what();
    }
    check_free_space(dir.string(), free / 3, 3, warn);   // one fits, four do not
    EXPECT_NE(warned.find("--keep-checkpoints 3 needs room for 4 checkpoints"), std::string::npos) << warned;
    warned.clear();
    check_free_space(dir.string(), 4096, 3, warn);
    EXPECT_TRUE(warned.empty()) << warned;
}

TEST(RunCheckpoints, CostProbeMeasuresOrSaysWhyNot) {
    const fs::path dir = fresh("probe");
    const CheckpointCost c = predict_checkpoint_cost(dir.string(), 3 << 20);
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_GT(c.write_bytes_per_s, 0);
    EXPECT_GT(c.digest_bytes_per_s, 0);
    EXPECT_NEAR(c.seconds, double(3 << 20) / c.write_bytes_per_s + double(3 << 20) / c.digest_bytes_per_s, 1e-9);
    EXPECT_FALSE(fs::exists(dir / ".memfit.probe"));
    const CheckpointCost bad = predict_checkpoint_cost((dir / "no" / "such").string(), 1 << 20);
    EXPECT_NE(bad.error.find("cannot create"), std::string::npos) << bad.error;
}

}  // namespace
}  // namespace memfit
