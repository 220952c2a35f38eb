// Preference data for DPO: TRL's record forms through encode_preference (the masks: only each
// side's answer trains, the prompt identical in both; the implicit prompt's split), `memfit
// prepare --format preference` (pairs as consecutive documents, the validation split in pairs,
// skipped pairs, meta.json's format, one-line errors naming the line), and the data loader's pairs
// mode (batches of whole pairs, chosen first; shuffling keeps them together; resume; refusals; a
// pair with a side that trains nothing within --seq + 1 tokens dropped whole).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/instruct.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data_test.h"
#include "tokenizer/tokenizer.h"

namespace {

using memfit::DataLoader;
using memfit::Example;
using memfit::TokenFile;
using memfit::test::DataTest;
using memfit::test::error_of;
using ojson = nlohmann::ordered_json;

// 256 byte tokens, <|endoftext|> <|im_start|> <|im_end|> (256-258) and Qwen's ChatML template.
const std::string kTinyChat = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/tiny-chat/tokenizer.json";
constexpr int32_t kImEnd = 258;

ojson msg(const std::string & role, const std::string & content) { return {{"role", role}, {"content", content}}; }

class Preference : public DataTest {
protected:
    void SetUp() override {
        DataTest::SetUp();
        tok_ = memfit::make_tokenizer(kTinyChat, "");
        fmt_ = memfit::load_chat_format(kTinyChat, *tok_, "auto");
    }
    std::string text(const Example & e, bool trained) const {
        std::string s;
        for (size_t i = 0; i < e.tokens.size(); ++i)
            if ((e.trained[i] != 0) == trained) s += tok_->decode_token(e.tokens[i]);
        return s;
    }
    // The tokens before the first trained one (the prompt, as the model reads it).
    static std::vector<int32_t> prompt_tokens(const Example & e) {
        const auto first = std::find(e.trained.begin(), e.trained.end(), uint8_t{1}) - e.trained.begin();
        return {e.tokens.begin(), e.tokens.begin() + first};
    }
    memfit::PreferencePair encode(const ojson & r) const { return memfit::encode_preference(r, fmt_, *tok_, "t"); }
    std::string config_error(const ojson & r) const {
        return error_of<memfit::ConfigError>([&] { memfit::encode_preference(r, fmt_, *tok_, "prefs.jsonl line 7"); });
    }
    std::string write_lines(const std::string & name, const std::vector<ojson> & records) const {
        std::ofstream out(path(name));
        for (const auto & r : records) out << r.dump() << "\n";
        return path(name);
    }
    memfit::PrepareOptions options(const std::string & input, double val_fraction = 0.25) const {
        memfit::PrepareOptions o;
        o.input = input;
        o.out_dir = path("out");
        o.tokenizer = kTinyChat;
        o.format = "preference";
        o.val_fraction = val_fraction;
        return o;
    }

