#include "plan/hardware.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_read.h"
#include "core/paths.h"
#include "core/units.h"

namespace memfit {

namespace {

using nlohmann::json;

constexpr double kGiB = double(GiB), kTera = 1e12, kGiga = 1e9, kMicro = 1e-6;

// The fields of one device entry, in the file's order; "notes" is the only optional one.
constexpr const char * kFields[] = {"name",        "description",  "source",          "memory_gib",
                                    "reserved_gib", "bf16_tflops", "fp16_tflops",     "fp32_tflops",
                                    "mem_bw_gbs",  "per_node",     "intra_bw_gbs",    "intra_latency_us",
                                    "inter_bw_gbs", "inter_latency_us", "host_bw_gbs", "host_memory_gib"};
// Optional: the time model's efficiencies (fractions in (0, 1]); the defaults of plan_types.h otherwise.
// "efficiencies_from": the entry whose published runs the efficiencies were fitted on, when not
// this kind's own (the planner says so beside its speeds).
constexpr const char * kOptional[] = {"notes", "matmul_efficiency", "attention_efficiency", "bandwidth_efficiency",
                                      "efficiencies_from"};
constexpr const char * kTopLevel[] = {"format", "version", "units", "notes", "devices"};

std::string known_list(const auto & names) {
    std::string s;
    for (const auto & n : names) s += (s.empty() ? "" : ", ") + std::string(n);
    return s;
}

// Reads one device entry; every failure names the file, the entry and the field.
class EntryReader {
public:
    EntryReader(const std::string & path, const json & e, size_t index) : path_(path), e_(e) {
        who_ = fmt::format("entry #{}", index + 1);
        if (e_.is_object() && e_.contains("name") && e_["name"].is_string())
            who_ = fmt::format("entry '{}'", e_["name"].get<std::string>());
    }

    [[noreturn]] void fail(const std::string & field, const std::string & what) const {
        throw ConfigError(fmt::format("hardware catalog {}: {}, field '{}': {}; hint: see the \"units\" object of "
                                      "the file for each field's unit",
                                      path_, who_, field, what));
    }

    void check_keys() const {
        if (!e_.is_object()) throw ConfigError(fmt::format("hardware catalog {}: {} is {}, expected an object", path_,
                                                           who_, e_.type_name()));
        for (const auto & [key, value] : e_.items()) {
            bool known = false;
            for (const char * f : kFields) known = known || key == f;
            for (const char * f : kOptional) known = known || key == f;
            if (!known)
                fail(key, fmt::format("unknown field (known: {}, {})", known_list(kFields), known_list(kOptional)));
        }
        if (e_.contains("notes")) {
            const json & n = e_["notes"];
            bool ok = n.is_array();
            for (const json & s : n) ok = ok && s.is_string();
            if (!ok) fail("notes", "must be an array of strings");
        }
    }

    const json & get(const char * field) const {
        if (!e_.contains(field)) fail(field, "missing");
        return e_[field];
    }

    std::string text(const char * field) const {
        const json & v = get(field);
        if (!v.is_string() || v.get<std::string>().empty())
            fail(field, fmt::format("must be a non-empty string, got {}", v.dump()));
        return v.get<std::string>();
    }

    // A positive number, at most `most` (a device of 1e300 GiB made every plan fit, clamped to 8 EiB).
    double positive(const char * field, const char * unit, double most = 1e9) const {
        const json & v = get(field);
        if (!v.is_number()) fail(field, fmt::format("must be a number ({}), got {}", unit, v.dump()));
        const double x = v.get<double>();
        if (!std::isfinite(x) || x <= 0) fail(field, fmt::format("must be positive ({}), got {}", unit, v.dump()));
        if (x > most) fail(field, fmt::format("{} {} is past any device (at most {:g})", v.dump(), unit, most));
        return x;
    }

    int count(const char * field) const {
        const json & v = get(field);
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1'000'000)
            fail(field, fmt::format("must be a positive integer, got {}", v.dump()));
        return int(v.get<int64_t>());
    }

    // An optional fraction in (0, 1]: `fallback` when absent.
    double fraction(const char * field, double fallback) const {
        if (!e_.contains(field)) return fallback;
        const json & v = e_[field];
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0 || v.get<double>() > 1)
            fail(field, fmt::format("must be a fraction in (0, 1], got {}", v.dump()));
        return v.get<double>();
    }

private:
    const std::string & path_;
    const json & e_;
    std::string who_;
};

uint64_t gib_to_bytes(double gib) { return uint64_t(std::llround(gib * kGiB)); }

