#include "tokenizer/hf_tokenizer.h"

#include <filesystem>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_num.h"
#include "core/json_read.h"
#include "tokenizer/tokenizer_config.h"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class Reader {
public:
    explicit Reader(std::string path) : path_(std::move(path)) {}

    [[noreturn]] void unsupported(const std::string & what) const {
        throw FormatError(fmt::format("{}: {} is not implemented (memfit reads byte-level BPE tokenizer.json files: "
                                      "see src/tokenizer/hf_tokenizer.h)", path_, what));
    }
    [[noreturn]] void bad(const std::string & what) const {
        throw FormatError(fmt::format("{}: {}; the file is not a tokenizer.json memfit can read", path_, what));
    }

    // A component's "type" ("" when the component is null).
    std::string type(const json & c, const char * where) const {
        if (c.is_null()) return "";
        if (!c.is_object() || !c.contains("type") || !c["type"].is_string()) bad(fmt::format("{} has no \"type\"", where));
        return c["type"].get<std::string>();
    }

    bool flag(const json & c, const char * key) const {
        return c.contains(key) && c[key].is_boolean() && c[key].get<bool>();
    }

    void normalizer(const json & n, BpeParts & p) const {
        const std::string t = type(n, "normalizer");
        if (t.empty()) return;
        if (t == "NFC") {
            p.nfc = true;
        } else if (t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
            for (const auto & each : n["normalizers"]) normalizer(each, p);
        } else {
            unsupported(fmt::format("the normalizer \"{}\"", t));
        }
    }

    // Returns whether a ByteLevel step was seen.
    bool pre_tokenizer(const json & pt, BpeParts & p) const {
        const std::string t = type(pt, "pre_tokenizer");
        if (t.empty()) unsupported("a file without a pre_tokenizer (not byte-level)");
        if (t == "ByteLevel") {
            if (flag(pt, "add_prefix_space")) unsupported("ByteLevel's add_prefix_space: true");
            if (!pt.contains("use_regex") || flag(pt, "use_regex")) p.patterns.push_back(kGpt2Pattern);
            return true;
        }
        if (t == "Split") {
            if (!pt.contains("pattern") || !pt["pattern"].is_object() || !pt["pattern"].contains("Regex") ||
                !pt["pattern"]["Regex"].is_string())
                unsupported("a Split whose pattern is not a Regex");
            if (json_string_or(pt, "behavior") != "Isolated")
                unsupported(fmt::format("Split's behavior {}", pt.contains("behavior") ? pt["behavior"].dump() : "(none)"));
            if (flag(pt, "invert")) unsupported("Split's invert: true");
            p.patterns.push_back(pt["pattern"]["Regex"].get<std::string>());
            return false;
        }
        if (t == "Sequence" && pt.contains("pretokenizers") && pt["pretokenizers"].is_array()) {
            bool byte_level = false;
            for (const auto & each : pt["pretokenizers"]) {
                if (byte_level) unsupported("a pre-tokenizer after ByteLevel");
                byte_level = pre_tokenizer(each, p);
            }
            return byte_level;
        }
        unsupported(fmt::format("the pre_tokenizer \"{}\"", t));
    }

    void model(const json & m, BpeParts & p) const {
        const std::string t = type(m, "model");
        if (t != "BPE") unsupported(fmt::format("the model \"{}\"", t.empty() ? "null" : t));
        if (m.contains("dropout") && !m["dropout"].is_null()) unsupported("BPE dropout");
        if (flag(m, "byte_fallback")) unsupported("BPE byte_fallback");
        for (const char * affix : {"continuing_subword_prefix", "end_of_word_suffix"})
            if (m.contains(affix) && m[affix].is_string() && !m[affix].get<std::string>().empty())
                unsupported(fmt::format("BPE's {}", affix));
        p.ignore_merges = flag(m, "ignore_merges");
        if (!m.contains("vocab") || !m["vocab"].is_object()) bad("model.vocab is not an object");
        std::string bytes;
        for (const auto & [token, id] : m["vocab"].items()) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 24))
                bad(fmt::format("token '{}' has no id in [0, 2^24)", token));
            if (!byte_alphabet_to_bytes(token, bytes) || bytes.empty())
                bad(fmt::format("token '{}' is not written in the ByteLevel alphabet", token));
            place(p, size_t(id.get<int64_t>()), bytes, token);
        }
        if (!m.contains("merges") || !m["merges"].is_array()) bad("model.merges is not an array");
        std::string left, right;
        for (const auto & merge : m["merges"]) {
            std::string a, b;
            if (merge.is_string()) {   // "a b"
                const std::string & s = merge.get_ref<const std::string &>();
                const size_t sp = s.find(' ');
                if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) bad(fmt::format("merge '{}' is not 'a b'", s));
                a = s.substr(0, sp), b = s.substr(sp + 1);
            } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
                a = merge[0].get<std::string>(), b = merge[1].get<std::string>();   // ["a", "b"]
            } else {
                bad(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", merge.dump()));
            }
            if (!byte_alphabet_to_bytes(a, left) || !byte_alphabet_to_bytes(b, right) || left.empty() || right.empty())
                bad(fmt::format("merge '{} {}' is not written in the ByteLevel alphabet", a, b));
            p.merges.emplace_back(left, right);
        }
    }

    void added_tokens(const json & list, BpeParts & p) const {
        if (list.is_null()) return;
        if (!list.is_array()) bad("added_tokens is not an array");
        for (const auto & a : list) {
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
                !a["content"].is_string() || a["content"].get<std::string>().empty())
                bad(fmt::format("added token {} has no id or content", a.dump()));
            const std::string content = a["content"].get<std::string>();
            for (const char * opt : {"lstrip", "rstrip", "single_word"})
                if (flag(a, opt)) unsupported(fmt::format("added token '{}' with {}: true", content, opt));
            const int64_t id = a["id"].get<int64_t>();
            if (id < 0 || id >= (int64_t(1) << 24)) bad(fmt::format("added token '{}' has id {}", content, id));
            place(p, size_t(id), content, content, true);
            p.added.emplace_back(content, int32_t(id));
        }
    }