    std::unique_ptr<memfit::Tokenizer> tok_;
    memfit::ChatFormat fmt_;
};

// ---- records -----------------------------------------------------------------------------------

TEST_F(Preference, StandardFormTrainsTheAnswerAndEosAfterTheSamePrompt) {
    const auto p = encode({{"prompt", "The capital of France is"}, {"chosen", " Paris."}, {"rejected", " Rome."}});
    EXPECT_EQ(text(p.chosen, true), " Paris.<|im_end|>");
    EXPECT_EQ(text(p.rejected, true), " Rome.<|im_end|>");
    EXPECT_EQ(text(p.chosen, false), "The capital of France is");
    EXPECT_EQ(prompt_tokens(p.chosen), prompt_tokens(p.rejected));
    EXPECT_EQ(p.chosen.tokens.back(), kImEnd);
    // Each side is exactly the prompt-completion record encode_record takes.
    const Example pc = memfit::encode_record({{"prompt", "The capital of France is"}, {"completion", " Paris."}}, fmt_,
                                             *tok_, "t");
    EXPECT_EQ(p.chosen.tokens, pc.tokens);
    EXPECT_EQ(p.chosen.trained, pc.trained);
}

TEST_F(Preference, ConversationalFormTrainsTheAnswerTurnsOnly) {
    const ojson prompt = ojson::array({msg("system", "Be brief."), msg("user", "2+2?")});
    const auto p = encode({{"prompt", prompt},
                           {"chosen", ojson::array({msg("assistant", "4")})},
                           {"rejected", ojson::array({msg("assistant", "5")})}});
    EXPECT_EQ(text(p.chosen, true), "<think>\n\n</think>\n\n4<|im_end|>");
    EXPECT_EQ(text(p.rejected, true), "<think>\n\n</think>\n\n5<|im_end|>");
    const std::vector<int32_t> shared = prompt_tokens(p.chosen);
    EXPECT_EQ(shared, prompt_tokens(p.rejected));
    EXPECT_EQ(tok_->decode(shared), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                                    "<|im_start|>assistant\n");
    // The record's tools reach the template (its system turn lists them) on both sides.
    const ojson tools = ojson::array({{{"type", "function"}, {"function", {{"name", "add"}}}}});
    const auto t = encode({{"prompt", prompt}, {"chosen", ojson::array({msg("assistant", "4")})},
                           {"rejected", ojson::array({msg("assistant", "5")})}, {"tools", tools}});
    EXPECT_NE(text(t.chosen, false).find("\"name\": \"add\""), std::string::npos);
    EXPECT_EQ(prompt_tokens(t.chosen), prompt_tokens(t.rejected));
}

TEST_F(Preference, ImplicitPromptIsTheCommonFirstMessages) {
    // Two turns in common (an earlier answer among them: prompt, not trained), then the answers.
    const ojson common = ojson::array({msg("user", "Hi"), msg("assistant", "Hello!"), msg("user", "2+2?")});
    ojson chosen = common, rejected = common;
    chosen.push_back(msg("assistant", "4"));
    rejected.push_back(msg("assistant", "22"));
    const auto sides = memfit::preference_sides({{"chosen", chosen}, {"rejected", rejected}}, "t");
    EXPECT_EQ(sides.chosen["prompt"], common);
    EXPECT_EQ(sides.chosen["completion"], ojson::array({msg("assistant", "4")}));
    EXPECT_EQ(sides.rejected["prompt"], common);
    EXPECT_EQ(sides.rejected["completion"], ojson::array({msg("assistant", "22")}));
    const auto p = encode({{"chosen", chosen}, {"rejected", rejected}});
    EXPECT_EQ(text(p.chosen, true), "<think>\n\n</think>\n\n4<|im_end|>");   // "Hello!" is prompt
    EXPECT_EQ(text(p.rejected, true), "<think>\n\n</think>\n\n22<|im_end|>");
    EXPECT_EQ(prompt_tokens(p.chosen), prompt_tokens(p.rejected));
    // The same pair with an explicit prompt encodes the same.
    const auto e = encode({{"prompt", common}, {"chosen", ojson::array({msg("assistant", "4")})},
                           {"rejected", ojson::array({msg("assistant", "22")})}});
    EXPECT_EQ(e.chosen.tokens, p.chosen.tokens);
    EXPECT_EQ(e.rejected.trained, p.rejected.trained);

    // Nothing in common: each side is a conversation whose every assistant turn trains.
    const auto apart = memfit::preference_sides(
        {{"chosen", ojson::array({msg("user", "a"), msg("assistant", "b")})},
         {"rejected", ojson::array({msg("user", "c"), msg("assistant", "d")})}}, "t");
    EXPECT_EQ(apart.chosen, (ojson{{"messages", ojson::array({msg("user", "a"), msg("assistant", "b")})}}));
    // A side the common messages cover whole has nothing of its own to train.
    ojson longer = chosen;
    longer.push_back(msg("user", "and 3+3?"));
    const auto covered = encode({{"chosen", chosen}, {"rejected", longer}});
    EXPECT_TRUE(covered.chosen.tokens.empty());
    EXPECT_EQ(text(covered.rejected, true), "");   // its rest is a user turn
}

TEST_F(Preference, BadRecordsAreOneLineNamingTheLineWithAHint) {
    std::string e = config_error({{"prompt", "p"}, {"chosen", "c"}});
    EXPECT_NE(e.find("prefs.jsonl line 7: a preference record needs \"chosen\" and \"rejected\"; this one has no "
                     "\"rejected\" (its keys: prompt, chosen)"), std::string::npos) << e;
    e = config_error({{"prompt", "p"}, {"chosen", ojson::array({msg("assistant", "x")})}, {"rejected", "r"}});
    EXPECT_NE(e.find("prefs.jsonl line 7: \"prompt\", \"chosen\" and \"rejected\" must all be strings"),
              std::string::npos) << e;
    EXPECT_NE(e.find("\"prompt\" is a string and \"chosen\" is a list"), std::string::npos) << e;
    e = config_error({{"chosen", ojson::array({msg("assistant", "x")})}, {"rejected", 3}});
    EXPECT_NE(e.find("\"rejected\" is a number"), std::string::npos) << e;
    e = config_error({{"chosen", "The sky is blue."}, {"rejected", "The sky is green."}});
    EXPECT_NE(e.find("prefs.jsonl line 7: \"chosen\" and \"rejected\" are strings without a \"prompt\""),
              std::string::npos) << e;
    EXPECT_NE(e.find("add an explicit \"prompt\""), std::string::npos) << e;
    e = config_error({{"prompt", ojson::array({msg("user", "q")})}, {"chosen", ojson::array()},
                      {"rejected", ojson::array({msg("assistant", "x")})}});
    EXPECT_NE(e.find("\"chosen\" is an empty list"), std::string::npos) << e;
    EXPECT_NE(config_error(ojson::array({1, 2})).find("expected a JSON object"), std::string::npos);
    // A message without a role: encode_record's own check, with the line.
    e = config_error({{"prompt", ojson::array({{{"content", "q"}}})}, {"chosen", ojson::array({msg("assistant", "x")})},
                      {"rejected", ojson::array({msg("assistant", "y")})}});
    EXPECT_NE(e.find("prefs.jsonl line 7: prompt[0] has no \"role\""), std::string::npos) << e;
}

// ---- memfit prepare --format preference ----------------------------------------------------------

TEST_F(Preference, PrepareWritesPairsAsConsecutiveDocumentsAndSplitsByPairs) {
    std::vector<ojson> records;
    for (int k = 0; k < 8; ++k) {
        const std::string q = "Question " + std::to_string(k) + "?";
        if (k % 2 == 0)
            records.push_back({{"prompt", q}, {"chosen", " Yes " + std::to_string(k)}, {"rejected", " No"}});
        else
            records.push_back({{"prompt", ojson::array({msg("user", q)})},
                               {"chosen", ojson::array({msg("assistant", "Good " + std::to_string(k))})},
                               {"rejected", ojson::array({msg("assistant", "Bad")})}});
    }
    // Record 3 (line 4): the rejected side has no assistant turn, so the pair is left out.
    records[3] = {{"prompt", ojson::array({msg("user", "Q")})}, {"chosen", ojson::array({msg("assistant", "A")})},
                  {"rejected", ojson::array({msg("user", "not an answer")})}};
    const auto r = memfit::prepare_dataset(options(write_lines("prefs.jsonl", records)));
    EXPECT_TRUE(r.preference);
    EXPECT_TRUE(r.documents);
    EXPECT_EQ(r.records, 8u);
    EXPECT_EQ(r.skipped, 1u);
    EXPECT_EQ(r.pairs, 7u);
    const TokenFile train(r.train_path), val(r.val_path);
    // val: the last 0.25 of the 8 records, 2 pairs (records 6 and 7); train: the other 5 kept.
    ASSERT_EQ(train.num_docs(), 10u);
    ASSERT_EQ(val.num_docs(), 4u);
    EXPECT_EQ(train.pad_id(), 256);   // <|endoftext|>
    auto doc = [&](const TokenFile & f, uint64_t d) {
        Example e;
        for (uint64_t i = f.doc_begin(d); i < f.doc_end(d); ++i) {
            e.tokens.push_back(f.token(i));
            e.trained.push_back(f.trained(i) ? 1 : 0);
        }
        return e;
    };
    const int kept[] = {0, 1, 2, 4, 5};   // records in the training file, in order
    uint64_t trained = 0;
    for (int k = 0; k < 5; ++k) {
        SCOPED_TRACE(k);
        const Example c = doc(train, 2 * k), rj = doc(train, 2 * k + 1);
        const auto want = encode(records[kept[k]]);
        EXPECT_EQ(c.tokens, want.chosen.tokens);            // chosen first
        EXPECT_EQ(c.trained, want.chosen.trained);
        EXPECT_EQ(rj.tokens, want.rejected.tokens);
        EXPECT_EQ(prompt_tokens(c), prompt_tokens(rj));
        EXPECT_NE(tok_->decode(prompt_tokens(c)).find("Question " + std::to_string(kept[k])), std::string::npos);
        trained += std::count(c.trained.begin(), c.trained.end(), 1);
        trained += std::count(rj.trained.begin(), rj.trained.end(), 1);
    }
    EXPECT_EQ(text(doc(val, 0), true), " Yes 6<|im_end|>");
    EXPECT_EQ(text(doc(val, 3), true), "<think>\n\n</think>\n\nBad<|im_end|>");
    for (uint64_t d = 0; d < 4; ++d) {
        const Example v = doc(val, d);
        trained += std::count(v.trained.begin(), v.trained.end(), 1);
    }
    EXPECT_EQ(r.trained_tokens, trained);

    const auto meta = nlohmann::json::parse(read_bytes(r.meta_path));
    EXPECT_EQ(meta["format"], "preference");
    EXPECT_EQ(meta["pairs"], 7);
    EXPECT_EQ(meta["records"], 8);
    EXPECT_EQ(meta["skipped"], 1);
    EXPECT_EQ(meta["trained_tokens"], r.trained_tokens);
    EXPECT_EQ(meta["train_tokens"], train.size());
    EXPECT_EQ(meta["val_tokens"], val.size());
    EXPECT_NE(meta["chat_template"].get<std::string>().find("tokenizer_config.json"), std::string::npos);
    EXPECT_EQ(memfit::prepared_format(r.meta_path), "preference");
}

TEST_F(Preference, PrepareErrorsNameTheLineAndAutoNeverPicksPreference) {
    const ojson good = {{"prompt", "q"}, {"chosen", " a"}, {"rejected", " b"}};
    const std::string bad = write_lines("prefs.jsonl", {good, good, {{"prompt", "q"}, {"chosen", " a"}}, good});
    std::string e = error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(options(bad)); });
    EXPECT_NE(e.find("prefs.jsonl line 3: a preference record needs \"chosen\" and \"rejected\""), std::string::npos)
        << e;
    // Implicit prompt with text sides, on line 2.
    const std::string text = write_lines("text.jsonl", {good, {{"chosen", "x y"}, {"rejected", "x z"}}, good});
    e = error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(options(text)); });
    EXPECT_NE(e.find("text.jsonl line 2: \"chosen\" and \"rejected\" are strings without a \"prompt\""),
              std::string::npos) << e;
    // Too few records for a pair in each split; every pair skipped.
    e = error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(options(write_lines("one.jsonl", {good}))); });
    EXPECT_NE(e.find("1 records"), std::string::npos) << e;
    const ojson empty = {{"prompt", ojson::array({msg("user", "q")})}, {"chosen", ojson::array({msg("user", "x")})},
                         {"rejected", ojson::array({msg("assistant", "y")})}};
    const std::string skipped = write_lines("e.jsonl", {good, empty});
    e = error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(options(skipped, 0.5)); });
    EXPECT_NE(e.find("the validation split is empty"), std::string::npos) << e;
    EXPECT_FALSE(std::filesystem::exists(path("out/train.bin")));
    // auto reads a .jsonl as instruction records, which a preference record is not.
    memfit::PrepareOptions o = options(write_lines("ok.jsonl", {good, good, good, good}));
    o.format = "auto";
    e = error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(o); });
    EXPECT_NE(e.find("ok.jsonl line 1: expected \"messages\""), std::string::npos) << e;
    o.format = "jsonl";
    EXPECT_THROW(memfit::prepare_dataset(o), memfit::ConfigError);
    o.format = "dpo";
    EXPECT_NE(error_of<memfit::ConfigError>([&] { memfit::prepare_dataset(o); }).find("preference"), std::string::npos);
}

