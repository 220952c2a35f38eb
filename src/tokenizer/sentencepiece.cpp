#include "tokenizer/sentencepiece.h"

#include "core/error.h"
#include "core/paths.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace memfit {

namespace fs = std::filesystem;

namespace {

// The library's messages are multi-line at times; the CLI prints one.
std::string one_line(std::string s) {
    for (char & c : s)
        if (c == '\n' || c == '\r') c = ' ';
    return s;
}


constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";   // U+2581, SentencePiece's "▁"

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string & model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
    std::error_code ec;
    const fs::path abs = fs::absolute(model_path, ec);
    path_ = ec ? model_path : abs.lexically_normal().string();

    const std::string bytes = read_whole_file(path_, "a SentencePiece tokenizer.model file", "pass the tokenizer.model of a SentencePiece (LLaMA-style) model");
    if (bytes.empty()) throw FormatError(fmt::format("{}: empty file, expected a SentencePiece model", path_));
    const auto st = sp_->LoadFromSerializedProto(bytes);
    if (!st.ok()) {
        std::string why = one_line(st.message());
        if (why.find("ParseFromArray") != std::string::npos) why = "not a model protobuf";   // file:line noise
        throw FormatError(fmt::format("{}: not a valid SentencePiece model ({}); expected a file like the "
                                      "tokenizer.model of a LLaMA-style folder", path_, why));
    }
    vocab_ = sp_->GetPieceSize();
    if (vocab_ <= 0) throw FormatError(fmt::format("{}: SentencePiece model with an empty vocabulary", path_));
    eot_ = sp_->eos_id();
    if (eot_ >= vocab_) eot_ = -1;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
    std::vector<int> ids;
    const auto st = sp_->Encode(text, &ids);
    if (!st.ok()) throw FormatError(fmt::format("{}: encoding failed ({})", path_, one_line(st.ToString())));
    return std::vector<int32_t>(ids.begin(), ids.end());
}

void SentencePieceTokenizer::check_id(int32_t id, size_t pos) const {
    if (id < 0 || id >= vocab_) {
        throw FormatError(fmt::format("token id {} at position {} is outside the vocabulary [0, {}) of {}", id, pos,
                                      vocab_, path_));
    }
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t> & ids) const {
    std::vector<int> v(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        check_id(ids[i], i);
        v[i] = ids[i];
    }
    std::string out;
    const auto st = sp_->Decode(v, &out);
    if (!st.ok()) throw FormatError(fmt::format("{}: decoding failed ({})", path_, one_line(st.ToString())));
    return out;
}

std::string SentencePieceTokenizer::decode_token(int32_t id) const {
    check_id(id, 0);
    if (sp_->IsControl(id)) return {};
    if (sp_->IsUnknown(id)) return decode({id});                      // the model's unknown surface
    const std::string & piece = sp_->IdToPiece(id);
    if (sp_->IsByte(id)) {                                            // "<0xAB>"
        unsigned value = 0;
        if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%2X>", &value) == 1 && value < 256)
            return std::string(1, static_cast<char>(static_cast<unsigned char>(value)));
        throw FormatError(fmt::format("{}: byte piece {} of id {} is not of the form <0xAB>", path_, piece, id));
    }
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
            out += ' ';
            i += kSpaceSymbol.size();
        } else {
            out += piece[i++];
        }
    }
    return out;
}

}  // namespace memfit
