// Hugging Face tokenizer.json: Qwen3's file against the ids transformers.js gives
// (tests/data/hf-tokenizers/qwen3/cases.json, add_special_tokens off), both merge encodings,
// ignore_merges, added tokens before pre-tokenisation, NFC, and one clear line for what is not
// implemented.
#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using memfit::Tokenizer;
using nlohmann::json;

const std::string kQwen = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3";

std::string slurp(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

const Tokenizer & qwen3() {
    static const std::unique_ptr<Tokenizer> tok = memfit::make_tokenizer(kQwen + "/tokenizer.json", "");
    return *tok;
}

TEST(HfTokenizer, Qwen3GivesTransformersJsIdsAndDecodesBack) {
    const json cases = json::parse(slurp(kQwen + "/cases.json"))["cases"];
    ASSERT_GE(cases.size(), 16u);
    for (const auto & c : cases) {
        const std::string text = c["text"].get<std::string>();
        SCOPED_TRACE(text.substr(0, 60));
        const std::vector<int32_t> ids = qwen3().encode(text);
        EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
        EXPECT_EQ(qwen3().decode(ids), text);
    }
    EXPECT_EQ(qwen3().vocab_size(), 151669);   // 151643 merges' tokens and 26 added ones
    // tokenizer_config.json's eos_token: <|im_end|>.
    EXPECT_EQ(qwen3().eot_id(), 151645);
    EXPECT_EQ(qwen3().name(), fs::absolute(kQwen + "/tokenizer.json").lexically_normal().string());
}

TEST(HfTokenizer, NfcAndArbitraryBytes) {
    // "e" + combining acute is NFC "é": the same ids as the composed text.
    EXPECT_EQ(qwen3().encode("caf\x65\xcc\x81"), qwen3().encode("caf\xc3\xa9"));
    // Bytes that are not UTF-8 are left as they are, and round-trip.
    const std::string raw = "ok \xff\xfe\x80 e\xcc\x81 <|im_end|>\xc3";
    EXPECT_EQ(qwen3().decode(qwen3().encode(raw)), raw);
}

TEST(HfTokenizer, AddedTokensAreMatchedBeforePreTokenisation) {
    const std::vector<int32_t> ids = qwen3().encode("x<|im_start|>user");
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids[1], 151644);
    std::vector<int32_t> user = qwen3().encode("user"), x = qwen3().encode("x");
    std::vector<int32_t> expect = x;
    expect.push_back(151644);
    expect.insert(expect.end(), user.begin(), user.end());
    EXPECT_EQ(ids, expect);
}

// A tiny byte-level file: 256 byte tokens (in GPT-2's alphabet), "ab", "abc", "xyz".
json tiny(const json & merges) {
    json vocab = json::object();
    std::string s;
    for (int b = 0; b < 256; ++b) {
        const uint32_t cp = memfit::ByteLevelBpe::byte_to_codepoint()[size_t(b)];
        s.clear();
        if (cp < 0x80) s.push_back(char(cp));
        else s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
        vocab[s] = b;
    }
    vocab["ab"] = 256;
    vocab["abc"] = 257;
    vocab["xyz"] = 258;
    return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"dropout", nullptr}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"added_tokens", json::array({{{"id", 259}, {"content", "<eot>"}, {"special", true}}})}};
}

std::string write(const std::string & name, const json & j) {
    const fs::path dir = fs::temp_directory_path() / ("memfit_hf_tok." + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string path = (dir / name).string();
    std::ofstream(path) << j.dump();
    return path;
}

TEST(HfTokenizer, BothMergeEncodingsAndIgnoreMerges) {
    for (const json & merges : {json::array({"a b", "ab c"}), json::array({json::array({"a", "b"}), json::array({"ab", "c"})})}) {
        SCOPED_TRACE(merges.dump());
        const auto tok = memfit::make_tokenizer(write("merges.json", tiny(merges)), "");
        EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{257}));
        EXPECT_EQ(tok->encode("xyz<eot>ab"), (std::vector<int32_t>{'x', 'y', 'z', 259, 256}));
        EXPECT_EQ(tok->decode({257, 259}), "abc<eot>");
        EXPECT_EQ(tok->eot_id(), -1);   // no tokenizer_config.json, no usual name
    }
    // ignore_merges: a piece that is itself a token ("xyz") is that token, whatever the merges.
    json j = tiny(json::array({"a b"}));
    j["model"]["ignore_merges"] = true;
    EXPECT_EQ(memfit::make_tokenizer(write("ignore.json", j), "")->encode("xyz"), (std::vector<int32_t>{258}));
}

TEST(HfTokenizer, WhatIsNotImplementedIsOneLineNamingIt) {
    struct Case { const char * key; json value; const char * says; };
    const std::vector<Case> cases = {
        {"normalizer", {{"type", "Lowercase"}}, "the normalizer \"Lowercase\" is not implemented"},
        {"pre_tokenizer", {{"type", "Metaspace"}}, "the pre_tokenizer \"Metaspace\" is not implemented"},
        {"decoder", {{"type", "WordPiece"}}, "the decoder \"WordPiece\" is not implemented"},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}}, "add_prefix_space: true is not implemented"},
        // A number where a name goes (found by fuzz_tokenizer: it raised the JSON library's type_error).
        {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", 1}},
         "Split's behavior 1 is not implemented"},
    };
    for (const Case & c : cases) {
        json j = tiny(json::array({"a b"}));
        j[c.key] = c.value;
        const std::string path = write("bad.json", j);
        try {
            memfit::make_tokenizer(path, "");
            ADD_FAILURE() << "no error for " << c.value.dump();
        } catch (const memfit::FormatError & e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
            EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
            EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        }
    }
    json wp = tiny(json::array());
    wp["model"]["type"] = "WordPiece";
    EXPECT_THROW(memfit::make_tokenizer(write("wp.json", wp), ""), memfit::FormatError);
    EXPECT_THROW(memfit::make_tokenizer(write("broken.json", json::array()), ""), memfit::FormatError);
    EXPECT_THROW(memfit::make_tokenizer("/nonexistent/tokenizer.json", ""), memfit::IoError);
}

TEST(HfTokenizer, AFolderWithTokenizerJsonUsesIt) {
    EXPECT_EQ(memfit::tokenizer_for_folder(kQwen), fs::absolute(kQwen + "/tokenizer.json").lexically_normal().string());
}

// `memfit tokenize --tokenizer PATH/tokenizer.json` prints the ids.
TEST(HfTokenizer, TheTokenizeCommandPrintsTheIds) {
    const std::string in = write("in.txt", json());   // overwritten below
    std::ofstream(in) << "Hello, world!";
    const std::string cmd = std::string(MEMFIT_BINARY) + " tokenize --tokenizer " + kQwen + "/tokenizer.json < " + in;
    std::FILE * p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[256] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
    EXPECT_EQ(::pclose(p), 0);
    EXPECT_EQ(std::string(buf, n), "[9707,11,1879,0]\n");
}

}  // namespace