TEST_F(Preference, PreparedFormatReadsMetaJson) {
    write_bytes(path("in.txt"), "To be, or not to be, that is the question.\n");
    memfit::PrepareOptions o;
    o.input = path("in.txt");
    o.out_dir = path("text");
    o.tokenizer = "bytes";
    EXPECT_EQ(memfit::prepared_format(memfit::prepare_dataset(o).meta_path), "text");
    write_bytes(path("old.json"), R"({"tokenizer": "gpt2"})");
    EXPECT_EQ(memfit::prepared_format(path("old.json")), "");
    EXPECT_THROW(memfit::prepared_format(path("missing.json")), memfit::IoError);
    write_bytes(path("bad.json"), "{not json");
    EXPECT_THROW(memfit::prepared_format(path("bad.json")), memfit::FormatError);
}

// ---- the data loader's pairs mode ---------------------------------------------------------------

// Pair k: both sides start with the same `prompt` tokens 100k + 1000 + i; chosen's answer is
// 100k + 1050 + i, rejected's 100k + 1070 + i (so a token tells its pair and side), trained.
struct PairDocs {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> offsets{0};
    std::vector<uint8_t> mask;
    void side(int k, int prompt, int answer, int base, bool trained = true) {
        for (int i = 0; i < prompt; ++i) {
            tokens.push_back(1000 + 100 * k + i);
            mask.push_back(0);
        }
        for (int i = 0; i < answer; ++i) {
            tokens.push_back(1000 + 100 * k + base + i);
            mask.push_back(trained ? 1 : 0);
        }
        offsets.push_back(tokens.size());
    }
};
PairDocs make_pairs(int n, int prompt = 3, int answer = 4) {
    PairDocs d;
    for (int k = 0; k < n; ++k) {
        d.side(k, prompt, answer + k % 3, 50);
        d.side(k, prompt, answer + (k + 1) % 3, 70);
    }
    return d;
}