Hardware parse_entry(const std::string & path, const json & e, size_t index) {
    EntryReader r(path, e, index);
    r.check_keys();
    Hardware h;
    h.name = r.text("name");
    if (h.name.find_first_of(" \t\n,") != std::string::npos) r.fail("name", "must not contain spaces or commas");
    h.description = r.text("description");
    h.source = r.text("source");
    constexpr double kMostGib = 1 << 20;   // 1 PiB: past any device's or node's memory
    const double memory_gib = r.positive("memory_gib", "GiB", kMostGib);
    const double reserved_gib = r.positive("reserved_gib", "GiB", kMostGib);
    if (reserved_gib >= memory_gib)
        r.fail("reserved_gib", fmt::format("{} must be less than memory_gib = {}", reserved_gib, memory_gib));
    h.memory = gib_to_bytes(memory_gib);
    h.usable = h.memory - gib_to_bytes(reserved_gib);
    // null: the device has no bf16 arithmetic (V100); a bf16 plan on it then says so.
    h.bf16_flops = e.contains("bf16_tflops") && e.at("bf16_tflops").is_null() ? 0.0
                                                                                : r.positive("bf16_tflops", "TFLOP/s") * kTera;
    h.fp16_flops = r.positive("fp16_tflops", "TFLOP/s") * kTera;
    h.fp32_flops = r.positive("fp32_tflops", "TFLOP/s") * kTera;
    h.mem_bw = r.positive("mem_bw_gbs", "GB/s") * kGiga;
    h.per_node = r.count("per_node");
    h.intra_bw = r.positive("intra_bw_gbs", "GB/s") * kGiga;
    h.intra_latency = r.positive("intra_latency_us", "microseconds") * kMicro;
    h.inter_bw = r.positive("inter_bw_gbs", "GB/s") * kGiga;
    h.inter_latency = r.positive("inter_latency_us", "microseconds") * kMicro;
    h.host_bw = r.positive("host_bw_gbs", "GB/s") * kGiga;
    h.host_memory = gib_to_bytes(r.positive("host_memory_gib", "GiB", kMostGib));
    h.matmul_eff = r.fraction("matmul_efficiency", kDefaultMatmulEfficiency);
    h.attention_eff = r.fraction("attention_efficiency", kDefaultAttentionEfficiency);
    h.bandwidth_eff = r.fraction("bandwidth_efficiency", kDefaultBandwidthEfficiency);
    if (e.contains("efficiencies_from")) h.efficiencies_from = r.text("efficiencies_from");
    return h;
}

// Bytes of RAM on this machine: MemTotal, capped by a cgroup v2 memory limit. 0 if unknown.
uint64_t machine_memory() {
    uint64_t total = 0;
    std::ifstream mi("/proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0;
    while (mi >> key >> kb) {
        std::getline(mi, unit);
        if (key == "MemTotal:") { total = kb * KiB; break; }
    }
    std::ifstream cg("/sys/fs/cgroup/memory.max");
    std::string lim;
    if (cg >> lim && lim != "max") {
        try {
            const uint64_t l = std::stoull(lim);
            if (l > 0 && (total == 0 || l < total)) total = l;
        } catch (const std::exception &) {
            // an unreadable limit: keep MemTotal
        }
    }
    return total;
}

}  // namespace

std::vector<Hardware> load_hardware_catalog(const std::string & path) {
    std::string text;
    try {
        text = read_text_file(path, uint64_t(16) << 20);
    } catch (const IoError & e) {
        throw IoError(fmt::format("{}; hint: set MEMFIT_DATA_DIR to the folder holding hardware.json", e.what()));
    }
    json j;
    try {
        j = parse_json(text, "hardware catalog " + path);
    } catch (const FormatError & e) {
        throw ConfigError(e.what());
    }
    if (!j.is_object()) throw ConfigError(fmt::format("hardware catalog {}: expected a JSON object", path));
    for (const auto & [key, value] : j.items()) {
        bool known = false;
        for (const char * k : kTopLevel) known = known || key == k;
        if (!known)
            throw ConfigError(fmt::format("hardware catalog {}: unknown top-level field '{}' (known: {})", path, key,
                                          known_list(kTopLevel)));
    }
    if (!j.contains("version") || j["version"] != 1)
        throw ConfigError(fmt::format("hardware catalog {}: field 'version' must be 1, got {}", path,
                                      j.contains("version") ? j["version"].dump() : "nothing"));
    if (!j.contains("devices") || !j["devices"].is_array() || j["devices"].empty())
        throw ConfigError(fmt::format("hardware catalog {}: field 'devices' must be a non-empty array of device entries",
                                      path));
    std::vector<Hardware> out;
    std::set<std::string> seen;
    for (size_t i = 0; i < j["devices"].size(); ++i) {
        Hardware h = parse_entry(path, j["devices"][i], i);
        if (!seen.insert(h.name).second)
            throw ConfigError(fmt::format("hardware catalog {}: entry #{}, field 'name': '{}' appears twice", path, i + 1,
                                          h.name));
        out.push_back(std::move(h));
    }
    for (size_t i = 0; i < out.size(); ++i) {
        const std::string & from = out[i].efficiencies_from;
        if (!from.empty() && !seen.count(from))
            throw ConfigError(fmt::format("hardware catalog {}: entry '{}', field 'efficiencies_from': '{}' is not an "
                                          "entry of the catalog", path, out[i].name, from));
    }
    return out;
}

