// Tokenizers turn text (UTF-8 bytes) into token ids and back.
//
//   gpt2   GPT-2's byte-level BPE (50257 ids, <|endoftext|> = 50256), read from
//          <dir>/gpt2-bpe/encoder.json and <dir>/gpt2-bpe/vocab.bpe        (bpe.h)
//   bytes  one id per byte, 256 ids, no end-of-text id
//   PATH/tokenizer.json (any PATH ending in .json)
//          a Hugging Face tokenizer.json of byte-level BPE (Llama 3, Qwen, GPT-NeoX, DeepSeek)
//          (hf_tokenizer.h); its name is the file's absolute path
//   sentencepiece:PATH (or a plain PATH ending in .model)
//          a SentencePiece model file, the tokenizer.model of LLaMA-style folders (sentencepiece.h)
//
// gpt2, tokenizer.json and bytes are lossless on arbitrary bytes (tokenizer.json's NFC leaves
// text that is not UTF-8 as it is, and changes only what NFC changes): decode(encode(s)) == s, even for text that is
// not valid UTF-8. SentencePiece is not (see sentencepiece.h). encode/decode are const and safe to
// call from several threads.
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

    virtual std::string name() const = 0;          // "gpt2", "bytes", "sentencepiece:/abs/tokenizer.model":
                                                   // the kind make_tokenizer takes
    virtual int vocab_size() const = 0;            // ids are in [0, vocab_size)
    virtual std::vector<int32_t> encode(std::string_view text) const = 0;
    // Throws FormatError for an id outside [0, vocab_size).
    virtual std::string decode(const std::vector<int32_t> & ids) const = 0;
    // The bytes one id adds when it follows earlier tokens, for streaming output: the prompt's
    // text followed by decode_token of each new id is the continued text. Same as decode({id})
    // except for tokenizers whose decode drops a leading space at the start of a text or needs
    // whole UTF-8 characters (SentencePiece). Throws FormatError like decode.
    virtual std::string decode_token(int32_t id) const { return decode({id}); }
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

// kind: "gpt2", "bytes", a PATH ending in ".json" (tokenizer.json), "sentencepiece:PATH" or a
// PATH ending in ".model" (a relative PATH is taken from the current folder); dir: the data
// folder holding gpt2-bpe/ (normally data_dir()).
// Unknown kind -> ConfigError; missing or corrupt tokenizer files -> IoError / FormatError.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string & kind, const std::string & dir);

// The kinds make_tokenizer accepts, for help texts: "gpt2|bytes|PATH/tokenizer.model".
const char * tokenizer_kinds();

// If kind names a SentencePiece model ("sentencepiece:PATH" or a PATH ending in ".model"): the
// model file's absolute, normalised path (the file need not exist). Otherwise empty.
std::string sentencepiece_model_path(const std::string & kind);

// The tokenizer kind for a Hugging Face model folder: "<abs folder>/tokenizer.json" if the folder
// has that file, else "sentencepiece:<abs folder>/tokenizer.model" if it has that one (older
// LLaMA-style folders), else empty.
std::string tokenizer_for_folder(const std::string & model_dir);

}  // namespace memfit