class PairLoader : public DataTest {
protected:
    std::string write(const std::string & name, const PairDocs & d) {
        memfit::write_document_file(path(name), d.tokens, d.offsets, d.mask, 5000, 7);
        return path(name);
    }
    struct Rows {
        std::vector<int32_t> in, tg, ds;
    };
    static Rows next(DataLoader & dl) {
        const size_t n = size_t(dl.batch_size()) * size_t(dl.seq_len());
        Rows r{std::vector<int32_t>(n), std::vector<int32_t>(n), std::vector<int32_t>(n, -1)};
        dl.next(r.in.data(), r.tg.data(), r.ds.data());
        return r;
    }
    // Each row's (pair, side) from its tokens: side 0 chosen, 1 rejected; checks the row's
    // layout (prompt, answer, padding) on the way: a target trains exactly where it is an answer
    // token.
    static std::vector<std::pair<int, int>> rows_of(const Rows & r, int B, int T) {
        std::vector<std::pair<int, int>> out;
        for (int b = 0; b < B; ++b) {
            const int32_t * in = r.in.data() + b * T, * tg = r.tg.data() + b * T;
            const int k = (in[0] - 1000) / 100;
            int side = -1, t = 0;
            for (; t < T && in[t] != 7; ++t) {
                const int local = in[t] - 1000 - 100 * k;
                EXPECT_GE(local, 0);
                if (local >= 50) side = local >= 70 ? 1 : 0;
                if (tg[t] != -100) {
                    EXPECT_GE(tg[t] - 1000 - 100 * k, 50) << "row " << b << " position " << t;
                } else if (t + 1 < T && in[t + 1] != 7) {   // an untrained target inside the row: a prompt token
                    EXPECT_LT(in[t + 1] - 1000 - 100 * k, 50) << "row " << b << " position " << t;
                }
            }
            for (; t < T; ++t) EXPECT_EQ(tg[t], -100);
            out.emplace_back(k, side);
        }
        return out;
    }
};

