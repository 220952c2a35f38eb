// Untrusted JSON (core/json_read.h): nesting is bounded while parsing, so a value deeper than any
// real file never exists to overflow the stack of a later copy, dump or conversion; errors say
// where, at which line and column; whole files are bounded and must be regular files.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json_read.h"

using namespace memfit;

namespace {

std::string nested(int depth, const std::string & open = "[", const std::string & close = "]") {
    std::string s;
    for (int i = 0; i < depth; ++i) s += open;
    for (int i = 0; i < depth; ++i) s += close;
    return s;
}

std::string error_of(std::string_view text) {
    try {
        parse_json(text, "f.json");
    } catch (const FormatError & e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(JsonRead, NestingIsBoundedWhileParsing) {
    // 200,000 levels: before the bound, copying such a value overflowed the stack (SIGSEGV).
    const std::string deep = "{\"model\": \"nano\", \"x\": " + nested(200000) + "}";
    const std::string e = error_of(deep);
    EXPECT_NE(e.find("f.json: nested deeper than 512 levels at line 1"), std::string::npos) << e;
    EXPECT_NE(error_of(nested(100000, "{\"a\":", "}")).find("nested deeper"), std::string::npos);
    EXPECT_THROW(parse_ordered_json("\n\n" + nested(600), "o.json"), FormatError);
    EXPECT_NE(error_of("\n\n" + nested(600)).find("at line 3"), std::string::npos) << error_of("\n\n" + nested(600));
    EXPECT_FALSE(try_parse_json(nested(200000)));
    // Real files are shallow: up to the limit they parse, and brackets in strings do not count.
    EXPECT_NO_THROW(parse_json(nested(kMaxJsonDepth - 2), "ok.json"));
    EXPECT_NO_THROW(parse_json("[\"" + std::string(5000, '[') + "\"]", "s.json"));
}

TEST(JsonRead, ErrorsSayWhereInMemfitsWords) {
    const std::string e = error_of("{\n  \"a\": 1,\n  \"b\": oops\n}");
    EXPECT_NE(e.find("f.json: not valid JSON at line 3, column"), std::string::npos) << e;
    EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_NE(error_of("").find("not valid JSON at line 1"), std::string::npos);
    // The events see every value; one that throws refuses the file.
    EXPECT_THROW(parse_json("{\"a\": 1}", "f.json",
                            [](int, nlohmann::json::parse_event_t ev, nlohmann::json &) {
                                if (ev == nlohmann::json::parse_event_t::key) throw FormatError("no keys");
                            }),
                 FormatError);
}

TEST(JsonRead, WholeFilesAreRegularAndBounded) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("memfit_json_read." + std::to_string(getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "a.json") << "{\"x\": [1, 2, 3]}";
    EXPECT_EQ(read_json_file((dir / "a.json").string())["x"].size(), 3u);
    EXPECT_THROW(read_json_file((dir / "a.json").string(), 4), IoError);   // larger than allowed
    EXPECT_THROW(read_json_file((dir / "missing.json").string()), IoError);
    EXPECT_THROW(read_json_file(dir.string()), IoError);                  // a folder
    ASSERT_EQ(mkfifo((dir / "fifo.json").c_str(), 0600), 0);
    try {
        read_json_file((dir / "fifo.json").string());   // would block forever if opened
        ADD_FAILURE() << "a FIFO was read";
    } catch (const IoError & e) {
        EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}
