#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/units.h"

#ifndef MEMFIT_TEST_DATA
#error "MEMFIT_TEST_DATA must name the tests/data directory"
#endif

namespace memfit {
namespace {

// A fresh directory per test, removed with its files afterwards.
class Safetensors : public testing::Test {
protected:
    void SetUp() override {
        std::string tmpl = testing::TempDir() + "memfit_st_XXXXXX";
        ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override {
        for (const std::string & f : files_in_dir()) ::unlink((dir_ + "/" + f).c_str());
        ::rmdir(dir_.c_str());
    }

    std::string path(const std::string & name) const { return dir_ + "/" + name; }

    std::vector<std::string> files_in_dir() const {
        std::vector<std::string> out;
        DIR * d = opendir(dir_.c_str());
        if (!d) return out;
        while (dirent * e = readdir(d)) {
            std::string n = e->d_name;
            if (n != "." && n != "..") out.push_back(n);
        }
        closedir(d);
        return out;
    }

    // Writes raw bytes: an explicit header length, the header text, then data_bytes zero bytes.
    std::string write_raw(const std::string & name, uint64_t header_len, const std::string & header,
                          size_t data_bytes) {
        std::string p = path(name);
        std::ofstream out(p, std::ios::binary);
        out.write(reinterpret_cast<const char *>(&header_len), 8);
        out << header;
        out << std::string(data_bytes, '\0');
        return p;
    }
    std::string write_header(const std::string & header, size_t data_bytes) {
        return write_raw("bad.safetensors", header.size(), header, data_bytes);
    }

    std::string dir_;
};

// Opens path expecting a FormatError whose message contains want.
void expect_format_error(const std::string & path, const std::string & want) {
    try {
        SafetensorsFile f = SafetensorsFile::open(path);
        ADD_FAILURE() << path << " opened; expected an error containing: " << want;
    } catch (const FormatError & e) {
        std::string msg = e.what();
        EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
        EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
    }
}

TEST_F(Safetensors, RoundTrip) {
    std::vector<float> weights = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 42.0f};
    std::vector<int32_t> ids = {7, -1, 100000, 3};
    std::vector<float> bf_src = {1.0f, -2.5f, 0.15625f, 3.14159f};
    std::vector<uint16_t> bf;
    for (float x : bf_src) bf.push_back(f32_to_bf16(x));
    std::map<std::string, std::string> meta = {{"config", "{\"n_embd\": 64}"}, {"note", "hello \"world\"\n"}};

    std::string p = path("model.safetensors");
    write_safetensors(p, {
        {"weights", "F32", {2, 3}, weights.data(), weights.size() * 4},
        {"ids", "I32", {4}, ids.data(), ids.size() * 4},
        {"bf", "BF16", {2, 2}, bf.data(), bf.size() * 2},
        {"empty", "F32", {0, 5}, nullptr, 0},
        {"scalar", "F32", {}, weights.data(), 4},
    }, meta);

    // The header is padded to a multiple of 8 and the file holds exactly header + data.
    std::ifstream in(p, std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char *>(&header_len), 8);
    EXPECT_EQ(header_len % 8, 0u);
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_EQ(uint64_t(st.st_size), 8 + header_len + 24 + 16 + 8 + 0 + 4);

    SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.metadata(), meta);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"weights", "ids", "bf", "empty", "scalar"}));
    EXPECT_TRUE(f.has("ids"));
    EXPECT_FALSE(f.has("nope"));
    EXPECT_FALSE(f.has("__metadata__"));

    EXPECT_EQ(f.info("weights").dtype, "F32");
    EXPECT_EQ(f.info("weights").shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(f.info("weights").nbytes, 24u);
    EXPECT_EQ(f.read_f32("weights"), weights);
    EXPECT_EQ(f.read_i32("ids"), ids);
    std::vector<float> bf_read = f.read_f32("bf");
    ASSERT_EQ(bf_read.size(), 4u);
    for (size_t i = 0; i < 4; i++) EXPECT_EQ(bf_read[i], bf16_to_f32(f32_to_bf16(bf_src[i])));
    EXPECT_EQ(bf_read[0], 1.0f);
    EXPECT_EQ(bf_read[1], -2.5f);
    EXPECT_EQ(bf_read[2], 0.15625f);
    EXPECT_TRUE(f.read_f32("empty").empty());
    EXPECT_EQ(f.info("empty").shape, (std::vector<int64_t>{0, 5}));
    EXPECT_EQ(f.read_f32("scalar"), std::vector<float>{1.0f});
    EXPECT_TRUE(f.info("scalar").shape.empty());

    // The atomic write leaves only the final file behind.
    EXPECT_EQ(files_in_dir(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(Safetensors, OverwritesAtomically) {
    std::string p = path("a.safetensors");
    std::vector<float> one = {1.0f}, two = {2.0f, 3.0f};
    write_safetensors(p, {{"x", "F32", {1}, one.data(), 4}}, {});
    write_safetensors(p, {{"x", "F32", {2}, two.data(), 8}}, {{"v", "2"}});
    SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.read_f32("x"), two);
    EXPECT_EQ(f.metadata().at("v"), "2");
    EXPECT_EQ(files_in_dir(), std::vector<std::string>{"a.safetensors"});
}

TEST_F(Safetensors, ConvertsOtherDtypes) {
    std::vector<uint16_t> h = {f32_to_f16(0.5f), f32_to_f16(-3.0f)};
    std::vector<double> d = {0.25, -1e10};
    std::vector<int64_t> l = {-5, 2147483647};
    std::vector<int64_t> too_big = {int64_t(1) << 40};
    std::vector<uint8_t> u = {1, 2, 3};
    std::string p = path("t.safetensors");
    write_safetensors(p, {
        {"h", "F16", {2}, h.data(), 4},
        {"d", "F64", {2}, d.data(), 16},
        {"l", "I64", {2}, l.data(), 16},
        {"big", "I64", {1}, too_big.data(), 8},
        {"u", "U8", {3}, u.data(), 3},
    }, {});
    SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_TRUE(f.metadata().empty());
    EXPECT_EQ(f.read_f32("h"), (std::vector<float>{0.5f, -3.0f}));
    EXPECT_EQ(f.read_f32("d"), (std::vector<float>{0.25f, -1e10f}));
    EXPECT_EQ(f.read_i32("l"), (std::vector<int32_t>{-5, 2147483647}));
    EXPECT_EQ(std::memcmp(f.info("u").data, u.data(), 3), 0);

    auto expect_msg = [&](auto fn, const std::string & want) {
        try {
            fn();
            ADD_FAILURE() << "expected FormatError containing: " << want;
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
    };
    expect_msg([&] { f.read_f32("u"); }, p + ": tensor 'u' has dtype U8; reading it as float needs F32, F16, BF16 or F64");
    expect_msg([&] { f.read_f32("l"); }, "tensor 'l' has dtype I64");
    expect_msg([&] { f.read_i32("h"); }, p + ": tensor 'h' has dtype F16; reading it as int32 needs I32 or I64");
    expect_msg([&] { f.read_i32("big"); }, "tensor 'big' element 0 is 1099511627776, outside the int32 range");
    expect_msg([&] { f.info("nope"); }, p + ": no tensor 'nope'");
    expect_msg([&] { f.read_f32("nope"); }, p + ": no tensor 'nope'");
}

TEST_F(Safetensors, IsMovable) {
    std::vector<float> v = {1.0f, 2.0f};
    std::string p = path("m.safetensors");
    write_safetensors(p, {{"v", "F32", {2}, v.data(), 8}}, {});
    SafetensorsFile a = SafetensorsFile::open(p);
    const uint8_t * data = a.info("v").data;
    SafetensorsFile b = std::move(a);
    EXPECT_EQ(b.info("v").data, data);
    EXPECT_EQ(b.read_f32("v"), v);
    SafetensorsFile c = SafetensorsFile::open(p);
    c = std::move(b);
    EXPECT_EQ(c.read_f32("v"), v);
    static_assert(!std::is_copy_constructible_v<SafetensorsFile>);
    static_assert(!std::is_copy_assignable_v<SafetensorsFile>);
}

TEST_F(Safetensors, NamesFollowDataOrder) {
    std::string p = write_header(
        R"({"z": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
        R"( "a": {"dtype": "U8", "shape": [1], "data_offsets": [4, 5]},)"
        R"( "m": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})", 5);
    SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"z", "m", "a"}));
    EXPECT_TRUE(f.metadata().empty());
}

