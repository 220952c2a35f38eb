// Token files, the data loader and dataset preparation.
#include "core/error.h"
#include "data/data_loader.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data_test.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using memfit::DataLoader;
using memfit::TokenFile;
using memfit::test::DataTest;
using memfit::test::error_of;

// ---- token files -------------------------------------------------------------------------------

TEST_F(DataTest, TokenFileRoundTripU16) {
    const std::vector<int32_t> toks = {0, 1, 50256, 12345, 65535 % 50257, 7};
    memfit::write_token_file(path("a.bin"), toks, 50257);
    EXPECT_EQ(fs::file_size(path("a.bin")), 32 + 2 * toks.size());
    EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
    const TokenFile f(path("a.bin"));
    EXPECT_EQ(f.size(), toks.size());
    EXPECT_EQ(f.vocab_size(), 50257u);
    EXPECT_EQ(f.bytes_per_token(), 2u);
    for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(f.token(i), toks[i]);

    // The header is little-endian, as documented.
    const std::string raw = read_bytes(path("a.bin"));
    EXPECT_EQ(raw.substr(0, 8), "MFTOKENS");
    EXPECT_EQ(static_cast<unsigned char>(raw[8]), 1);
    EXPECT_EQ(static_cast<unsigned char>(raw[12]), 2);
    EXPECT_EQ(static_cast<unsigned char>(raw[24]), toks.size());
    EXPECT_EQ(static_cast<unsigned char>(raw[32 + 2 * 2]), 50256 & 0xFF);
    EXPECT_EQ(static_cast<unsigned char>(raw[32 + 2 * 2 + 1]), 50256 >> 8);
}

TEST_F(DataTest, TokenFileRoundTripU32) {
    const std::vector<int32_t> toks = {0, 65535, 65536, 99999, 70000, 3};
    memfit::write_token_file(path("b.bin"), toks, 100000);
    EXPECT_EQ(fs::file_size(path("b.bin")), 32 + 4 * toks.size());
    const TokenFile f(path("b.bin"));
    EXPECT_EQ(f.bytes_per_token(), 4u);
    EXPECT_EQ(f.vocab_size(), 100000u);
    ASSERT_EQ(f.size(), toks.size());
    for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(f.token(i), toks[i]);
}

TEST_F(DataTest, TokenFileWidthBoundaryAndEmptyFile) {
    memfit::write_token_file(path("c.bin"), std::vector<int32_t>{65535, 0}, 65536);
    const TokenFile c(path("c.bin"));
    EXPECT_EQ(c.bytes_per_token(), 2u);
    EXPECT_EQ(c.token(0), 65535);

    memfit::write_token_file(path("empty.bin"), std::vector<int32_t>{}, 256);
    const TokenFile e(path("empty.bin"));
    EXPECT_EQ(e.size(), 0u);
    EXPECT_EQ(fs::file_size(path("empty.bin")), 32u);
}

TEST_F(DataTest, TokenFileMoveKeepsTheMapping) {
    memfit::write_token_file(path("m.bin"), std::vector<int32_t>{5, 6, 7}, 256);
    TokenFile a(path("m.bin"));
    TokenFile b(std::move(a));
    EXPECT_EQ(b.size(), 3u);
    EXPECT_EQ(b.token(2), 7);
    TokenFile c(path("m.bin"));
    c = std::move(b);
    EXPECT_EQ(c.token(1), 6);
}

TEST_F(DataTest, WriteRejectsTokensOutsideTheVocabularyAndLeavesNoFile) {
    const std::string msg = error_of<memfit::FormatError>(
        [&] { memfit::write_token_file(path("bad.bin"), std::vector<int32_t>{1, 2, 256}, 256); });
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(path("bad.bin")));
    EXPECT_FALSE(fs::exists(path("bad.bin.tmp")));
    EXPECT_THROW(memfit::write_token_file(path("neg.bin"), std::vector<int32_t>{-1}, 256), memfit::FormatError);
}

TEST_F(DataTest, WriteIntoAMissingFolderIsAnIoError) {
    EXPECT_THROW(memfit::write_token_file(path("no/such/dir/x.bin"), std::vector<int32_t>{1}, 256), memfit::IoError);
}

TEST_F(DataTest, MissingTokenFileIsAnIoError) {
    const std::string msg = error_of<memfit::IoError>([&] { TokenFile f(path("missing.bin")); });
    EXPECT_NE(msg.find("missing.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memfit prepare"), std::string::npos) << msg;
}

