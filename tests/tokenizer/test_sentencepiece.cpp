// SentencePiece tokenizers: a tiny LLaMA-style model (BPE, byte fallback, identity normalizer)
// trained at test time on part of the bundled corpus; round trips, streaming pieces, kinds and
// folders, typed errors, and `memfit prepare` with it.
#include "core/error.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "app/trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sentencepiece_trainer.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr int kVocab = 400;   // 256 byte pieces + 3 specials + the corpus's characters + merges

std::string slurp(const fs::path & path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// This process's scratch folder (CTest runs each test in its own process), removed at exit.
fs::path scratch_path() { return fs::temp_directory_path() / ("memfit_sp_test." + std::to_string(getpid())); }

fs::path scratch_root() {
    const fs::path p = scratch_path();
    fs::create_directories(p);
    return p;
}

class RemoveScratch : public ::testing::Environment {
public:
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(scratch_path(), ec);
    }
};
[[maybe_unused]] ::testing::Environment * const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

const std::string & corpus() {
    static const std::string text = slurp(fs::path(MEMFIT_DATA_DIR) / "tinyshakespeare.txt");
    return text;
}

// The first 64 KiB of the corpus train the model; text after that is unseen by it.
std::string training_text() { return corpus().substr(0, 64 * 1024); }
std::string unseen_text() { return corpus().substr(200 * 1000, 8 * 1024); }

// Trains the model once per process; returns the folder holding tokenizer.model.
const fs::path & model_dir() {
    static const fs::path dir = [] {
        const fs::path d = scratch_root() / "model";
        fs::remove_all(d);
        fs::create_directories(d);
        const fs::path input = d / "train.txt";
        std::ofstream(input, std::ios::binary) << training_text();
        const std::unordered_map<std::string, std::string> args = {
            {"input", input.string()},
            {"model_prefix", (d / "tokenizer").string()},
            {"model_type", "bpe"},
            {"vocab_size", std::to_string(kVocab)},
            {"byte_fallback", "true"},
            {"character_coverage", "1.0"},
            {"normalization_rule_name", "identity"},     // as LLaMA's tokenizer.model
            {"remove_extra_whitespaces", "false"},
            {"split_digits", "true"},
            {"num_threads", "2"},
            {"minloglevel", "2"},                        // quiet
        };
        const auto st = sentencepiece::SentencePieceTrainer::Train(args);
        EXPECT_TRUE(st.ok()) << st.ToString();
        fs::remove(input);
        return d;
    }();
    return dir;
}

fs::path model_file() { return model_dir() / "tokenizer.model"; }

std::string abs_model_file() { return fs::absolute(model_file()).lexically_normal().string(); }

const memfit::SentencePieceTokenizer & sp() {
    static const memfit::SentencePieceTokenizer tok(model_file().string());
    return tok;
}

template <class E, class F>
std::string expect_throw(F && f) {
    try {
        f();
    } catch (const E & e) {
        return e.what();
    } catch (const std::exception & e) {
        ADD_FAILURE() << "wrong exception type: " << e.what();
        return {};
    }
    ADD_FAILURE() << "no exception";
    return {};
}

