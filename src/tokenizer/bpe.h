// GPT-2 byte-level BPE.
//
// encode: split the text into words with GPT-2's pre-tokenisation regex (PCRE2, UTF + UCP),
//   start each word as one symbol per byte and repeatedly merge the adjacent pair with the lowest
//   merge rank (all its occurrences, left to right) until no pair has a rank; the symbols are the
//   ids. Words are cached. Bytes the regex cannot match (invalid UTF-8) are encoded as words of
//   their own, so every byte string round-trips.
// decode: concatenate the bytes of each id.
//
// Internally everything is in raw bytes: encoder.json keys and vocab.bpe symbols are written in
// GPT-2's printable byte-to-unicode alphabet and are mapped back to bytes when loading.
#pragma once

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace memfit {

class Gpt2Bpe final : public Tokenizer {
public:
    // Reads encoder_json (token string -> id) and vocab_bpe (merges, one "a b" per line, by rank).
    Gpt2Bpe(const std::string & encoder_json, const std::string & vocab_bpe);
    ~Gpt2Bpe() override;
    Gpt2Bpe(const Gpt2Bpe &) = delete;
    Gpt2Bpe & operator=(const Gpt2Bpe &) = delete;

    std::string name() const override { return "gpt2"; }
    int vocab_size() const override { return static_cast<int>(id_to_bytes_.size()); }
    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const std::vector<int32_t> & ids) const override;
    int32_t eot_id() const override { return eot_id_; }

    // The byte -> code point table of GPT-2's byte-level alphabet (exposed for tests).
    static const std::vector<uint32_t> & byte_to_codepoint();

private:
    struct Merge { int32_t rank; int32_t merged; };
    struct Regex;                                          // PCRE2 objects (bpe.cpp)

    void encode_word(std::string_view word, std::vector<int32_t> & out) const;
    void bpe(std::string_view word, std::vector<int32_t> & out) const;

    std::vector<std::string> id_to_bytes_;                 // id -> raw bytes
    std::unordered_map<std::string, int32_t> bytes_to_id_;
    int32_t byte_id_[256] = {};                            // id of each single byte
    std::unordered_map<uint64_t, Merge> merges_;           // (left id << 32 | right id) -> merge
    int32_t eot_id_ = -1;
    std::unique_ptr<Regex> re_;

    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // word -> ids
};

}  // namespace memfit