TEST_F(DataTest, CorruptTokenFilesAreFormatErrorsNamingTheFile) {
    memfit::write_token_file(path("good.bin"), std::vector<int32_t>{1, 2, 3, 4}, 256);
    const std::string good = read_bytes(path("good.bin"));
    ASSERT_EQ(good.size(), 32u + 8u);

    struct Case { const char * name; std::string bytes; const char * expect; };
    auto patched = [&](size_t offset, const std::string & b) {
        std::string s = good;
        s.replace(offset, b.size(), b);
        return s;
    };
    const std::vector<Case> cases = {
        {"short.bin", good.substr(0, 10), "10 bytes"},
        {"magic.bin", patched(0, "abcdefgh"), "magic 'abcdefgh'"},
        {"version.bin", patched(8, std::string("\x03\0\0\0", 4)), "version 3"},
        {"bpt.bin", patched(12, std::string("\x03\0\0\0", 4)), "bytes_per_token is 3"},
        {"vocab.bin", patched(16, std::string("\0\0\0\0", 4)), "vocab_size 0"},
        {"reserved.bin", patched(20, std::string("\x01\0\0\0", 4)), "reserved"},
        {"truncated.bin", good.substr(0, good.size() - 3), "4 tokens"},
        {"trailing.bin", good + "xx", "the file has 10"},
        {"huge_count.bin", patched(24, std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8)), "truncated or corrupt"},
    };
    for (const Case & c : cases) {
        write_bytes(path(c.name), c.bytes);
        const std::string msg = error_of<memfit::FormatError>([&] { TokenFile f(path(c.name)); });
        EXPECT_NE(msg.find(path(c.name)), std::string::npos) << c.name << ": " << msg;
        EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    }
    // And the file name shows up when the loader opens it, too.
    const std::string msg = error_of<memfit::FormatError>([&] { DataLoader d(path("magic.bin"), 1, 1, 0); });
    EXPECT_NE(msg.find("magic.bin"), std::string::npos) << msg;
}

// ---- data loader -------------------------------------------------------------------------------

TEST_F(DataTest, EpochOrderIsAPortableSeededPermutation) {
    // Pinned: resuming a run on another machine or standard library must see the same order.
    EXPECT_EQ(DataLoader::epoch_order(10, 42, 0), (std::vector<uint64_t>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6}));
    EXPECT_EQ(DataLoader::epoch_order(10, 42, 1), (std::vector<uint64_t>{2, 4, 3, 8, 1, 7, 5, 9, 0, 6}));
    auto o = DataLoader::epoch_order(1000, 7, 3);
    std::sort(o.begin(), o.end());
    for (uint64_t i = 0; i < o.size(); ++i) ASSERT_EQ(o[i], i);
    EXPECT_TRUE(DataLoader::epoch_order(0, 1, 0).empty());
}

TEST_F(DataTest, TargetsAreInputsShiftedByOneWithinTheFile) {
    const size_t n = 1000;
    const int B = 5, T = 8;
    DataLoader dl(iota_file("t.bin", n), B, T, 1);
    EXPECT_EQ(dl.num_windows(), (n - 1) / T);
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int step = 0; step < 60; ++step) {              // crosses two epoch boundaries
        dl.next(in.data(), tg.data());
        for (int b = 0; b < B; ++b) {
            const int32_t start = in[b * T];
            EXPECT_EQ(start % T, 0);                     // windows start at multiples of T
            EXPECT_LE(static_cast<size_t>(start) + T, n - 1);  // and end inside the file
            for (int t = 0; t < T; ++t) {
                EXPECT_EQ(in[b * T + t], start + t);     // consecutive tokens (token value = position)
                EXPECT_EQ(tg[b * T + t], in[b * T + t] + 1);
                if (t + 1 < T) {
                    EXPECT_EQ(tg[b * T + t], in[b * T + t + 1]);
                }
            }
        }
    }
}

TEST_F(DataTest, AnEpochVisitsEveryWindowExactlyOnce) {
    const size_t n = 1000;
    const int B = 5, T = 8;                               // 124 windows: not a multiple of B
    DataLoader dl(iota_file("e.bin", n), B, T, 99);
    const size_t W = dl.num_windows();
    ASSERT_EQ(W, 124u);
    std::vector<int32_t> in(B * T), tg(B * T);
    std::vector<int> seen(W, 0);
    std::vector<size_t> order;
    while (order.size() < 2 * W + B) {
        dl.next(in.data(), tg.data());
        for (int b = 0; b < B; ++b) order.push_back(static_cast<size_t>(in[b * T] / T));
    }
    for (size_t i = 0; i < W; ++i) ++seen[order[i]];
    for (size_t w = 0; w < W; ++w) EXPECT_EQ(seen[w], 1) << "window " << w << " in epoch 0";
    std::fill(seen.begin(), seen.end(), 0);
    for (size_t i = W; i < 2 * W; ++i) ++seen[order[i]];
    for (size_t w = 0; w < W; ++w) EXPECT_EQ(seen[w], 1) << "window " << w << " in epoch 1";
    EXPECT_NE(std::vector<size_t>(order.begin(), order.begin() + W),
              std::vector<size_t>(order.begin() + W, order.begin() + 2 * W));  // reshuffled per epoch
}