int run_memfit(const std::string & args, std::string * err = nullptr) {
    const fs::path dir = scratch_root();
    const std::string err_file = (dir / "stderr.txt").string(), out_file = (dir / "stdout.txt").string();
    const std::string cmd = std::string(MEMFIT_BINARY) + " " + args + " >" + out_file + " 2>" + err_file;
    const int status = std::system(cmd.c_str());
    if (err) *err = slurp(err_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST(SentencePiece, VocabularyNameAndEndOfText) {
    EXPECT_EQ(sp().vocab_size(), kVocab);
    EXPECT_EQ(sp().name(), "sentencepiece:" + abs_model_file());
    EXPECT_EQ(sp().path(), abs_model_file());
    EXPECT_EQ(sp().eot_id(), 2);                           // the trainer's default </s>
    EXPECT_EQ(sp().decode({sp().eot_id()}), "");           // control pieces decode to nothing
    EXPECT_TRUE(sp().encode("").empty());
}

TEST(SentencePiece, RoundTripsCorpusTextWithoutBos) {
    const std::string texts[] = {training_text().substr(0, 4096), unseen_text(), "ROMEO:\n  x  \n\n"};
    for (const std::string & text : texts) {
        const auto ids = sp().encode(text);
        ASSERT_FALSE(ids.empty());
        if (text.size() > 1000) {
            EXPECT_LT(ids.size(), text.size() * 4 / 5);  // merges did something (~1.5 bytes per token here)
        }
        EXPECT_NE(ids.front(), 1) << "no BOS";             // <s> is id 1
        for (const int32_t id : ids) {
            ASSERT_GE(id, 0);
            ASSERT_LT(id, sp().vocab_size());
        }
        EXPECT_EQ(sp().decode(ids), text);
    }
}

TEST(SentencePiece, ByteFallbackCoversCharactersTheModelNeverSaw) {
    const std::string text = "caf\xc3\xa9 \xe2\x98\x83 \xe6\x97\xa5\xe6\x9c\xac\t{~}";   // café ☃ 日本 tab {~}
    const auto ids = sp().encode(text);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0) << "no <unk>";
    EXPECT_EQ(sp().decode(ids), text);
}

TEST(SentencePiece, DecodeTokenStreamsTheText) {
    // Concatenating decode_token continues a text: it keeps every piece's space (decode drops
    // the dummy-prefix space at the start of a text) and emits byte pieces one raw byte at a time.
    const std::string text = unseen_text().substr(0, 600) + " \xe2\x98\x83!";
    const auto ids = sp().encode(text);
    std::string streamed;
    for (const int32_t id : ids) streamed += sp().decode_token(id);
    EXPECT_EQ(streamed, " " + text);
    EXPECT_EQ(sp().decode_token(sp().eot_id()), "");

    // A prompt then its continuation, token by token, reads as the whole text.
    const auto prompt = sp().encode("ROMEO:");
    const auto whole = sp().encode("ROMEO: I will");
    ASSERT_GT(whole.size(), prompt.size());
    ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), whole.begin()));
    std::string out = "ROMEO:";
    for (size_t i = prompt.size(); i < whole.size(); ++i) out += sp().decode_token(whole[i]);
    EXPECT_EQ(out, "ROMEO: I will");
}

TEST(SentencePiece, DecodeRejectsIdsOutsideTheVocabulary) {
    const std::string a = expect_throw<memfit::FormatError>([] { sp().decode({5, kVocab}); });
    EXPECT_NE(a.find(std::to_string(kVocab)), std::string::npos) << a;
    EXPECT_NE(a.find("position 1"), std::string::npos) << a;
    expect_throw<memfit::FormatError>([] { sp().decode({-1}); });
    expect_throw<memfit::FormatError>([] { sp().decode_token(kVocab); });
}

TEST(SentencePiece, EncodesFromSeveralThreads) {
    const std::string text = unseen_text();
    const auto expected = sp().encode(text);
    std::vector<std::thread> threads;
    std::vector<int> ok(4, 0);
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            ok[size_t(t)] = sp().encode(text) == expected && sp().decode(expected) == text;
        });
    for (auto & th : threads) th.join();
    EXPECT_EQ(ok, std::vector<int>(4, 1));
}

