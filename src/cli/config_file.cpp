#include "cli/config_file.h"

#include <cstdio>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_read.h"
#include "run/deepspeed.h"
#include "run/run_config.h"

namespace memfit::cli {

namespace {

// A config file is small: a megabyte is far past any real one.
constexpr uint64_t kMaxConfigBytes = uint64_t(1) << 20;

nlohmann::ordered_json read_json(const std::string & path) {
    std::string text;
    try {
        text = read_text_file(path, kMaxConfigBytes);
    } catch (const IoError & e) {
        throw IoError(fmt::format("--config {}", e.what()));
    }
    // A key twice in one object is refused (the parser would keep the last one silently).
    std::vector<std::set<std::string>> keys;
    std::string twice;
    auto events = [&](int, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json & parsed) {
        using E = nlohmann::ordered_json::parse_event_t;
        if (event == E::object_start) keys.emplace_back();
        else if (event == E::object_end && !keys.empty()) keys.pop_back();
        else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
                 twice.empty())
            twice = parsed.get<std::string>();
    };
    nlohmann::ordered_json j = parse_ordered_json(text, "--config " + path, events);
    if (!twice.empty())
        throw FormatError(fmt::format("--config {}: \"{}\" appears twice in one object; keep one", path, twice));
    if (!j.is_object()) throw FormatError(fmt::format("--config {}: expected a JSON object of flags", path));
    return j;
}

// The flag's value as the command line would spell it (a false switch as --key=false: given, and
// off, so that `memfit plan` keeps it off rather than searching it).
std::vector<std::string> spelled(const std::string & path, const std::string & key, const nlohmann::json & v,
                                 const CLI::Option & op) {
    const bool flag = op.get_expected_max() == 0;
    if (v.is_boolean()) {
        if (flag) return {v.get<bool>() ? "--" + key : "--" + key + "=false"};
        return {"--" + key, v.get<bool>() ? "true" : "false"};
    }
    if (flag) throw ConfigError(fmt::format("--config {}: \"{}\" is a switch: write true or false, not {}", path, key,
                                            v.dump()));
    if (v.is_string()) return {"--" + key, v.get<std::string>()};
    if (v.is_number()) return {"--" + key, v.dump()};
    throw ConfigError(fmt::format("--config {}: \"{}\": expected a number, a string or true/false, not {}", path, key,
                                  v.dump()));
}

}  // namespace

void add_config_flag(CLI::App * c) {
    static std::string unused;
    c->add_option("--config", unused,
                  "a JSON file of flags: memfit's own (flag names as keys; a run's summary.json reruns it) or "
                  "DeepSpeed's config (docs/config.md); flags given here override the file");
}

std::vector<std::string> expand_config(CLI::App & app, const std::vector<std::string> & args) {
    // memfit SUBCOMMAND ... --config FILE ...
    size_t at = 0;
    std::string path;
    for (size_t i = 2; i < args.size(); ++i) {
        if (args[i] == "--config" && i + 1 < args.size()) {
            path = args[i + 1];
            at = i;
            break;
        }
        if (args[i].starts_with("--config=")) {
            path = args[i].substr(9);
            at = i;
            break;
        }
    }
    if (path.empty() || args.size() < 2) return args;
    auto find = [&app](const std::string & name) -> CLI::App * {
        for (CLI::App * s : app.get_subcommands([](const CLI::App *) { return true; }))
            if (s->get_name() == name) return s;
        return nullptr;
    };
    CLI::App * sub = find(args[1]);
    if (!sub) return args;
    const CLI::App * train = find("train");
    std::vector<std::string> rest(args.begin() + 2, args.end());
    rest.erase(rest.begin() + long(at - 2), rest.begin() + long(at - 2) + (args[at] == "--config" ? 2 : 1));
    // The options the command line sets: the file does not repeat them.
    std::set<const CLI::Option *> given;
    for (const std::string & a : rest)
        if (a.starts_with("--"))
            if (const CLI::Option * op = sub->get_option_no_throw(a.substr(0, a.find('='))))
                given.insert(op);

    nlohmann::ordered_json file = read_json(path);
    if (file.contains(kRunConfigKey) && file[kRunConfigKey].is_object()) {   // a run's summary.json
        nlohmann::ordered_json inner = file[kRunConfigKey];
        file = std::move(inner);
    }
    nlohmann::json flags;
    if (has_deepspeed_keys(file)) {
        const DeepSpeedTranslation t = translate_deepspeed(file, path);
        if (!t.ignored.empty())
            std::fprintf(stderr, "memfit: warning: --config %s: DeepSpeed keys memfit does not implement, ignored: %s\n",
                         path.c_str(), fmt::format("{}", fmt::join(t.ignored, ", ")).c_str());
        flags = t.flags;
    } else {
        flags = nlohmann::json::parse(file.dump());
    }
    std::vector<std::string> out(args.begin(), args.begin() + 2), unused;
    for (const auto & [raw, value] : flags.items()) {
        std::string key = raw;
        for (char & ch : key)
            if (ch == '_') ch = '-';
        if (value.is_null()) continue;
        if (key == "config")
            throw ConfigError(fmt::format("--config {}: a config file cannot name another (\"{}\"); merge them into "
                                          "one", path, raw));
        const CLI::Option * op = sub->get_option_no_throw("--" + key);
        if (!op) {
            if (sub != train && train && train->get_option_no_throw("--" + key)) {
                unused.push_back(key);
                continue;
            }
            throw ConfigError(fmt::format("--config {}: \"{}\" is not a flag of memfit {} (memfit {} --help lists "
                                          "them; DeepSpeed keys: docs/config.md)", path, raw, args[1], args[1]));
        }
        if (given.count(op)) continue;
        for (std::string & s : spelled(path, key, value, *op)) out.push_back(std::move(s));
    }
    if (!unused.empty())
        std::fprintf(stderr, "memfit: note: --config %s: memfit %s does not use %s\n", path.c_str(), args[1].c_str(),
                     fmt::format("{}", fmt::join(unused, ", ")).c_str());
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
}

}  // namespace memfit::cli