TEST_F(PairLoader, BatchesHoldWholePairsChosenFirstInTheShuffledPairOrder) {
    const std::string p = write("p.bin", make_pairs(6));
    DataLoader dl(p, 4, 16, 11, false, true);
    EXPECT_TRUE(dl.pairs());
    ASSERT_EQ(dl.num_windows(), 12u);
    const std::vector<uint64_t> order = DataLoader::epoch_order(6, 11, 0);
    std::vector<uint64_t> seen;
    for (int batch = 0; batch < 3; ++batch) {
        const Rows r = next(dl);
        const auto rows = rows_of(r, 4, 16);
        for (int i = 0; i < 2; ++i) {
            EXPECT_EQ(rows[2 * i].first, rows[2 * i + 1].first);   // one pair
            EXPECT_EQ(rows[2 * i].second, 0);                      // chosen
            EXPECT_EQ(rows[2 * i + 1].second, 1);                  // then rejected
            // The same prompt tokens in both rows.
            EXPECT_TRUE(std::equal(r.in.begin() + 2 * i * 16, r.in.begin() + 2 * i * 16 + 3,
                                   r.in.begin() + (2 * i + 1) * 16));
            seen.push_back(uint64_t(rows[2 * i].first));
        }
        EXPECT_EQ(dl.cursor() % 2, 0u);
    }
    EXPECT_EQ(seen, order);                                        // the pairs, shuffled
    EXPECT_NE(seen, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(dl.epoch(), 1u);
    EXPECT_EQ(dl.cursor(), 0u);
    const auto & s = dl.document_stats();
    EXPECT_EQ(s.documents, 12u);
    EXPECT_EQ(s.dropped, 0u);
}

TEST_F(PairLoader, WindowsNameEachRowAndFillWindowsGivesTheSameRows) {
    // next() says which window each row holds (a per-window table, such as DPO's reference
    // log-probabilities, is read with it): 2p and 2p+1 for pair p, and fill_windows gives those
    // rows again without moving the loader.
    const std::string p = write("p.bin", make_pairs(5));
    DataLoader dl(p, 4, 16, 9, false, true);
    const size_t n = 4 * 16;
    std::vector<int32_t> in(n), tg(n), ds(n);
    std::vector<uint64_t> windows(4, 99);
    dl.next(in.data(), tg.data(), ds.data(), windows.data());
    const auto rows = rows_of(Rows{in, tg, ds}, 4, 16);
    for (int b = 0; b < 4; ++b) {
        EXPECT_EQ(windows[b], uint64_t(2 * rows[b].first + rows[b].second)) << b;
        std::vector<int32_t> in1(16), tg1(16), ds1(16);
        dl.fill_windows(windows[b], 1, in1.data(), tg1.data(), ds1.data());
        EXPECT_TRUE(std::equal(in1.begin(), in1.end(), in.begin() + b * 16));
        EXPECT_TRUE(std::equal(tg1.begin(), tg1.end(), tg.begin() + b * 16));
        EXPECT_TRUE(std::equal(ds1.begin(), ds1.end(), ds.begin() + b * 16));
    }
    EXPECT_EQ(dl.cursor(), 4u);
    // Windows in file order: pair 0 then pair 1.
    std::vector<int32_t> all(4 * 16), alltg(4 * 16);
    dl.fill_windows(0, 4, all.data(), alltg.data());
    EXPECT_EQ(rows_of(Rows{all, alltg, {}}, 4, 16), (std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
}

TEST_F(PairLoader, ShufflingKeepsPairsTogetherOverEpochsAndBatchesThatWrap) {
    // 5 pairs, batches of 4 rows: every other batch runs on into the next epoch's order.
    const std::string p = write("p.bin", make_pairs(5));
    DataLoader dl(p, 4, 16, 3, false, true);
    std::vector<std::vector<int>> epochs(4);
    for (int batch = 0; batch < 9; ++batch) {
        const uint64_t e = dl.epoch();
        const size_t c = dl.cursor();
        const auto rows = rows_of(next(dl), 4, 16);
        for (int i = 0; i < 2; ++i) {
            ASSERT_EQ(rows[2 * i].first, rows[2 * i + 1].first);
            ASSERT_EQ(rows[2 * i].second, 0);
            ASSERT_EQ(rows[2 * i + 1].second, 1);
            epochs[e + (c + 2 * size_t(i) >= 10 ? 1 : 0)].push_back(rows[2 * i].first);
        }
    }
    for (int e = 0; e < 3; ++e) {
        std::vector<int> sorted = epochs[e];
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4})) << "epoch " << e;   // each pair once an epoch
    }
    EXPECT_NE(epochs[0], epochs[1]);
}

