// SentencePiece tokenizers: the tokenizer.model file LLaMA-style Hugging Face folders ship, read
// with the SentencePiece library (libsentencepiece).
//
// name() is "sentencepiece:<absolute path of the .model file>", which make_tokenizer takes back.
//
// encode adds no BOS (the trainer decides about that); eot_id() is the model's EOS id (-1 if it
// has none). Unlike the gpt2 and bytes tokenizers, SentencePiece is NOT lossless on arbitrary
// bytes: the model's normalizer may rewrite the text (NFKC for most models trained with the
// defaults; LLaMA's uses the identity), text it cannot cover becomes the unknown id unless the
// model was trained with byte_fallback (LLaMA's was), and invalid UTF-8 is not kept. With an
// identity normalizer and byte fallback, decode(encode(s)) == s for valid UTF-8 s.
#pragma once

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece { class SentencePieceProcessor; }

namespace memfit {

class SentencePieceTokenizer final : public Tokenizer {
public:
    // Loads a serialized SentencePiece model. Missing or unreadable file -> IoError; a file that
    // is not a SentencePiece model -> FormatError; both one line naming the path.
    explicit SentencePieceTokenizer(const std::string & model_path);
    ~SentencePieceTokenizer() override;
    SentencePieceTokenizer(const SentencePieceTokenizer &) = delete;
    SentencePieceTokenizer & operator=(const SentencePieceTokenizer &) = delete;

    std::string name() const override { return "sentencepiece:" + path_; }
    int vocab_size() const override { return vocab_; }
    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const std::vector<int32_t> & ids) const override;
    // The piece's own bytes: "▁" as a space even at the start, byte pieces as the raw byte
    // (possibly half a UTF-8 character), control pieces (BOS, EOS) as nothing.
    std::string decode_token(int32_t id) const override;
    int32_t eot_id() const override { return eot_; }

    const std::string & path() const { return path_; }   // absolute, normalised

private:
    void check_id(int32_t id, size_t pos) const;

    std::string path_;
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    int vocab_ = 0;
    int32_t eot_ = -1;
};

}  // namespace memfit
