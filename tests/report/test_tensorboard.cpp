// TensorBoard event files: the writer's CRC-32C, and what it writes as read back by the
// independent reader in tfevents_reader.h (bitwise CRC, its own protobuf decoding).
#include "report/tensorboard.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "report/tfevents_reader.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::read_tfevents;
using test::TfEvent;
using test::tfevents_files;

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// A fresh folder per test, removed afterwards.
class TensorBoard : public testing::Test {
protected:
    void SetUp() override {
        std::string tmpl = testing::TempDir() + "memfit_tb_XXXXXX";
        ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    std::string bytes_of(const std::string & path) const {
        std::ifstream in(path, std::ios::binary);
        return {std::istreambuf_iterator<char>(in), {}};
    }
    void overwrite(const std::string & path, const std::string & bytes) const {
        std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    }
    // Byte offset of each record's frame in a TFRecord file.
    static std::vector<size_t> record_offsets(const std::string & b) {
        std::vector<size_t> at;
        for (size_t o = 0; o + 8 <= b.size();) {
            at.push_back(o);
            uint64_t len = 0;
            for (int i = 0; i < 8; ++i) len |= uint64_t(uint8_t(b[o + size_t(i)])) << (8 * i);
            o += 16 + size_t(len);
        }
        return at;
    }

    // Three steps of four scalars each; step s has loss 3 - s, tokens 3.2e9 * s, and a NaN.
    std::string write_three_steps() {
        TensorBoardWriter w(dir_ + "/rank0");
        for (int s = 1; s <= 3; ++s) {
            const bool ok = w.write(10 * s, {{"train/loss", 3.0 - s},
                                              {"train/lr", 1e-3 * s},
                                              {"memory/peak_bytes", 3.2e9 * s},
                                              {"train/grad_norm", std::numeric_limits<double>::quiet_NaN()}});
            EXPECT_TRUE(ok) << w.error();
            EXPECT_EQ(w.error(), "");
        }
        return w.path();
    }

    std::string dir_;
};

TEST_F(TensorBoard, Crc32cCheckValue) {
    EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
    EXPECT_EQ(crc32c("", 0), 0u);
    const uint32_t c = 0xE3069283u;
    EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
    EXPECT_EQ(test::bitwise_crc32c("123456789", 9), 0xE3069283u);
}

TEST_F(TensorBoard, ReaderBitwiseCrcAgreesWithWriterTable) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> byte(0, 255), len(0, 3000);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<uint8_t> buf(size_t(len(rng)));
        for (uint8_t & b : buf) b = uint8_t(byte(rng));
        ASSERT_EQ(crc32c(buf.data(), buf.size()), test::bitwise_crc32c(buf.data(), buf.size())) << buf.size();
        ASSERT_EQ(masked_crc32c(buf.data(), buf.size()), test::bitwise_masked_crc32c(buf.data(), buf.size()));
    }
}

TEST_F(TensorBoard, WritesFileVersionThenOneEventPerStep) {
    const std::string path = write_three_steps();
    const std::string name = fs::path(path).filename().string();
    EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
    EXPECT_EQ(name.substr(name.size() - 7), ".memfit") << name;
    ASSERT_EQ(tfevents_files(dir_ + "/rank0"), std::vector<std::string>{path});

    std::string err = "unset";
    const std::vector<TfEvent> ev = read_tfevents(path, &err);
    EXPECT_EQ(err, "");
    ASSERT_EQ(ev.size(), 4u);
    EXPECT_EQ(ev[0].file_version, "brain.Event:2");
    EXPECT_TRUE(ev[0].values.empty());
    const double now = now_s();
    for (size_t i = 0; i < ev.size(); ++i) {
        EXPECT_NEAR(ev[i].wall_time, now, 60.0) << i;
        if (i > 0) {
            EXPECT_GE(ev[i].wall_time, ev[i - 1].wall_time);
        }
    }
    for (int s = 1; s <= 3; ++s) {
        const TfEvent & e = ev[size_t(s)];
        EXPECT_EQ(e.step, 10 * s);
        EXPECT_EQ(e.file_version, "");
        ASSERT_EQ(e.values.size(), 4u);
        EXPECT_EQ(e.values[0].first, "train/loss");
        EXPECT_EQ(e.values[0].second, float(3.0 - s));
        EXPECT_EQ(e.values[1].first, "train/lr");
        EXPECT_EQ(e.values[1].second, float(1e-3 * s));
        EXPECT_EQ(e.values[2].first, "memory/peak_bytes");
        EXPECT_EQ(e.values[2].second, float(3.2e9 * s));
        EXPECT_NEAR(double(e.values[2].second), 3.2e9 * s, 3.2e9 * s * 1e-7);
        EXPECT_EQ(e.values[3].first, "train/grad_norm");
        EXPECT_TRUE(std::isnan(e.values[3].second));
    }
}