TEST_F(PairLoader, SeekResumesTheSameBatchesAndRefusesAnOddCursor) {
    const std::string p = write("p.bin", make_pairs(7));
    DataLoader a(p, 4, 16, 5, false, true), b(p, 4, 16, 5, false, true);
    for (int i = 0; i < 5; ++i) next(a);   // into the second epoch
    b.seek(a.epoch(), a.cursor());
    EXPECT_EQ(a.epoch(), 1u);
    for (int i = 0; i < 4; ++i) {
        const Rows x = next(a), y = next(b);
        EXPECT_EQ(x.in, y.in);
        EXPECT_EQ(x.tg, y.tg);
        EXPECT_EQ(x.ds, y.ds);
    }
    const std::string e = error_of<memfit::ConfigError>([&] { b.seek(0, 3); });
    EXPECT_NE(e.find("cannot resume at window 3 of epoch 0"), std::string::npos) << e;
    EXPECT_NE(e.find("even"), std::string::npos) << e;
}

TEST_F(PairLoader, RefusesOddBatchesPackingTextAndAnOddDocumentCount) {
    const std::string p = write("p.bin", make_pairs(4));
    std::string e = error_of<memfit::ConfigError>([&] { DataLoader dl(p, 3, 16, 1, false, true); });
    EXPECT_NE(e.find("a batch of B rows holds B/2 pairs"), std::string::npos) << e;
    EXPECT_NE(e.find("B must be even"), std::string::npos) << e;
    e = error_of<memfit::ConfigError>([&] { DataLoader dl(p, 4, 16, 1, true, true); });
    EXPECT_NE(e.find("--packing"), std::string::npos) << e;
    EXPECT_NE(e.find("preference pairs are rows of their own"), std::string::npos) << e;
    memfit::write_token_file(path("t.bin"), std::vector<int32_t>(100, 1), 5000);
    e = error_of<memfit::ConfigError>([&] { DataLoader dl(path("t.bin"), 4, 16, 1, false, true); });
    EXPECT_NE(e.find("holds text"), std::string::npos) << e;
    PairDocs odd = make_pairs(2);
    odd.side(2, 3, 4, 50);   // a chosen side without its rejected one
    const std::string o = write("odd.bin", odd);
    e = error_of<memfit::FormatError>([&] { DataLoader dl(o, 2, 16, 1, false, true); });
    EXPECT_NE(e.find("5 documents, an odd number"), std::string::npos) << e;
    // The same file without pairs mode: plain documents.
    EXPECT_EQ(DataLoader(o, 2, 16, 1).num_windows(), 5u);
}

