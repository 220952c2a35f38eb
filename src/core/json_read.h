// Untrusted JSON, read one way. Users hand memfit tokenizers, chat templates, datasets, configs
// and checkpoints from strangers, so every reader goes through here:
//   - a nesting limit (kMaxJsonDepth) enforced while parsing: nlohmann's parser is iterative, but
//     copying, dumping and converting a parsed value recurse, and 200,000 nested brackets took
//     memfit down with SIGSEGV; nothing deeper than the limit is ever built;
//   - a size limit on whole files (read_json_file), checked before reading;
//   - errors in memfit's words: where (the file, and the line of a JSONL record), the line and
//     column, and what was wrong; never the library's "[json.exception.parse_error.101]".
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace memfit {

// Deeper than any real file (tokenizer.json normalizer sequences and chat records are a few
// levels; DeepSpeed configs under 10), far below what a recursive walk of the value can hold.
constexpr int kMaxJsonDepth = 512;
// A whole JSON file: tokenizer.json files are tens of MB, configs and indexes far less.
constexpr uint64_t kMaxJsonFileBytes = uint64_t(1) << 30;

// Called for every parse event with the depth (nlohmann's parser_callback_t less the return
// value: every value is kept); it may throw to refuse the file.
template <class Json>
using JsonEvents = std::function<void(int depth, typename Json::parse_event_t event, Json & parsed)>;

// `text` parsed, or FormatError "WHERE: not valid JSON at line L, column C (...)" / "WHERE: nested
// deeper than 512 levels at line L".
nlohmann::json parse_json(std::string_view text, const std::string & where,
                          const JsonEvents<nlohmann::json> & events = {});
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string & where,
                                          const JsonEvents<nlohmann::ordered_json> & events = {});

// The same, nullopt for anything that is not valid, bounded JSON (a line being written, a
// garbled file that the caller reports in its own words).
std::optional<nlohmann::json> try_parse_json(std::string_view text);

// The JSON library's exception text in memfit's words: without its "[json.exception.type_error.302]"
// and "parse error at line 1, column 5:" prefixes, cut to 160 bytes, control bytes as spaces.
std::string json_error_text(const std::string & what);

// A whole file: IoError when it cannot be read (missing, a folder, a FIFO or other non-regular
// file, larger than max_bytes: each named), then parse_json with the path as WHERE.
std::string read_text_file(const std::string & path, uint64_t max_bytes = kMaxJsonFileBytes);
nlohmann::json read_json_file(const std::string & path, uint64_t max_bytes = kMaxJsonFileBytes);

}  // namespace memfit