const Hardware & find_hardware(const std::vector<Hardware> & catalog, const std::string & name) {
    std::vector<std::string> names;
    for (const Hardware & h : catalog) {
        if (h.name == name) return h;
        names.push_back(h.name);
    }
    throw ConfigError(fmt::format("unknown hardware '{}' (known: {}); hint: add an entry to {}/hardware.json", name,
                                  known_list(names), data_dir()));
}

std::optional<Calibration> read_calibration(const std::string & path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return std::nullopt;
    const std::string hint = "hint: rerun `memfit bench --calibrate` or delete the file";
    json j;
    try {
        j = parse_json(read_text_file(path, uint64_t(1) << 20), path + " (the calibration file)");
    } catch (const Error & e) {
        throw FormatError(fmt::format("{}; {}", e.what(), hint));
    }
    if (!j.is_object()) throw FormatError(fmt::format("{}: calibration file is not a JSON object; {}", path, hint));
    auto rate = [&](const char * field) {
        if (!j.contains(field) || !j[field].is_number() || !std::isfinite(j[field].get<double>()) ||
            j[field].get<double>() <= 0)
            throw FormatError(fmt::format("{}: calibration field '{}' must be a positive number, got {}; {}", path, field,
                                          j.contains(field) ? j[field].dump() : "nothing", hint));
        return j[field].get<double>();
    };
    Calibration c;
    c.fp32_flops = rate("fp32_gflops") * kGiga;
    c.mem_bw = rate("mem_bw_gbs") * kGiga;
    if (j.contains("offload_gbs")) c.offload_bw = rate("offload_gbs") * kGiga;
    if (j.contains("bf16_gflops")) c.bf16_flops = rate("bf16_gflops") * kGiga;
    if (j.contains("threads") && j["threads"].is_number_integer()) c.threads = j["threads"].get<int>();
    if (j.contains("cpu") && j["cpu"].is_string()) c.cpu = j["cpu"].get<std::string>();
    if (j.contains("created") && j["created"].is_string()) c.created = j["created"].get<std::string>();
    return c;
}

void apply_calibration(Hardware & cpu, const Calibration & c, const std::string & path) {
    cpu.fp32_flops = c.fp32_flops;
    cpu.bf16_flops = cpu.fp16_flops = c.bf16_flops > 0 ? c.bf16_flops : c.fp32_flops;
    cpu.mem_bw = cpu.host_bw = c.mem_bw;
    if (c.offload_bw > 0) cpu.host_bw = c.offload_bw;   // the cpu entry's host link: its offload files
    cpu.description = fmt::format("this machine ({}{}calibrated)", c.cpu.empty() ? "" : c.cpu + ", ",
                                  c.threads > 0 ? fmt::format("{} threads, ", c.threads) : "");
    cpu.source = fmt::format("memfit bench --calibrate ({}{})", path, c.created.empty() ? "" : ", " + c.created);
}

std::vector<Hardware> default_hardware_catalog(const std::string & calibration_path) {
    std::vector<Hardware> catalog = load_hardware_catalog(data_dir() + "/hardware.json");
    for (Hardware & h : catalog) {
        if (h.name != "cpu") continue;
        if (const uint64_t mem = machine_memory(); mem > 0) {
            const uint64_t reserved = h.memory - h.usable;
            h.memory = h.host_memory = mem;
            h.usable = mem > reserved ? mem - reserved : mem / 2;
        }
        if (calibration_path.empty()) continue;
        if (const std::optional<Calibration> c = read_calibration(calibration_path))
            apply_calibration(h, *c, calibration_path);
    }
    return catalog;
}

}  // namespace memfit
