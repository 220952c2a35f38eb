// Byte-level BPE: GPT-2's, and the Hugging Face tokenizer.json files of Llama 3, Qwen 2/2.5/3,
// GPT-NeoX and DeepSeek (hf_tokenizer.h reads those into the same parts).
//
// encode: the added tokens (special tokens such as <|im_start|>) are matched in the raw text
//   first, longest first; each stretch between them is NFC-normalised when the file asks for it,
//   split by the pre-tokenisation regexes (PCRE2, UTF + UCP; each regex splits the pieces of the
//   one before, "Isolated": a match and the text between matches are pieces), and each piece,
//   started as one symbol per byte, repeatedly merges the adjacent pair with the lowest merge
//   rank (all its occurrences, left to right) until no pair has a rank; the symbols are the ids.
//   Pieces are cached. Bytes no regex matches (invalid UTF-8) are pieces of their own, so every
//   byte string round-trips.
// decode: concatenate the bytes of each id (an added token's: its text).
//
// Internally everything is in raw bytes: the files write tokens in GPT-2's printable
// byte-to-unicode alphabet, mapped back to bytes when loading.
#pragma once

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace memfit {

// What a byte-level BPE tokenizer is made of, in raw bytes.
struct BpeParts {
    std::string name;                                   // the kind make_tokenizer takes back
    std::string source;                                 // the file, for error messages
    std::vector<std::string> id_to_bytes;               // id -> raw bytes ("" for an unused id)
    std::vector<std::pair<std::string, std::string>> merges;   // in rank order, raw bytes
    std::vector<std::string> patterns;                  // pre-tokenisation regexes, applied in turn
    std::vector<std::pair<std::string, int32_t>> added; // added tokens, matched in the raw text first
    bool ignore_merges = false;                         // a piece that is itself a token is that token
    bool nfc = false;                                   // NFC-normalise the text between added tokens
    int32_t eot_id = -1;
};

// GPT-2's pre-tokenisation: contractions, letters, numbers, other symbols (each optionally after
// one space), whitespace not followed by a non-space, remaining whitespace.
extern const char * const kGpt2Pattern;

// GPT-2's files: encoder.json (token string -> id) and vocab.bpe (merges, one "a b" per line).
BpeParts read_gpt2_files(const std::string & encoder_json, const std::string & vocab_bpe);

// A tokenizer file's bytes; IoError naming it when it cannot be read.
std::string read_tokenizer_file(const std::string & path);

// Token strings of the files -> raw bytes; false if `s` is not in GPT-2's byte alphabet.
bool byte_alphabet_to_bytes(std::string_view s, std::string & out);

class ByteLevelBpe final : public Tokenizer {
public:
    // Throws FormatError when the merges use or make tokens the vocabulary lacks, or a byte has
    // no token; Error when a pattern does not compile.
    explicit ByteLevelBpe(BpeParts parts);
    ~ByteLevelBpe() override;
    ByteLevelBpe(const ByteLevelBpe &) = delete;
    ByteLevelBpe & operator=(const ByteLevelBpe &) = delete;

    std::string name() const override { return name_; }
    int vocab_size() const override { return static_cast<int>(id_to_bytes_.size()); }
    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const std::vector<int32_t> & ids) const override;
    int32_t eot_id() const override { return eot_id_; }

    // The byte -> code point table of GPT-2's byte-level alphabet (exposed for tests).
    static const std::vector<uint32_t> & byte_to_codepoint();

private:
    struct Merge { int32_t rank; int32_t merged; };
    struct Regex;                                          // PCRE2 objects (bpe.cpp)

    void encode_text(std::string_view text, std::vector<int32_t> & out) const;   // between added tokens
    void split(std::string_view text, size_t level, std::vector<int32_t> & out) const;
    void encode_word(std::string_view word, std::vector<int32_t> & out) const;
    void bpe(std::string_view word, std::vector<int32_t> & out) const;

    std::string name_;
    std::vector<std::string> id_to_bytes_;                 // id -> raw bytes
    std::unordered_map<std::string, int32_t> bytes_to_id_; // the model's tokens (not the added ones)
    int32_t byte_id_[256] = {};                            // id of each single byte
    std::unordered_map<uint64_t, Merge> merges_;           // (left id << 32 | right id) -> merge
    std::vector<std::pair<std::string, int32_t>> added_;   // longest first
    bool starts_added_[256] = {};                          // bytes an added token starts with
    bool ignore_merges_ = false, nfc_ = false;
    int32_t eot_id_ = -1;
    std::vector<std::unique_ptr<Regex>> res_;

    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // word -> ids
};

}  // namespace memfit
