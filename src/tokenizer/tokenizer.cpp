#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece.h"

#include <fmt/format.h>

#include <filesystem>
#include <string_view>
#include <system_error>

namespace memfit {

namespace fs = std::filesystem;

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

const char * tokenizer_kinds() { return "gpt2|bytes|PATH/tokenizer.json|PATH/tokenizer.model"; }

namespace {

constexpr std::string_view kSentencePiecePrefix = "sentencepiece:";

std::string absolute_normal(const std::string & path) {
    std::error_code ec;
    const fs::path abs = fs::absolute(path, ec);
    return ec ? path : abs.lexically_normal().string();
}

}  // namespace

std::string sentencepiece_model_path(const std::string & kind) {
    if (kind.starts_with(kSentencePiecePrefix)) {
        const std::string path = kind.substr(kSentencePiecePrefix.size());
        return path.empty() ? std::string() : absolute_normal(path);
    }
    if (kind.size() > 6 && kind.ends_with(".model")) return absolute_normal(kind);
    return {};
}

std::string tokenizer_for_folder(const std::string & model_dir) {
    std::error_code ec;
    if (const fs::path json = fs::path(model_dir) / "tokenizer.json"; fs::is_regular_file(json, ec))
        return absolute_normal(json.string());
    const fs::path file = fs::path(model_dir) / "tokenizer.model";
    if (!fs::is_regular_file(file, ec)) return {};
    return std::string(kSentencePiecePrefix) + absolute_normal(file.string());
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string & kind, const std::string & dir) {
    if (kind == "gpt2")
        return std::make_unique<ByteLevelBpe>(read_gpt2_files(dir + "/gpt2-bpe/encoder.json", dir + "/gpt2-bpe/vocab.bpe"));
    if (is_tokenizer_json(kind)) return std::make_unique<ByteLevelBpe>(read_tokenizer_json(kind));
    if (kind == "bytes") return std::make_unique<ByteTokenizer>();
    if (const std::string sp = sentencepiece_model_path(kind); !sp.empty())
        return std::make_unique<SentencePieceTokenizer>(sp);
    throw ConfigError(fmt::format("unknown tokenizer '{}'; valid tokenizers: gpt2, bytes, a Hugging Face "
                                  "PATH/tokenizer.json, sentencepiece:PATH or a SentencePiece PATH/tokenizer.model",
                                  kind));
}

}  // namespace memfit