TEST_F(DataTest, EpochAndCursorTrackProgress) {
    DataLoader dl(iota_file("c.bin", 1000), 5, 8, 3);   // 124 windows
    std::vector<int32_t> in(40), tg(40);
    EXPECT_EQ(dl.epoch(), 0u);
    EXPECT_EQ(dl.cursor(), 0u);
    for (int i = 0; i < 24; ++i) dl.next(in.data(), tg.data());
    EXPECT_EQ(dl.epoch(), 0u);
    EXPECT_EQ(dl.cursor(), 120u);
    dl.next(in.data(), tg.data());                       // 4 windows of epoch 0, 1 of epoch 1
    EXPECT_EQ(dl.epoch(), 1u);
    EXPECT_EQ(dl.cursor(), 1u);
}

TEST_F(DataTest, SameSeedSameBatchesDifferentSeedDifferentOrder) {
    const std::string f = iota_file("s.bin", 5000);
    DataLoader a(f, 4, 16, 1234), b(f, 4, 16, 1234), c(f, 4, 16, 1235);
    std::vector<int32_t> ia(64), ta(64), ib(64), tb(64), ic(64), tc(64);
    bool differs = false;
    for (int step = 0; step < 20; ++step) {
        a.next(ia.data(), ta.data());
        b.next(ib.data(), tb.data());
        c.next(ic.data(), tc.data());
        EXPECT_EQ(ia, ib);
        EXPECT_EQ(ta, tb);
        differs = differs || ia != ic;
    }
    EXPECT_TRUE(differs);
}

TEST_F(DataTest, SeekResumesIdentically) {
    const std::string f = iota_file("r.bin", 1000);
    const int B = 5, T = 8;
    for (int resume_after : {0, 7, 24, 25, 30, 60}) {
        DataLoader a(f, B, T, 77);
        std::vector<int32_t> ia(B * T), ta(B * T), ib(B * T), tb(B * T);
        for (int i = 0; i < resume_after; ++i) a.next(ia.data(), ta.data());
        const uint64_t epoch = a.epoch();
        const size_t cursor = a.cursor();

        DataLoader b(f, B, T, 77);
        b.next(ib.data(), tb.data());                    // some unrelated progress first
        b.seek(epoch, cursor);
        EXPECT_EQ(b.epoch(), epoch);
        EXPECT_EQ(b.cursor(), cursor);
        for (int i = 0; i < 40; ++i) {
            a.next(ia.data(), ta.data());
            b.next(ib.data(), tb.data());
            ASSERT_EQ(ia, ib) << "resumed after " << resume_after << " batches, step " << i;
            ASSERT_EQ(ta, tb);
        }
    }
    DataLoader d(f, B, T, 77);
    d.seek(2, d.num_windows());                          // end of epoch 2 = start of epoch 3
    EXPECT_EQ(d.epoch(), 3u);
    EXPECT_EQ(d.cursor(), 0u);
    EXPECT_THROW(d.seek(0, d.num_windows() + 1), memfit::ConfigError);
}

TEST_F(DataTest, TooSmallFilesAreConfigErrors) {
    const std::string f = iota_file("small.bin", 64);   // 64 tokens
    std::string msg = error_of<memfit::ConfigError>([&] { DataLoader d(f, 1, 64, 0); });  // needs 65
    EXPECT_NE(msg.find("64 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("65"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--seq"), std::string::npos) << msg;

    DataLoader ok(f, 1, 63, 0);                          // exactly one window
    EXPECT_EQ(ok.num_windows(), 1u);

    msg = error_of<memfit::ConfigError>([&] { DataLoader d(f, 8, 16, 0); });  // 3 windows < 8
    EXPECT_NE(msg.find("3 windows"), std::string::npos) << msg;
    EXPECT_NE(msg.find("batch size 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--batch"), std::string::npos) << msg;

    EXPECT_THROW(DataLoader(f, 0, 8, 0), memfit::ConfigError);
    EXPECT_THROW(DataLoader(f, 1, 0, 0), memfit::ConfigError);
}