TEST_F(TensorBoard, FlippedDataByteIsACrcMismatchAtThatRecord) {
    const std::string path = write_three_steps();
    std::string b = bytes_of(path);
    const std::vector<size_t> at = record_offsets(b);
    ASSERT_EQ(at.size(), 4u);
    b[at[2] + 12 + 5] = char(b[at[2] + 12 + 5] ^ 0x01);   // a byte of record 2's data
    overwrite(path, b);
    std::string err;
    const std::vector<TfEvent> ev = read_tfevents(path, &err);
    EXPECT_NE(err.find("record 2"), std::string::npos) << err;
    EXPECT_NE(err.find("CRC mismatch"), std::string::npos) << err;
    ASSERT_EQ(ev.size(), 2u);   // the file_version record and step 10
    EXPECT_EQ(ev[1].step, 10);
}

TEST_F(TensorBoard, TruncatedFileIsReportedAsTruncated) {
    const std::string path = write_three_steps();
    const std::string b = bytes_of(path);
    overwrite(path, b.substr(0, b.size() - 3));
    std::string err;
    const std::vector<TfEvent> ev = read_tfevents(path, &err);
    EXPECT_NE(err.find("record 3"), std::string::npos) << err;
    EXPECT_NE(err.find("truncated"), std::string::npos) << err;
    ASSERT_EQ(ev.size(), 3u);
    EXPECT_EQ(ev[2].step, 20);
}

TEST_F(TensorBoard, UnwritableFolderThrowsIoErrorNamingIt) {
    const std::string file = dir_ + "/plain_file";
    overwrite(file, "not a folder");
    const std::string bad = file + "/tb";
    try {
        TensorBoardWriter w(bad);
        FAIL() << "created " << w.path();
    } catch (const IoError & e) {
        EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
}

TEST_F(TensorBoard, TwoWritersInOneFolderWriteTwoFiles) {
    TensorBoardWriter a(dir_), b(dir_);
    EXPECT_NE(a.path(), b.path());
    EXPECT_TRUE(a.write(1, {{"x", 1.0}}));
    EXPECT_TRUE(b.write(2, {{"x", 2.0}}));
    const std::vector<std::string> files = tfevents_files(dir_);
    ASSERT_EQ(files.size(), 2u);
    for (const std::string & f : files) {
        std::string err;
        EXPECT_EQ(read_tfevents(f, &err).size(), 2u) << f;
        EXPECT_EQ(err, "") << f;
    }
}

// A write that fails part way (here: the file size limit, as a full disk would) returns false
// with errno's text, leaves no torn record behind, and the next write succeeds.
TEST_F(TensorBoard, FailedWriteLeavesTheFileReadableAndTheNextSucceeds) {
    TensorBoardWriter w(dir_);
    ASSERT_TRUE(w.write(1, {{"loss", 1.5}}));
    const auto size = fs::file_size(w.path());
    rlimit saved{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small = saved;
    small.rlim_cur = rlim_t(size + 10);   // room for part of the next record only
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    const bool ok = w.write(2, {{"loss", 1.25}, {"a_long_enough_tag_name", 2.0}});
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);

    EXPECT_FALSE(ok);
    EXPECT_NE(w.error(), "");
    EXPECT_EQ(fs::file_size(w.path()), size);
    ASSERT_TRUE(w.write(3, {{"loss", 1.0}})) << w.error();
    EXPECT_EQ(w.error(), "");
    std::string err;
    const std::vector<TfEvent> ev = read_tfevents(w.path(), &err);
    EXPECT_EQ(err, "");
    ASSERT_EQ(ev.size(), 3u);
    EXPECT_EQ(ev[1].step, 1);
    EXPECT_EQ(ev[2].step, 3);
    EXPECT_EQ(ev[2].values.at(0).second, 1.0f);
}

}  // namespace
}  // namespace memfit
