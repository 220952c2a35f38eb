#include "tokenizer/unicode_norm.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <cstdint>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

std::string nfc(std::string_view text) {
    bool ascii = true;
    for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    if (ascii) return std::string(text);   // ASCII is its own NFC
    const auto * s = reinterpret_cast<const uint8_t *>(text.data());
    const int32_t n = static_cast<int32_t>(text.size());
    for (int32_t i = 0; i < n;) {
        UChar32 c;
        U8_NEXT(s, i, n, c);
        if (c < 0) return std::string(text);   // not UTF-8: left as it is
    }
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2 * norm = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status)) throw Error(fmt::format("ICU has no NFC normaliser: {}", u_errorName(status)));
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), n));
    if (norm->isNormalized(u, status) && U_SUCCESS(status)) return std::string(text);
    status = U_ZERO_ERROR;
    const icu::UnicodeString out = norm->normalize(u, status);
    if (U_FAILURE(status)) throw Error(fmt::format("ICU's NFC normalisation failed: {}", u_errorName(status)));
    std::string utf8;
    out.toUTF8String(utf8);
    return utf8;
}

}  // namespace memfit
