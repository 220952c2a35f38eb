// The data tests' fixture: each test gets its own empty folder (removed afterwards), token files
// of known contents, raw bytes in and out, and the message of an expected error.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "data/token_file.h"

namespace memfit::test {

namespace fs = std::filesystem;

// Each test gets its own empty folder, removed afterwards.
class DataTest : public ::testing::Test {
protected:
    void SetUp() override {
        const auto * info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() /
               ("memfit_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string path(const std::string & name) const { return (dir_ / name).string(); }

    // Writes tokens 0, 1, 2, ... n-1 (so a token's value is its position).
    std::string iota_file(const std::string & name, size_t n, uint32_t vocab = 1u << 20) const {
        std::vector<int32_t> t(n);
        std::iota(t.begin(), t.end(), 0);
        memfit::write_token_file(path(name), t, vocab);
        return path(name);
    }

    static void write_bytes(const std::string & p, const std::string & bytes) {
        std::ofstream out(p, std::ios::binary | std::ios::trunc);
        out << bytes;
    }
    static std::string read_bytes(const std::string & p) {
        std::ifstream in(p, std::ios::binary);
        std::ostringstream ss;
        ss << in.rdbuf();
        return ss.str();
    }

    fs::path dir_;
};

template <class E>
std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const E & e) {
        return e.what();
    } catch (const std::exception & e) {
        return std::string("wrong exception type: ") + e.what();
    }
    return "no exception";
}

}  // namespace memfit::test
