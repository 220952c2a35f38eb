#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/bpe.h"

#include <fmt/format.h>

namespace memfit {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
}

std::string ByteTokenizer::decode(const std::vector<int32_t> & ids) const {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] > 255) {
            throw FormatError(fmt::format("token id {} at position {} is outside the bytes vocabulary [0, 256)",
                                          ids[i], i));
        }
        out[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return out;
}

const char * tokenizer_kinds() { return "gpt2|bytes"; }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string & kind, const std::string & dir) {
    if (kind == "gpt2") return std::make_unique<Gpt2Bpe>(dir + "/gpt2-bpe/encoder.json", dir + "/gpt2-bpe/vocab.bpe");
    if (kind == "bytes") return std::make_unique<ByteTokenizer>();
    throw ConfigError(fmt::format("unknown tokenizer '{}'; valid tokenizers: gpt2, bytes", kind));
}

}  // namespace memfit