// TRL's keep_end truncation of the prompt: a pair too long for T+1 tokens leaves out its prompt's
// first tokens, the same on both sides, before any answer token is cut.
TEST_F(PairLoader, ALongPromptLosesItsStartBeforeTheAnswersDo) {
    PairDocs d;
    d.side(0, 10, 4, 50);   // 14 tokens
    d.side(0, 10, 5, 70);   // 15: 6 over T+1 = 9
    d.side(1, 3, 4, 50);    // fits: nothing cut
    d.side(1, 3, 5, 70);
    d.side(2, 3, 12, 50);   // over by 6, but its prompt can give only 2: the answer is cut too
    d.side(2, 3, 4, 70);
    const std::string p = write("long.bin", d);
    DataLoader dl(p, 2, 8, 1, false, true);
    const auto & s = dl.document_stats();
    EXPECT_EQ(s.dropped, 0u);
    EXPECT_EQ(s.prompt_cut, 4u);
    EXPECT_EQ(s.truncated, 1u);   // pair 2's chosen, after its prompt's 2 tokens
    std::vector<int32_t> in(16), tg(16);
    for (size_t w = 0; w < 6; w += 2) {
        dl.fill_windows(w, 2, in.data(), tg.data());
        const int k = (in[0] - 1000) / 100;
        const int cut = k == 0 ? 6 : k == 2 ? 2 : 0;
        for (int r = 0; r < 2; ++r) EXPECT_EQ(in[size_t(r) * 8], 1000 + 100 * k + cut) << "pair " << k;
        int trained[2] = {0, 0};
        for (int r = 0; r < 2; ++r)
            for (int t = 0; t < 8; ++t) trained[r] += tg[size_t(r * 8 + t)] != -100;
        if (k == 0) {   // both answers whole, after the prompt's last 4 tokens (the same on both sides)
            EXPECT_EQ(trained[0], 4);
            EXPECT_EQ(trained[1], 5);
            for (int t = 0; t < 4; ++t) EXPECT_EQ(in[size_t(t)], in[size_t(8 + t)]);
        }
        if (k == 2) {   // the prompt's last token, then 8 answer targets
            EXPECT_EQ(trained[0], 8);
        }
    }
}