TEST(SentencePiece, NameRoundTripsThroughMakeTokenizer) {
    const std::string text = unseen_text();
    const auto again = memfit::make_tokenizer(sp().name(), "/nonexistent");   // dir is only for gpt2
    EXPECT_EQ(again->name(), sp().name());
    EXPECT_EQ(again->vocab_size(), sp().vocab_size());
    EXPECT_EQ(again->eot_id(), sp().eot_id());
    EXPECT_EQ(again->encode(text), sp().encode(text));

    // A plain path ending in .model, absolute or relative to the current folder, is the same kind.
    const auto plain = memfit::make_tokenizer(model_file().string(), "/nonexistent");
    EXPECT_EQ(plain->name(), sp().name());
    const std::string rel = fs::relative(model_file()).string();
    ASSERT_FALSE(fs::path(rel).is_absolute());
    EXPECT_EQ(memfit::make_tokenizer(rel, "")->name(), sp().name());
    EXPECT_EQ(memfit::make_tokenizer("sentencepiece:" + rel, "")->name(), sp().name());

    EXPECT_EQ(memfit::sentencepiece_model_path(rel), abs_model_file());
    EXPECT_EQ(memfit::sentencepiece_model_path("sentencepiece:" + abs_model_file()), abs_model_file());
    EXPECT_EQ(memfit::sentencepiece_model_path("gpt2"), "");
    EXPECT_EQ(memfit::sentencepiece_model_path("bytes"), "");
    EXPECT_NE(std::string(memfit::tokenizer_kinds()).find("tokenizer.model"), std::string::npos);
    const std::string unknown = expect_throw<memfit::ConfigError>([] { memfit::make_tokenizer("llama", ""); });
    EXPECT_NE(unknown.find("sentencepiece"), std::string::npos) << unknown;
}

TEST(SentencePiece, TokenizerForFolder) {
    EXPECT_EQ(memfit::tokenizer_for_folder(model_dir().string()), "sentencepiece:" + abs_model_file());
    EXPECT_EQ(memfit::make_tokenizer(memfit::tokenizer_for_folder(model_dir().string()), "")->name(), sp().name());

    const fs::path none = scratch_root() / "no_tokenizer";
    fs::create_directories(none);
    EXPECT_EQ(memfit::tokenizer_for_folder(none.string()), "");
    std::ofstream(none / "tokenizer.json") << "{}";       // Hugging Face's format: taken before tokenizer.model
    EXPECT_EQ(memfit::tokenizer_for_folder(none.string()), (none / "tokenizer.json").lexically_normal().string());
    EXPECT_EQ(memfit::tokenizer_for_folder((scratch_root() / "nonexistent").string()), "");
}

TEST(SentencePiece, MissingFileIsAnIoErrorNamingThePath) {
    const std::string path = (scratch_root() / "absent" / "tokenizer.model").string();
    const std::string a = expect_throw<memfit::IoError>([&] { memfit::SentencePieceTokenizer t(path); });
    EXPECT_NE(a.find(path), std::string::npos) << a;
    EXPECT_EQ(a.find('\n'), std::string::npos) << a;
    const std::string b = expect_throw<memfit::IoError>([&] { memfit::make_tokenizer(path, ""); });
    EXPECT_NE(b.find(path), std::string::npos) << b;
}

TEST(SentencePiece, CorruptFileIsAFormatErrorNamingThePath) {
    const fs::path dir = scratch_root() / "corrupt";
    fs::create_directories(dir);
    const std::string path = (dir / "tokenizer.model").string();
    std::mt19937 rng(7);
    std::string junk(4096, '\0');
    for (char & c : junk) c = static_cast<char>(rng() & 0xff);
    std::ofstream(path, std::ios::binary) << junk;
    const std::string a = expect_throw<memfit::FormatError>([&] { memfit::SentencePieceTokenizer t(path); });
    EXPECT_NE(a.find(path), std::string::npos) << a;
    EXPECT_EQ(a.find('\n'), std::string::npos) << a;

    // A truncated real model, and an empty file, are corrupt too.
    const std::string good = slurp(model_file());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
    const std::string b = expect_throw<memfit::FormatError>([&] { memfit::make_tokenizer(path, ""); });
    EXPECT_NE(b.find(path), std::string::npos) << b;
    std::ofstream(path, std::ios::binary | std::ios::trunc).flush();
    const std::string c = expect_throw<memfit::FormatError>([&] { memfit::make_tokenizer(path, ""); });
    EXPECT_NE(c.find(path), std::string::npos) << c;
}

