#include "tokenizer/tokenizer_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_read.h"
#include "core/paths.h"

namespace memfit {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string & name, const std::string & what) {
    throw FormatError(fmt::format("{}: {}; the file is not a tokenizer_config.json memfit can read", name, what));
}

std::string token(const json & j, const char * key, const std::string & name) {
    if (!j.contains(key) || j[key].is_null()) return "";
    const json & t = j[key];
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
    bad(name, fmt::format("\"{}\" is neither a string, null nor an AddedToken {{\"content\": ...}}", key));
}

bool flag(const json & j, const char * key, const std::string & name) {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) bad(name, fmt::format("\"{}\" is not true, false or null", key));
    return j[key].get<bool>();
}

std::string chat_template(const json & j, const std::string & name) {
    if (!j.contains("chat_template") || j["chat_template"].is_null()) return "";
    const json & t = j["chat_template"];
    if (t.is_string()) return t.get<std::string>();
    if (!t.is_array()) bad(name, "\"chat_template\" is neither a string, null nor a list of {\"name\", \"template\"}");
    std::string found;
    for (const json & e : t) {
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
            !e["template"].is_string())
            bad(name, "an entry of \"chat_template\" is not {\"name\": string, \"template\": string}");
        if (e["name"].get<std::string>() == "default") found = e["template"].get<std::string>();
    }
    return found;
}

}  // namespace

TokenizerConfig parse_tokenizer_config(const std::string & text, const std::string & name) {
    const json j = parse_json(text, name);
    if (!j.is_object()) bad(name, "not a JSON object");
    TokenizerConfig c;
    c.bos_token = token(j, "bos_token", name);
    c.eos_token = token(j, "eos_token", name);
    c.pad_token = token(j, "pad_token", name);
    c.add_bos_token = flag(j, "add_bos_token", name);
    c.add_eos_token = flag(j, "add_eos_token", name);
    c.chat_template = chat_template(j, name);
    return c;
}

TokenizerConfig read_tokenizer_config(const std::string & path) {
    TokenizerConfig c = parse_tokenizer_config(read_whole_file(path, "a tokenizer_config.json", "pass a model folder or tokenizer that has one"), path);
    std::error_code ec;
    const std::filesystem::path jinja = std::filesystem::path(path).parent_path() / "chat_template.jinja";
    if (std::filesystem::is_regular_file(jinja, ec)) c.chat_template = read_whole_file(jinja.string(), "a chat template", "");
    return c;
}

}  // namespace memfit