TEST_F(PairLoader, APairWithASideThatTrainsNothingIsDroppedWhole) {
    PairDocs d;
    d.side(0, 3, 4, 50);
    d.side(0, 3, 4, 70);
    d.side(1, 3, 4, 50);
    d.side(1, 3, 4, 70, false);    // rejected: nothing trained
    d.side(2, 12, 4, 50);          // chosen: its answer starts past T+1 = 9 tokens (truncated away)
    d.side(2, 3, 4, 70);
    d.side(3, 3, 9, 50);           // chosen: 12 tokens: 2 of its prompt's left out, then truncated to 9
    d.side(3, 3, 4, 70);           // and the same 2 of the rejected side's
    const std::string p = write("p.bin", d);
    DataLoader dl(p, 2, 8, 1, false, true);
    const auto & s = dl.document_stats();
    EXPECT_EQ(s.documents, 8u);
    EXPECT_EQ(s.dropped, 4u);       // both sides of pairs 1 and 2
    EXPECT_EQ(s.truncated, 2u);     // pair 2's chosen (dropped) and pair 3's
    EXPECT_EQ(s.prompt_cut, 4u);    // both sides of pairs 2 and 3
    ASSERT_EQ(dl.num_windows(), 4u);
    EXPECT_EQ(s.pairs, 6u + 6u + 8u + 4u);
    EXPECT_EQ(s.trained, 4u + 4u + 8u + 4u);
    std::set<int> kept;
    for (int batch = 0; batch < 4; ++batch) {
        const auto rows = rows_of(next(dl), 2, 8);
        EXPECT_EQ(rows[0].first, rows[1].first);
        EXPECT_EQ(rows[0].second, 0);
        EXPECT_EQ(rows[1].second, 1);
        kept.insert(rows[0].first);
    }
    EXPECT_EQ(kept, (std::set<int>{0, 3}));
    // No pair left: one line saying so.
    PairDocs none;
    none.side(0, 3, 4, 50, false);
    none.side(0, 3, 4, 70);
    const std::string n = write("n.bin", none);
    const std::string e = error_of<memfit::ConfigError>([&] { DataLoader x(n, 2, 8, 1, false, true); });
    EXPECT_NE(e.find("none of its 1 preference pairs has a trained token on both sides"), std::string::npos) << e;
}

TEST_F(Preference, PreparedPairsLoadAsPairsOfRowsSharingThePrompt) {
    std::vector<ojson> records;
    for (int k = 0; k < 6; ++k)
        records.push_back({{"prompt", ojson::array({msg("user", "Say " + std::to_string(k))})},
                           {"chosen", ojson::array({msg("assistant", std::to_string(k))})},
                           {"rejected", ojson::array({msg("assistant", "no, " + std::to_string(k + 1))})}});
    const auto r = memfit::prepare_dataset(options(write_lines("prefs.jsonl", records), 0.2));
    DataLoader dl(r.train_path, 4, 64, 1, false, true);
    ASSERT_EQ(dl.num_windows(), 10u);
    std::vector<int32_t> in(4 * 64), tg(4 * 64);
    dl.next(in.data(), tg.data());
    for (int i = 0; i < 2; ++i) {
        const int32_t * c = in.data() + 2 * i * 64, * rj = in.data() + (2 * i + 1) * 64;
        const int32_t * ct = tg.data() + 2 * i * 64, * rt = tg.data() + (2 * i + 1) * 64;
        // The untrained prompt (targets -100 up to the answer) is the same in both rows.
        int first = 0;
        while (ct[first] == -100) ++first;
        EXPECT_GT(first, 5);
        EXPECT_TRUE(std::equal(c, c + first, rj));
        EXPECT_EQ(rt[first - 1], -100);
        std::string chosen, rejected;
        for (int t = 0; t < 64; ++t) {
            if (ct[t] >= 0) chosen += tok_->decode_token(ct[t]);
            if (rt[t] >= 0) rejected += tok_->decode_token(rt[t]);
        }
        EXPECT_TRUE(chosen.ends_with("<|im_end|>")) << chosen;
        EXPECT_NE(rejected.find("no, "), std::string::npos) << rejected;
        EXPECT_EQ(chosen.find("no, "), std::string::npos) << chosen;
    }
}

}  // namespace
