// Document files (token file version 2) and the data loader's rows of documents: padded one per
// row, or packed by best fit; truncation, dropped documents, the masks' -100 targets, document
// starts, resuming, and corrupt files.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "data_test.h"

namespace {

using memfit::DataLoader;
using memfit::TokenFile;
using memfit::test::DataTest;
using memfit::test::error_of;

// Documents of the given lengths; document d's tokens are 100*(d+1) + i, and every token after a
// document's first `prompt` ones is trained.
struct Docs {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> offsets{0};
    std::vector<uint8_t> mask;
};
Docs make_docs(const std::vector<int> & lengths, int prompt = 2) {
    Docs d;
    for (size_t k = 0; k < lengths.size(); ++k) {
        for (int i = 0; i < lengths[k]; ++i) {
            d.tokens.push_back(int32_t(100 * (k + 1) + i));
            d.mask.push_back(i >= prompt ? 1 : 0);
        }
        d.offsets.push_back(d.tokens.size());
    }
    return d;
}

class DocumentData : public DataTest {
protected:
    std::string write(const std::string & name, const Docs & d, int32_t pad = 7) {
        memfit::write_document_file(path(name), d.tokens, d.offsets, d.mask, 5000, pad);
        return path(name);
    }
};

// One batch of B rows of T: inputs, targets and document starts.
struct Rows {
    std::vector<int32_t> in, tg, ds;
};
Rows next(DataLoader & dl) {
    const size_t n = size_t(dl.batch_size()) * size_t(dl.seq_len());
    Rows r{std::vector<int32_t>(n), std::vector<int32_t>(n), std::vector<int32_t>(n, -1)};
    dl.next(r.in.data(), r.tg.data(), r.ds.data());
    return r;
}

TEST_F(DocumentData, FileRoundTripAndText) {
    const Docs d = make_docs({3, 0, 5});
    const std::string p = write("d.bin", d, 9);
    const TokenFile f(p);
    EXPECT_TRUE(f.documents());
    ASSERT_EQ(f.num_docs(), 3u);
    EXPECT_EQ(f.pad_id(), 9);
    EXPECT_EQ(f.doc_begin(1), 3u);
    EXPECT_EQ(f.doc_end(1), 3u);
    EXPECT_EQ(f.doc_end(2), 8u);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
        EXPECT_EQ(f.token(i), d.tokens[i]);
        EXPECT_EQ(f.trained(i), d.mask[i] != 0);
    }
    // A text file has no documents.
    memfit::write_token_file(path("t.bin"), d.tokens, 5000);
    EXPECT_FALSE(TokenFile(path("t.bin")).documents());
}

TEST_F(DocumentData, CorruptOrInconsistentFilesAreOneLine) {
    const Docs d = make_docs({4, 6});
    // Offsets that do not cut the tokens, or a mask of the wrong length: nothing written.
    EXPECT_THROW(memfit::write_document_file(path("x.bin"), d.tokens, std::vector<uint64_t>{0, 5}, d.mask, 5000, 0),
                 memfit::FormatError);
    EXPECT_THROW(memfit::write_document_file(path("x.bin"), d.tokens, d.offsets, std::vector<uint8_t>(3), 5000, 0),
                 memfit::FormatError);
    EXPECT_THROW(memfit::write_document_file(path("x.bin"), d.tokens, d.offsets, d.mask, 5000, 5000),
                 memfit::FormatError);
    EXPECT_FALSE(std::filesystem::exists(path("x.bin")));
    const std::string good = read_bytes(write("d.bin", d));
    auto damaged = [&](const std::string & bytes) {
        write_bytes(path("bad.bin"), bytes);
        return error_of<memfit::FormatError>([&] { TokenFile f(path("bad.bin")); });
    };
    // Truncated mask, a cut offset table, an offset past the tokens, a pad id outside the vocabulary.
    EXPECT_NE(damaged(good.substr(0, good.size() - 1)).find("loss mask"), std::string::npos);
    EXPECT_NE(damaged(good.substr(0, 32 + 20 + 4 + 8 + 4)).find("bad.bin"), std::string::npos);
    std::string far = good;
    const size_t off1 = 32 + 20 + 4 + 8 + 8;   // tokens (10 x 2 bytes), padding to 8, the count, offset 0
    far[off1] = char(0x70);
    EXPECT_NE(damaged(far).find("document offset 1"), std::string::npos);
    std::string pad = good;
    pad[20] = char(0xff);
    pad[21] = char(0xff);
    EXPECT_NE(damaged(pad).find("pad id"), std::string::npos);
}

