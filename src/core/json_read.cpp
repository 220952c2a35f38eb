#include "core/json_read.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace memfit {

namespace {

// 1-based line and column of byte offset `at` (nlohmann's `byte`: 1-based, one past the error).
std::pair<size_t, size_t> line_column(std::string_view text, size_t at) {
    at = std::min(at, text.size());
    const std::string_view before = text.substr(0, at);
    const size_t line = size_t(std::count(before.begin(), before.end(), '\n')) + 1;
    const size_t nl = before.rfind('\n');
    return {line, nl == std::string_view::npos ? at : at - nl - 1};
}

// Thrown from inside the parser's callback, caught below.
struct TooDeep {};

template <class Json>
Json parse_bounded(std::string_view text, const std::string & where, const JsonEvents<Json> & events) {
    using E = typename Json::parse_event_t;
    auto callback = [&](int depth, E event, Json & parsed) {
        if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth) throw TooDeep{};
        if (events) events(depth, event, parsed);
        return true;
    };
    try {
        // The callback sees no position, so the depth error's line comes from a scan of the
        // brackets up to the limit (cheap, and only on the error path).
        return Json::parse(text.begin(), text.end(), callback);
    } catch (const TooDeep &) {
        int depth = 0;
        bool in_string = false, escaped = false;
        size_t at = 0;
        for (; at < text.size(); ++at) {
            const char c = text[at];
            if (in_string) {
                escaped = !escaped && c == '\\';
                if (c == '"' && !escaped) in_string = false;
                if (c != '\\') escaped = false;
                continue;
            }
            if (c == '"') in_string = true;
            else if ((c == '[' || c == '{') && ++depth > kMaxJsonDepth) break;
            else if (c == ']' || c == '}') --depth;
        }
        throw FormatError(fmt::format("{}: nested deeper than {} levels at line {}; memfit reads no JSON that deep "
                                      "(is the file what it claims to be?)",
                                      where, kMaxJsonDepth, line_column(text, at).first));
    } catch (const nlohmann::json::parse_error & e) {
        const auto [line, column] = line_column(text, e.byte > 0 ? e.byte - 1 : 0);
        throw FormatError(fmt::format("{}: not valid JSON at line {}, column {} ({})", where, line, column,
                                      json_error_text(e.what())));
    } catch (const nlohmann::json::exception & e) {
        throw FormatError(fmt::format("{}: not valid JSON ({})", where, json_error_text(e.what())));
    }
}

}  // namespace

std::string json_error_text(const std::string & what) {
    std::string r = what;
    if (const size_t close = r.find("] "); r.starts_with("[json.exception") && close != std::string::npos)
        r = r.substr(close + 2);
    if (const size_t colon = r.find(": "); r.starts_with("parse error") && colon != std::string::npos)
        r = r.substr(colon + 2);
    if (r.size() > 160) r = r.substr(0, 157) + "...";
    for (char & c : r)
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    return r;
}

nlohmann::json parse_json(std::string_view text, const std::string & where, const JsonEvents<nlohmann::json> & events) {
    return parse_bounded<nlohmann::json>(text, where, events);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string & where,
                                          const JsonEvents<nlohmann::ordered_json> & events) {
    return parse_bounded<nlohmann::ordered_json>(text, where, events);
}

std::optional<nlohmann::json> try_parse_json(std::string_view text) {
    try {
        return parse_json(text, "");
    } catch (const FormatError &) {
        return std::nullopt;
    }
}

std::string read_text_file(const std::string & path, uint64_t max_bytes) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw IoError(fmt::format("{}: no such file", path));
    if (fs::is_directory(st)) throw IoError(fmt::format("{}: a folder, not a file", path));
    if (!fs::is_regular_file(st)) throw IoError(fmt::format("{}: not a regular file (a pipe or a device?)", path));
    const uint64_t size = fs::file_size(path, ec);
    if (!ec && size > max_bytes)
        throw IoError(fmt::format("{}: {} is more than the {} memfit reads from a file of this kind", path,
                                  format_bytes(size), format_bytes(max_bytes)));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(fmt::format("{}: cannot read the file", path));
    std::string text;
    text.resize(size_t(ec ? 0 : size));
    in.read(text.data(), std::streamsize(text.size()));
    text.resize(size_t(in.gcount()));
    return text;
}

nlohmann::json read_json_file(const std::string & path, uint64_t max_bytes) {
    return parse_json(read_text_file(path, max_bytes), path);
}

}  // namespace memfit
