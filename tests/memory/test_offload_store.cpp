// The --offload-dir file checks what it reads against what this run wrote there: bytes changed
// under a running job (zeroed, 0xFF, one flipped bit) stop the run with one line instead of
// training on them, and the reads a run does (chunks, whole buffers, ranges never written) pass.
#include "memory/offload_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

// The store's file, unlinked at open(): found through this process's descriptors.
int open_store_file_behind_its_back() {
    for (const auto & e : fs::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        const std::string target = fs::read_symlink(e.path(), ec).string();
        if (!ec && target.find("memfit-offload-test-") != std::string::npos)
            return ::open(e.path().c_str(), O_RDWR);
    }
    return -1;
}

struct OffloadStoreTest : ::testing::Test {
    void SetUp() override {
        dir = fs::temp_directory_path() / ("memfit-offload-store-" + std::to_string(::getpid()));
        fs::create_directories(dir);
        store = make_file_store(dir.string(), "test");
        ASSERT_GE(store->open(kBytes), kBytes);
        bytes.resize(kBytes);
        std::iota(bytes.begin(), bytes.end(), uint8_t(7));
    }
    void TearDown() override {
        store.reset();
        fs::remove_all(dir);
    }
    // Writes the state as the step program does: chunk by chunk, asynchronously.
    void write_chunks() {
        for (uint64_t at = 0; at < kBytes; at += kChunk) store->write_start(1, at, bytes.data() + at, kChunk);
        store->wait(1);
    }
    // Reads it back the same way; the error's text, or "" when every chunk read cleanly.
    std::string read_chunks(std::vector<uint8_t> & out) {
        out.assign(kBytes, 0);
        try {
            for (uint64_t at = 0; at < kBytes; at += kChunk) store->read_start(2, out.data() + at, at, kChunk);
            store->wait(2);
        } catch (const IoError & e) {
            return e.what();
        }
        return "";
    }

    static constexpr uint64_t kBytes = 1 << 20, kChunk = 64 << 10;
    fs::path dir;
    std::unique_ptr<OffloadStore> store;
    std::vector<uint8_t> bytes;
};

TEST_F(OffloadStoreTest, ReadsWhatItWroteInChunksAndWhole) {
    std::vector<uint8_t> out(kBytes, 0);
    store->read(out.data(), 0, kBytes);   // never written: nothing recorded to check
    store->write(0, bytes.data(), kBytes);   // between steps: the whole state at once
    EXPECT_EQ(read_chunks(out), "");      // chunks inside a whole write (not checked one by one)
    EXPECT_EQ(out, bytes);
    write_chunks();
    EXPECT_EQ(read_chunks(out), "");
    EXPECT_EQ(out, bytes);
    store->write(kChunk / 2, bytes.data(), 100);   // a write over part of a chunk
    std::fill(out.begin(), out.end(), 0);
    store->read(out.data(), 0, kBytes);
    std::vector<uint8_t> want = bytes;
    std::copy(bytes.begin(), bytes.begin() + 100, want.begin() + kChunk / 2);
    EXPECT_EQ(out, want);
}

TEST_F(OffloadStoreTest, BytesChangedBehindTheRunsBackAreCaught) {
    write_chunks();
    const int fd = open_store_file_behind_its_back();
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> out;
    // Zeroes, 0xFF and one flipped bit, each in a different chunk; each read back fails.
    const std::vector<std::pair<uint64_t, std::vector<uint8_t>>> damage = {
        {3 * kChunk + 10, std::vector<uint8_t>(4096, 0)},
        {9 * kChunk, std::vector<uint8_t>(kChunk, 0xFF)},
        {15 * kChunk + kChunk - 1, {uint8_t(bytes[15 * kChunk + kChunk - 1] ^ 0x10)}},
    };
    for (const auto & [at, what] : damage) {
        write_chunks();   // the run rewrites its state
        ASSERT_EQ(::pwrite(fd, what.data(), what.size(), off_t(at)), ssize_t(what.size()));
        const std::string err = read_chunks(out);
        EXPECT_NE(err.find("the offloaded optimizer state changed on disk after this run wrote it (at byte " +
                           std::to_string(at / kChunk * kChunk)), std::string::npos) << err;
        EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    }
    // Read whole between steps (a checkpoint): the same check.
    write_chunks();
    const uint8_t zero = 0;
    ASSERT_EQ(::pwrite(fd, &zero, 1, off_t(kBytes - 1)), 1);
    std::vector<uint8_t> whole(kBytes);
    EXPECT_THROW(store->read(whole.data(), 0, kBytes), IoError);
    ::close(fd);
}

}  // namespace
}  // namespace memfit
