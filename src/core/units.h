// Byte units: "512MiB", "2GiB", "1.5GB", "4096" parse to bytes; format_bytes prints binary units.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

constexpr uint64_t KiB = 1024ull, MiB = 1024ull * KiB, GiB = 1024ull * MiB;

// Throws ConfigError with the offending text and the accepted forms.
uint64_t parse_bytes(std::string_view text);
// "1.50 GiB", "512.00 MiB", "12 B".
std::string format_bytes(uint64_t bytes);

}  // namespace memfit
