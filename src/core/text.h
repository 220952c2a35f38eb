// Text for a terminal or a log: control bytes escaped.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace memfit {

// `s` with every ASCII control byte but newline and tab (and DEL) written as \xNN, so that a
// sampled byte such as ESC c (which resets a terminal), BEL or NUL prints as text. UTF-8 passes
// through untouched (its bytes are all 0x80 and above), also when a character spans two calls.
inline std::string printable_text(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out += ch;
    }
    return out;
}

}  // namespace memfit
