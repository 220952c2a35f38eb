// Numbers read from JSON, range-checked before converting: nlohmann converts a float such as
// 3e52 to int (and a double beyond float's range to float) with undefined behaviour, and a
// corrupt or hostile file must give a clear error instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace memfit {

// A float as the user wrote it: the shortest decimal that reads back as the same float (0.9, not
// the double 0.8999999761581421 that converting the float gives). For configs and reports.
inline double json_float(float f) {
    if (!std::isfinite(f)) return double(f);
    return std::stod(fmt::format("{}", f));
}

// Integers: a JSON integer within T's range. Floats: a finite JSON number within T's range.
template <class T>
std::optional<T> json_number(const nlohmann::json & v) {
    if constexpr (std::is_integral_v<T>) {
        if (v.is_number_unsigned()) {
            const uint64_t x = v.get<uint64_t>();
            if (x <= uint64_t(std::numeric_limits<T>::max())) return T(x);
        } else if (v.is_number_integer()) {
            const int64_t x = v.get<int64_t>();
            if (x >= int64_t(std::numeric_limits<T>::min()) && (x < 0 || uint64_t(x) <= uint64_t(std::numeric_limits<T>::max())))
                return T(x);
        }
        return std::nullopt;
    } else {
        if (!v.is_number()) return std::nullopt;
        const double x = v.get<double>();
        if (!std::isfinite(x) || std::fabs(x) > double(std::numeric_limits<T>::max())) return std::nullopt;
        return T(x);
    }
}

// j[key] as T; FormatError naming `where` and the key when it is missing or out of range.
template <class T>
T json_get(const nlohmann::json & j, const char * key, const std::string & where) {
    if (!j.is_object() || !j.contains(key)) throw FormatError(fmt::format("{}: no \"{}\"", where, key));
    if (const auto x = json_number<T>(j[key])) return *x;
    throw FormatError(fmt::format("{}: \"{}\" = {} is not a number in range", where, key, j[key].dump()));
}

// j[key] as T within [lo, hi]; FormatError naming `where`, the key, the value and the range.
template <class T>
T json_get_in(const nlohmann::json & j, const char * key, const std::string & where, T lo, T hi) {
    const T x = json_get<T>(j, key, where);
    if (!(x >= lo && x <= hi))
        throw FormatError(fmt::format("{}: \"{}\" = {} is outside {}..{}", where, key, j[key].dump(), lo, hi));
    return x;
}

// j[key] when it is a string, else `fallback` (missing, null, or another kind: a hostile file's
// number where a name goes must not raise the JSON library's type_error).
inline std::string json_string_or(const nlohmann::json & j, const char * key, const std::string & fallback = "") {
    return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

}  // namespace memfit
