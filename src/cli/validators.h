// Numeric flag validators shared by the subcommands: plain messages instead of CLI11's own,
// which print their full double range.
#pragma once

#include <exception>
#include <string>

#include <CLI/CLI.hpp>

namespace memfit::cli {

inline const CLI::Validator kPositive(
    [](std::string & v) {
        try {
            size_t used = 0;
            if (std::stod(v, &used) > 0 && used == v.size()) return std::string();
        } catch (const std::exception &) {}
        return "must be a number greater than 0, got '" + v + "'";
    },
    "> 0");
inline const CLI::Validator kNonNegative(
    [](std::string & v) {
        try {
            size_t used = 0;
            if (std::stod(v, &used) >= 0 && used == v.size()) return std::string();
        } catch (const std::exception &) {}
        return "must be a number >= 0, got '" + v + "'";
    },
    ">= 0");

}  // namespace memfit::cli
