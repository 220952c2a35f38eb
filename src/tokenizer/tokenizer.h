// Tokenizers turn text (UTF-8 bytes) into token ids and back.
//
//   gpt2   GPT-2's byte-level BPE (50257 ids, <|endoftext|> = 50256), read from
//          <dir>/gpt2-bpe/encoder.json and <dir>/gpt2-bpe/vocab.bpe        (bpe.h)
//   bytes  one id per byte, 256 ids, no end-of-text id
//
// Every tokenizer is lossless on arbitrary bytes: decode(encode(s)) == s, even for text that is
// not valid UTF-8. encode/decode are const and safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace memfit {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    virtual std::string name() const = 0;          // "gpt2", "bytes": the kind make_tokenizer takes
    virtual int vocab_size() const = 0;            // ids are in [0, vocab_size)
    virtual std::vector<int32_t> encode(std::string_view text) const = 0;
    // Throws FormatError for an id outside [0, vocab_size).
    virtual std::string decode(const std::vector<int32_t> & ids) const = 0;
    virtual int32_t eot_id() const = 0;            // end-of-text id, -1 if the tokenizer has none
};

// One id per byte value; vocab 256.
class ByteTokenizer final : public Tokenizer {
public:
    std::string name() const override { return "bytes"; }
    int vocab_size() const override { return 256; }
    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const std::vector<int32_t> & ids) const override;
    int32_t eot_id() const override { return -1; }
};

// kind: "gpt2" or "bytes"; dir: the data folder holding gpt2-bpe/ (normally data_dir()).
// Unknown kind -> ConfigError; missing or corrupt tokenizer files -> IoError / FormatError.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string & kind, const std::string & dir);

// The kinds make_tokenizer accepts, for help texts: "gpt2|bytes".
const char * tokenizer_kinds();

}  // namespace memfit