TEST_F(DocumentData, PaddedRowsHoldOneDocumentEachWithMaskedTargets) {
    // Lengths 5, 12 (truncated to T+1 = 9 tokens), 1 (no pair: dropped), 2 (its one target is
    // prompt: dropped), 4.
    const std::string p = write("d.bin", make_docs({5, 12, 1, 2, 4}));
    DataLoader dl(p, 3, 8, 1);
    EXPECT_FALSE(dl.packing());
    EXPECT_EQ(dl.num_windows(), 3u);
    const auto & s = dl.document_stats();
    EXPECT_EQ(s.documents, 5u);
    EXPECT_EQ(s.truncated, 1u);
    EXPECT_EQ(s.dropped, 2u);
    EXPECT_EQ(s.pairs, 4u + 8u + 3u);
    EXPECT_EQ(s.trained, 3u + 7u + 2u);
    const Rows r = next(dl);
    std::set<int> seen;
    for (int b = 0; b < 3; ++b) {
        const int32_t * in = r.in.data() + b * 8, * tg = r.tg.data() + b * 8, * ds = r.ds.data() + b * 8;
        const int doc = in[0] / 100 - 1;
        seen.insert(doc);
        const int pairs = doc == 0 ? 4 : doc == 1 ? 8 : 3;
        for (int t = 0; t < 8; ++t) {
            if (t < pairs) {
                EXPECT_EQ(in[t], 100 * (doc + 1) + t);
                EXPECT_EQ(tg[t], t + 1 >= 2 ? 100 * (doc + 1) + t + 1 : -100);   // token 1 is prompt
                EXPECT_EQ(ds[t], 0);
            } else {
                EXPECT_EQ(in[t], 7);      // the pad id
                EXPECT_EQ(tg[t], -100);
                EXPECT_EQ(ds[t], pairs);  // the padding is a document of its own
            }
        }
    }
    EXPECT_EQ(seen, (std::set<int>{0, 1, 4}));
}

TEST_F(DocumentData, PackingFillsRowsByBestFitLongestFirst) {
    // Pairs: 7, 5, 3, 3, 2, 1 in rows of 8 -> best fit decreasing: {7, 1}, {5, 3}, {3, 2}.
    const std::string p = write("d.bin", make_docs({8, 6, 4, 4, 3, 2}, 1));
    DataLoader dl(p, 3, 8, 4, true);
    EXPECT_TRUE(dl.packing());
    ASSERT_EQ(dl.num_windows(), 3u);
    const Rows r = next(dl);
    std::multiset<std::vector<int>> rows;
    for (int b = 0; b < 3; ++b) {
        std::vector<int> docs;
        int at = 0;
        for (int t = 0; t < 8; ++t) {
            const int32_t * in = r.in.data() + b * 8, * ds = r.ds.data() + b * 8;
            if (t > 0 && ds[t] != ds[t - 1]) {
                EXPECT_EQ(ds[t], t);   // a new document starts where it says
                at = t;
            }
            EXPECT_EQ(ds[t], at);
            if (in[t] != 7 && (docs.empty() || ds[t] != ds[t - 1])) docs.push_back(in[t] / 100);
            if (in[t] != 7) {
                EXPECT_EQ(in[t] % 100, t - at);   // positions restart in each document
            }
        }
        rows.insert(docs);
    }
    EXPECT_EQ(rows, (std::multiset<std::vector<int>>{{1, 6}, {2, 3}, {4, 5}}));
    // Text files are windows already: packing them is refused.
    memfit::write_token_file(path("t.bin"), std::vector<int32_t>(100, 1), 5000);
    EXPECT_NE(error_of<memfit::ConfigError>([&] { DataLoader t(path("t.bin"), 2, 8, 1, true); }).find("--packing"),
              std::string::npos);
}

TEST_F(DocumentData, SeekResumesSmallFilesWrapAndNoTrainedTokensIsAConfigError) {
    const std::string p = write("d.bin", make_docs({9, 5, 6, 7, 3, 8, 4}));
    DataLoader a(p, 2, 8, 3, true), b(p, 2, 8, 3, true);
    for (int i = 0; i < 3; ++i) next(a);
    b.seek(a.epoch(), a.cursor());
    const Rows x = next(a), y = next(b);
    EXPECT_EQ(x.in, y.in);
    EXPECT_EQ(x.tg, y.tg);
    EXPECT_EQ(x.ds, y.ds);
    // More rows in a batch than the file has: the batch runs on into the next epochs.
    DataLoader big(p, 16, 8, 1, true);
    ASSERT_LT(big.num_windows(), 16u);
    next(big);
    EXPECT_GE(big.epoch(), 1u);
    const std::string none = write("n.bin", make_docs({3, 4}, 10));   // every target is prompt
    EXPECT_NE(error_of<memfit::ConfigError>([&] { DataLoader c(none, 1, 8, 1); }).find("trained token"),
              std::string::npos);
}

}  // namespace