TEST_F(Safetensors, MissingFileIsIoError) {
    std::string p = path("absent.safetensors");
    try {
        SafetensorsFile::open(p);
        ADD_FAILURE() << "opened a missing file";
    } catch (const IoError & e) {
        EXPECT_EQ(std::string(e.what()), p + ": cannot open: No such file or directory");
    }
    EXPECT_THROW(SafetensorsFile::open(dir_), IoError);  // a directory
}

TEST_F(Safetensors, TruncatedFile) {
    std::string p = path("short.safetensors");
    std::ofstream(p, std::ios::binary) << "abcd";
    expect_format_error(p, "file is 4 bytes, too small for a safetensors header (needs at least 8)");
    std::ofstream(p, std::ios::binary | std::ios::trunc).flush();
    expect_format_error(p, "file is 0 bytes");
}

TEST_F(Safetensors, HeaderLengthPastEndOfFile) {
    std::string p = write_raw("bad.safetensors", 1000, "{}", 8);
    expect_format_error(p, "header length 1000 is larger than the 10 bytes after the length field (file is 18 bytes)");
    p = write_raw("bad.safetensors", UINT64_MAX, "{}", 0);
    expect_format_error(p, "header length 18446744073709551615 is larger than the 2 bytes");
}

TEST_F(Safetensors, HeaderLengthOverLimit) {
    // A sparse file just big enough to hold the claimed header.
    std::string p = path("huge.safetensors");
    uint64_t len = 100 * MiB + 8;
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, &len, 8), 8);
    ASSERT_EQ(::ftruncate(fd, off_t(8 + len)), 0);
    ::close(fd);
    expect_format_error(p, "header length 104857608 exceeds the 104857600 byte limit");
}

TEST_F(Safetensors, InvalidJson) {
    expect_format_error(write_header("{\"a\": [1, 2", 0), "header: not valid JSON at line 1");
    expect_format_error(write_header("", 0), "header: not valid JSON at line 1");
    expect_format_error(write_header("[1, 2]", 0), "header is a JSON array, expected an object");
    expect_format_error(write_header(R"({"__metadata__": {"k": 1}})", 0),
                        "__metadata__ value for 'k' is a number, expected a string");
    expect_format_error(write_header(R"({"__metadata__": []})", 0), "__metadata__ is not a JSON object");
    expect_format_error(write_header(R"({"t": 5})", 0), "tensor 't': entry is not a JSON object");
    expect_format_error(write_header(
        R"({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
        R"( "t": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})", 2),
        "header has key 't' twice");
}

TEST_F(Safetensors, UnknownDtype) {
    expect_format_error(write_header(R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4),
                        "tensor 'w': unknown dtype 'F33'");
    expect_format_error(write_header(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4),
                        "tensor 'w': missing string 'dtype'");
}

TEST_F(Safetensors, BadShape) {
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
                        "tensor 'w': shape [-1] has a dimension that is not a non-negative integer");
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
                        "tensor 'w': shape [1.5] has a dimension");
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", 4),
                        "tensor 'w': missing array 'shape'");
}

TEST_F(Safetensors, OffsetsPastTheEnd) {
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", 16),
                        "tensor 'w': data_offsets [0, 32] run past the end of the 16 byte data region");
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 16),
                        "tensor 'w': data_offsets [8, 4] end before they begin");
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 16),
                        "tensor 'w': missing 'data_offsets' [begin, end] of two non-negative integers");
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 16),
                        "tensor 'w': missing 'data_offsets'");
}