private:
    void place(BpeParts & p, size_t id, const std::string & bytes, const std::string & token, bool added = false) const {
        if (p.id_to_bytes.size() <= id) p.id_to_bytes.resize(id + 1);
        if (!p.id_to_bytes[id].empty() && p.id_to_bytes[id] != bytes && !added)
            bad(fmt::format("id {} belongs to two tokens (the second '{}')", id, token));
        p.id_to_bytes[id] = bytes;
    }

    std::string path_;
};

}  // namespace

bool is_tokenizer_json(const std::string & kind) { return kind.size() > 5 && kind.ends_with(".json"); }

BpeParts read_tokenizer_json(const std::string & path) {
    std::error_code ec;
    const fs::path abs = fs::absolute(path, ec).lexically_normal();
    const Reader r(abs.string());
    json j = parse_json(read_tokenizer_file(path), abs.string());
    if (!j.is_object() || !j.contains("model")) r.bad("no \"model\"");
    BpeParts p;
    p.name = abs.string();
    p.source = abs.string();
    r.model(j["model"], p);
    r.normalizer(j.value("normalizer", json()), p);
    if (!r.pre_tokenizer(j.value("pre_tokenizer", json()), p)) r.unsupported("a pre_tokenizer without ByteLevel");
    const std::string dec = r.type(j.value("decoder", json()), "decoder");
    if (!dec.empty() && dec != "ByteLevel") r.unsupported(fmt::format("the decoder \"{}\"", dec));
    r.added_tokens(j.value("added_tokens", json()), p);
    // The end-of-text id: tokenizer_config.json's eos_token, else the usual names.
    std::string eos;
    const fs::path config = abs.parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(config, ec)) {
        try {
            eos = read_tokenizer_config(config.string()).eos_token;
        } catch (const FormatError &) {   // a config memfit cannot parse leaves the usual names
        }
    }
    for (const std::string & name : {eos, std::string("<|endoftext|>"), std::string("<|end_of_text|>")})
        for (const auto & [content, id] : p.added)
            if (p.eot_id < 0 && !name.empty() && content == name) p.eot_id = id;
    return p;
}

}  // namespace memfit
