// Tokenizers: GPT-2 BPE against reference ids, byte tokenizer, make_tokenizer errors.
#include "core/error.h"
#include "test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using memfit::Tokenizer;

// Loading the GPT-2 files takes a moment; share one tokenizer across the tests.
const Tokenizer & gpt2() {
    static const std::unique_ptr<Tokenizer> tok = memfit::make_tokenizer("gpt2", MEMFIT_DATA_DIR);
    return *tok;
}

TEST(Gpt2Bpe, MatchesReferenceIdsAndRoundTrips) {
    const auto cases = nlohmann::json::parse(memfit::test::read_text(std::string(MEMFIT_TEST_DATA) + "/gpt2_bpe_cases.json"));
    ASSERT_GE(cases["cases"].size(), 10u);
    for (const auto & c : cases["cases"]) {
        const auto text = c["text"].get<std::string>();
        const auto expected = c["ids"].get<std::vector<int32_t>>();
        const auto ids = gpt2().encode(text);
        EXPECT_EQ(ids, expected) << "text: " << text.substr(0, 80);
        EXPECT_EQ(gpt2().decode(expected), text) << "text: " << text.substr(0, 80);
    }
}

TEST(Gpt2Bpe, VocabularyAndSpecialToken) {
    EXPECT_EQ(gpt2().name(), "gpt2");
    EXPECT_EQ(gpt2().vocab_size(), 50257);
    EXPECT_EQ(gpt2().eot_id(), 50256);
    EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
    EXPECT_TRUE(gpt2().encode("").empty());
}

TEST(Gpt2Bpe, ByteAlphabetIsABijectionOntoPrintableCodePoints) {
    const auto & table = memfit::ByteLevelBpe::byte_to_codepoint();
    ASSERT_EQ(table.size(), 256u);
    std::set<uint32_t> seen(table.begin(), table.end());
    EXPECT_EQ(seen.size(), 256u);
    EXPECT_EQ(table['A'], uint32_t{'A'});
    EXPECT_EQ(table[' '], 0x120u);                       // 'Ġ'
    EXPECT_EQ(table['\n'], 0x10Au);                      // 'Ċ'
}

TEST(Gpt2Bpe, EncodesTheShakespeareCorpusLosslessly) {
    const std::string text = memfit::test::read_text(std::string(MEMFIT_DATA_DIR) + "/tinyshakespeare.txt");
    const auto ids = gpt2().encode(text);
    EXPECT_EQ(ids.size(), 338025u);                      // same count as tiktoken's gpt2 encoding
    EXPECT_EQ(gpt2().decode(ids), text);
}

TEST(Gpt2Bpe, RoundTripsArbitraryBytesIncludingInvalidUtf8) {
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    for (const std::string & s : {all, std::string("abc\xff\xfe def \xc3 x\xe2\x82"), std::string("\0\0 x\0", 5),
                                  std::string("caf\xc3\xa9 \xf0\x9f\x98\x80!")}) {
        const auto ids = gpt2().encode(s);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 50257);
        EXPECT_EQ(gpt2().decode(ids), s);
    }
}

TEST(Gpt2Bpe, LongWordsAreFastAndLossless) {
    std::string word;
    for (unsigned i = 0; i < 200000; ++i) word.push_back("abcdefghij"[(i * 7919u + i / 3) % 10]);
    const auto ids = gpt2().encode(word);
    EXPECT_LT(ids.size(), word.size());
    EXPECT_EQ(gpt2().decode(ids), word);
    const std::string spaces(100000, ' ');
    EXPECT_EQ(gpt2().decode(gpt2().encode(spaces + "x")), spaces + "x");
}

TEST(Gpt2Bpe, ConcurrentEncodesAgree) {
    const std::string text = memfit::test::read_text(std::string(MEMFIT_DATA_DIR) + "/tinyshakespeare.txt").substr(0, 200000);
    const auto expected = gpt2().encode(text);
    std::vector<std::vector<int32_t>> got(4);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = gpt2().encode(text); });
    for (auto & t : threads) t.join();
    for (const auto & g : got) EXPECT_EQ(g, expected);
}

TEST(Gpt2Bpe, DecodeRejectsIdsOutsideTheVocabulary) {
    EXPECT_THROW(gpt2().decode({15496, 50257}), memfit::FormatError);
    EXPECT_THROW(gpt2().decode({-1}), memfit::FormatError);
}

TEST(ByteTokenizer, RoundTripsIncludingNonAscii) {
    const auto tok = memfit::make_tokenizer("bytes", MEMFIT_DATA_DIR);
    EXPECT_EQ(tok->name(), "bytes");
    EXPECT_EQ(tok->vocab_size(), 256);
    EXPECT_EQ(tok->eot_id(), -1);
    static constexpr char raw[] = "h\xc3\xa9llo \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\n\t\x00\xff";
    const std::string text(raw, sizeof raw - 1);        // keeps the NUL byte
    ASSERT_EQ(text.size(), 22u);
    const auto ids = tok->encode(text);
    ASSERT_EQ(ids.size(), text.size());
    for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
    EXPECT_EQ(ids[1], 0xC3);
    EXPECT_EQ(tok->decode(ids), text);
    EXPECT_THROW(tok->decode({256}), memfit::FormatError);
}

TEST(MakeTokenizer, UnknownKindListsTheValidOnes) {
    try {
        memfit::make_tokenizer("sentencepiece", MEMFIT_DATA_DIR);
        FAIL() << "expected ConfigError";
    } catch (const memfit::ConfigError & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("sentencepiece"), std::string::npos) << msg;
        EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
        EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
    }
}

TEST(MakeTokenizer, MissingGpt2FilesAreAnIoError) {
    try {
        memfit::make_tokenizer("gpt2", "/nonexistent-memfit-dir");
        FAIL() << "expected IoError";
    } catch (const memfit::IoError & e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent-memfit-dir/gpt2-bpe/encoder.json"), std::string::npos)
            << e.what();
    }
}

}  // namespace
