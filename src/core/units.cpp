#include "core/units.h"

#include <array>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {

__extension__ typedef unsigned __int128 u128;

[[noreturn]] void bad_size(std::string_view text) {
    throw ConfigError(fmt::format(
        "invalid size '{}': expected a number with an optional unit, e.g. 512MiB, 2GiB, 1.5GB", text));
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t'; }
char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

// Bytes per unit, or 0 for an unknown unit. Case-insensitive; bare K/M/G/T and the "i" forms
// are binary, KB/MB/GB/TB decimal.
uint64_t unit_multiplier(std::string_view unit) {
    std::string u;
    for (char c : unit) u += to_lower(c);
    if (u.empty() || u == "b") return 1;
    static constexpr std::array<char, 4> prefixes = {'k', 'm', 'g', 't'};
    uint64_t binary = 1, decimal = 1;
    for (char p : prefixes) {
        binary *= 1024;
        decimal *= 1000;
        if (u[0] != p) continue;
        std::string_view rest = std::string_view(u).substr(1);
        if (rest.empty() || rest == "ib") return binary;
        if (rest == "b") return decimal;
        return 0;
    }
    return 0;
}

}  // namespace

uint64_t parse_bytes(std::string_view text) {
    // number := digits [ '.' digits ], then an optional unit, optionally after blanks.
    size_t i = 0;
    u128 whole = 0;
    size_t whole_digits = 0;
    for (; i < text.size() && is_digit(text[i]); i++, whole_digits++) {
        whole = whole * 10 + u128(text[i] - '0');
        if (whole > std::numeric_limits<uint64_t>::max()) bad_size(text);
    }
    if (whole_digits == 0) bad_size(text);

    // Fraction: the first 18 digits are kept exactly; later ones are dropped (each is worth
    // under 2e-6 bytes even in TiB). A fractional byte count is rounded to nearest, half up.
    constexpr int kFracDigits = 18;
    u128 frac = 0;
    int frac_digits = 0;
    if (i < text.size() && text[i] == '.') {
        i++;
        size_t start = i;
        for (; i < text.size() && is_digit(text[i]); i++) {
            if (frac_digits < kFracDigits) {
                frac = frac * 10 + u128(text[i] - '0');
                frac_digits++;
            }
        }
        if (i == start) bad_size(text);
    }
    // Blanks are allowed only between the number and a unit.
    size_t blanks = i;
    while (i < text.size() && is_space(text[i])) i++;
    if (i == text.size() && i != blanks) bad_size(text);

    uint64_t mult = unit_multiplier(text.substr(i));
    if (mult == 0) bad_size(text);

    u128 scale = 1;
    for (int d = 0; d < frac_digits; d++) scale *= 10;
    u128 total = whole * mult + (frac * mult + scale / 2) / scale;
    if (total > std::numeric_limits<uint64_t>::max()) bad_size(text);
    return uint64_t(total);
}

std::string format_bytes(uint64_t bytes) {
    if (bytes < KiB) return fmt::format("{} B", bytes);
    static constexpr std::array<const char *, 6> units = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    size_t u = 0;
    double value = double(bytes) / 1024.0;
    // Move up a unit while the value would print as 1024.00 or more (1048575 B is "1.00 MiB").
    while (u + 1 < units.size() && (value >= 1024.0 || fmt::format("{:.2f}", value) == "1024.00")) {
        value /= 1024.0;
        u++;
    }
    return fmt::format("{:.2f} {}", value, units[u]);
}

}  // namespace memfit
