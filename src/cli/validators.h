// Numeric flag validators shared by the subcommands: plain messages instead of CLI11's own,
// which print their full double range.
#pragma once

#include <cmath>
#include <exception>
#include <limits>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace memfit::cli {

// The whole of `v` as a finite number within float's range (the flags are floats: 1e300 would
// become inf; NaN and inf are not numbers a flag takes).
inline std::optional<double> finite_number(const std::string & v) {
    try {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used == v.size() && std::isfinite(x) && std::fabs(x) <= double(std::numeric_limits<float>::max())) return x;
    } catch (const std::exception &) {}
    return std::nullopt;
}

inline const CLI::Validator kPositive(
    [](std::string & v) {
        const auto x = finite_number(v);
        return x && *x > 0 ? std::string()
                           : "must be a number greater than 0 and at most 3.4e38, got '" + v + "'";
    },
    "> 0");
inline const CLI::Validator kNonNegative(
    [](std::string & v) {
        const auto x = finite_number(v);
        return x && *x >= 0 ? std::string() : "must be a number from 0 to 3.4e38, got '" + v + "'";
    },
    ">= 0");
// A finite number in [lo, hi] (CLI::Range lets NaN through).
inline CLI::Validator finite_range(double lo, double hi) {
    return CLI::Validator(
        [lo, hi](std::string & v) {
            const auto x = finite_number(v);
            return x && *x >= lo && *x <= hi ? std::string()
                                             : "must be a number from " + CLI::detail::to_string(lo) + " to " +
                                                   CLI::detail::to_string(hi) + ", got '" + v + "'";
        },
        "[" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "]");
}
inline const CLI::Validator kFraction = finite_range(0, 1);

// A random seed: a whole number from 0 to 19 nines (CLI11 would wrap -1 to 2^64 - 1).
inline bool is_seed(const std::string & v) {
    return !v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos;
}
inline const CLI::Validator kSeed(
    [](std::string & v) {
        return is_seed(v) ? std::string() : "expected a whole number from 0 to 9999999999999999999, got '" + v + "'";
    },
    "seed");

// A folder or file name: not empty (`--out ""` used to write into the current directory, then
// fail with a raw filesystem error).
inline const CLI::Validator kPath(
    [](std::string & v) { return v.empty() ? std::string("an empty name: give a folder or file, e.g. runs/train") : std::string(); },
    "PATH");

}  // namespace memfit::cli