TEST_F(DataTest, TokenOutsideTheVocabularyIsCaughtPerBatch) {
    std::vector<int32_t> toks(101, 1);
    memfit::write_token_file(path("v.bin"), toks, 256);
    std::string raw = read_bytes(path("v.bin"));
    raw[32 + 2 * 37] = '\x2c';                           // token 37 := 300 (0x012c), vocab is 256
    raw[32 + 2 * 37 + 1] = '\x01';
    write_bytes(path("v.bin"), raw);

    DataLoader dl(path("v.bin"), 10, 10, 5);             // opening does not scan the tokens
    std::vector<int32_t> in(100), tg(100);
    const std::string msg = error_of<memfit::FormatError>([&] { dl.next(in.data(), tg.data()); });
    EXPECT_NE(msg.find("v.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 37"), std::string::npos) << msg;
    EXPECT_NE(msg.find("300"), std::string::npos) << msg;
}

// ---- prepare -----------------------------------------------------------------------------------

TEST_F(DataTest, PrepareWritesTrainValAndMeta) {
    const std::string text = "To be, or not to be, that is the question.\n";
    write_bytes(path("in.txt"), text);
    memfit::PrepareOptions o;
    o.input = path("in.txt");
    o.out_dir = path("out/bytes");
    o.tokenizer = "bytes";
    o.val_fraction = 0.25;
    const auto r = memfit::prepare_dataset(o);
    EXPECT_EQ(r.vocab_size, 256u);
    EXPECT_EQ(r.val_tokens, 11u);                        // round(44 * 0.25)
    EXPECT_EQ(r.train_tokens + r.val_tokens, text.size());

    const TokenFile train(r.train_path), val(r.val_path);
    ASSERT_EQ(train.size(), r.train_tokens);
    ASSERT_EQ(val.size(), r.val_tokens);
    std::string back;
    for (uint64_t i = 0; i < train.size(); ++i) back.push_back(static_cast<char>(train.token(i)));
    for (uint64_t i = 0; i < val.size(); ++i) back.push_back(static_cast<char>(val.token(i)));
    EXPECT_EQ(back, text);                               // val is the tail

    const auto meta = nlohmann::json::parse(read_bytes(r.meta_path));
    EXPECT_EQ(meta["tokenizer"], "bytes");
    EXPECT_EQ(meta["vocab_size"], 256);
    EXPECT_EQ(meta["train_tokens"], r.train_tokens);
    EXPECT_EQ(meta["val_tokens"], r.val_tokens);
    EXPECT_NE(meta["source"].get<std::string>().find("in.txt"), std::string::npos);
}

TEST_F(DataTest, PrepareWithGpt2) {
    write_bytes(path("in.txt"), "Hello world. Hello world. Hello world. Hello world.");
    memfit::PrepareOptions o;
    o.input = path("in.txt");
    o.out_dir = path("g");
    o.tokenizer_dir = MEMFIT_DATA_DIR;
    const auto r = memfit::prepare_dataset(o);
    EXPECT_EQ(r.tokenizer, "gpt2");
    EXPECT_EQ(r.vocab_size, 50257u);
    EXPECT_EQ(r.train_tokens + r.val_tokens, 12u);       // "Hello", " world", "." x 4
    const TokenFile train(r.train_path);
    EXPECT_EQ(train.bytes_per_token(), 2u);
    EXPECT_EQ(train.token(0), 15496);
}

TEST_F(DataTest, PrepareErrors) {
    memfit::PrepareOptions o;
    o.out_dir = path("out");
    o.tokenizer = "bytes";

    o.input = path("missing.txt");
    std::string msg = error_of<memfit::IoError>([&] { memfit::prepare_dataset(o); });
    EXPECT_NE(msg.find("missing.txt"), std::string::npos) << msg;

    write_bytes(path("empty.txt"), "");
    o.input = path("empty.txt");
    msg = error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(o); });
    EXPECT_NE(msg.find("empty.txt is empty: nothing to tokenize"), std::string::npos) << msg;

    write_bytes(path("tiny.txt"), "abc");                // 0.1 * 3 rounds to 0 validation tokens
    o.input = path("tiny.txt");
    EXPECT_THROW(memfit::prepare_dataset(o), memfit::ConfigError);

    write_bytes(path("ok.txt"), "plenty of text here");
    o.input = path("ok.txt");
    o.val_fraction = 1.0;
    EXPECT_THROW(memfit::prepare_dataset(o), memfit::ConfigError);
    o.val_fraction = 0.1;
    o.tokenizer = "wordpiece";
    EXPECT_THROW(memfit::prepare_dataset(o), memfit::ConfigError);
    EXPECT_FALSE(fs::exists(path("out/train.bin")));
}

}  // namespace