TEST(SentencePiece, DefaultPreparedDirIsAFolderName) {
    EXPECT_EQ(memfit::default_prepared_dir("gpt2"), "runs/data-gpt2");
    EXPECT_EQ(memfit::default_prepared_dir("bytes"), "runs/data-bytes");
    const std::string d = memfit::default_prepared_dir(sp().name());
    EXPECT_TRUE(std::regex_match(d, std::regex("runs/data-sp-[0-9a-f]{8}"))) << d;
    EXPECT_EQ(memfit::default_prepared_dir(model_file().string()), d);                   // plain path, same folder
    EXPECT_EQ(memfit::default_prepared_dir(fs::relative(model_file()).string()), d);
    EXPECT_NE(memfit::default_prepared_dir("sentencepiece:/elsewhere/tokenizer.model"), d);
}

TEST(SentencePiece, PrepareAndResolveDataKeepTheKind) {
    const fs::path dir = scratch_root() / "prepared";
    fs::remove_all(dir);
    const fs::path input = scratch_root() / "prep.txt";
    const std::string text = unseen_text();
    std::ofstream(input, std::ios::binary) << text;

    memfit::PrepareOptions o;
    o.input = input.string();
    o.out_dir = dir.string();
    o.tokenizer = fs::relative(model_file()).string();      // a relative plain path
    const memfit::PreparedData r = memfit::prepare_dataset(o);
    EXPECT_EQ(r.tokenizer, sp().name());
    EXPECT_EQ(r.vocab_size, uint32_t(kVocab));

    // The data meta keeps the kind; training recreates the tokenizer from it.
    const memfit::DataSource src = memfit::resolve_data(dir.string(), "", 0);
    EXPECT_EQ(src.tokenizer, sp().name());
    EXPECT_EQ(src.vocab_size, kVocab);
    const auto tok = memfit::make_tokenizer(src.tokenizer, "");
    std::vector<int32_t> ids;
    for (const auto & p : {r.train_path, r.val_path}) {
        const memfit::TokenFile f(p);
        for (uint64_t i = 0; i < f.size(); ++i) ids.push_back(f.token(i));
    }
    EXPECT_EQ(tok->decode(ids), text);
}

TEST(SentencePiece, PrepareCommandTakesATokenizerModelPath) {
    const fs::path dir = scratch_root() / "cli_prepared";
    fs::remove_all(dir);
    const fs::path input = scratch_root() / "cli.txt";
    const std::string text = unseen_text();
    std::ofstream(input, std::ios::binary) << text;
    std::string err;
    ASSERT_EQ(run_memfit("prepare --tokenizer " + model_file().string() + " --input " + input.string() + " --out " +
                             dir.string(), &err), 0) << err;
    const auto meta = nlohmann::json::parse(slurp(dir / "meta.json"));
    EXPECT_EQ(meta.at("tokenizer").get<std::string>(), sp().name());
    EXPECT_EQ(meta.at("vocab_size").get<int>(), kVocab);
    const memfit::TokenFile train((dir / "train.bin").string()), val((dir / "val.bin").string());
    EXPECT_EQ(train.vocab_size(), uint32_t(kVocab));
    EXPECT_EQ(train.size() + val.size(), sp().encode(text).size());

    // A missing model: one line on stderr naming it, a clean non-zero exit.
    const std::string missing = (scratch_root() / "nowhere" / "tokenizer.model").string();
    const int code = run_memfit("prepare --tokenizer " + missing + " --input " + input.string() + " --out " +
                                (scratch_root() / "cli_missing").string(), &err);
    EXPECT_NE(code, 0);
    EXPECT_LT(code, 128) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find(missing), std::string::npos) << err;
}