TEST_F(Safetensors, SizeMismatchWithShape) {
    expect_format_error(write_header(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})", 32),
                        "tensor 'w': data_offsets [0, 16] hold 16 bytes but shape [2, 3] of F32 needs 24");
    expect_format_error(
        write_header(R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
        "needs more than 2^64");
}

TEST_F(Safetensors, OverlappingTensors) {
    expect_format_error(write_header(
        R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
        R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 24),
        "tensor 'b' [8, 24] overlaps tensor 'a' [0, 16]");
    // Contained in a larger tensor that starts earlier, past a non-overlapping one in between.
    expect_format_error(write_header(
        R"({"big": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]},)"
        R"( "x": {"dtype": "U8", "shape": [10], "data_offsets": [50, 60]}})", 100),
        "tensor 'x' [50, 60] overlaps tensor 'big' [0, 100]");
    // Empty tensors occupy nothing, so they overlap nothing.
    SafetensorsFile f = SafetensorsFile::open(write_header(
        R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
        R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}})", 16));
    EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "e"}));
}

TEST_F(Safetensors, WriterRejectsInconsistentTensors) {
    std::vector<float> v(6);
    std::string p = path("w.safetensors");
    auto expect_msg = [&](const std::vector<TensorToWrite> & ts, const std::string & want) {
        try {
            write_safetensors(p, ts, {});
            ADD_FAILURE() << "expected FormatError containing: " << want;
        } catch (const FormatError & e) {
            EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
    };
    expect_msg({{"w", "F32", {2, 3}, v.data(), 20}},
               p + ": cannot write tensor 'w': 20 bytes given but shape [2, 3] of F32 needs 24");
    expect_msg({{"w", "F31", {1}, v.data(), 4}}, "cannot write tensor 'w': unknown dtype 'F31'");
    expect_msg({{"w", "F32", {1}, v.data(), 4}, {"w", "F32", {1}, v.data(), 4}},
               "cannot write tensor 'w': the name appears twice");
    expect_msg({{"__metadata__", "F32", {1}, v.data(), 4}}, "the name is reserved for metadata");
    expect_msg({{"w", "F32", {-1}, v.data(), 4}}, "shape [-1] of F32 needs an invalid or overflowing size");
    EXPECT_TRUE(files_in_dir().empty());
}

TEST_F(Safetensors, WriterIoErrorCarriesStrerror) {
    std::vector<float> v(1);
    std::string p = path("no/such/dir/w.safetensors");
    try {
        write_safetensors(p, {{"w", "F32", {1}, v.data(), 4}}, {});
        ADD_FAILURE() << "wrote into a missing directory";
    } catch (const IoError & e) {
        EXPECT_EQ(std::string(e.what()), p + ".tmp: cannot create: No such file or directory");
    }
}

TEST(SafetensorsFixture, ReadsGpt2Tiny) {
    SafetensorsFile f = SafetensorsFile::open(MEMFIT_TEST_DATA "/gpt2_tiny.safetensors");
    ASSERT_EQ(f.metadata().count("config"), 1u);
    nlohmann::json config = nlohmann::json::parse(f.metadata().at("config"));
    EXPECT_EQ(config.at("n_embd").get<int>(), 64);
    EXPECT_TRUE(f.has("wte.weight"));
    EXPECT_EQ(f.info("wte.weight").dtype, "F32");
    EXPECT_EQ(f.info("wte.weight").shape, (std::vector<int64_t>{101, 64}));
    EXPECT_EQ(f.read_f32("wte.weight").size(), 101u * 64u);
    std::vector<int32_t> ids = f.read_i32("input_ids");
    EXPECT_EQ(ids.size(), 26u);
    for (int32_t id : ids) {
        EXPECT_GE(id, 0);
        EXPECT_LT(id, 101);
    }
    std::vector<std::string> names = f.names();
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names.front(), "wte.weight");  // data offset 0
}

}  // namespace
}  // namespace memfit
