#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_num.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

constexpr const char * kFormat = "memfit-checkpoint-1";

// The step of a complete checkpoint folder name "step-000123", or -1.
long folder_step(const fs::path & p) {
    const std::string n = p.filename().string();
    if (!n.starts_with("step-") || n.size() < 6) return -1;
    const std::string digits = n.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), ::isdigit) || digits.size() > 12) return -1;
    return std::stol(digits);
}

std::vector<std::pair<long, fs::path>> complete_checkpoints(const fs::path & root) {
    std::vector<std::pair<long, fs::path>> out;
    std::error_code ec;
    for (const auto & e : fs::directory_iterator(root, ec)) {
        const long s = folder_step(e.path());
        if (s >= 0 && fs::exists(e.path() / "meta.json") && fs::exists(e.path() / "state.safetensors"))
            out.push_back({s, e.path()});
    }
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

std::string save_checkpoint(const std::string & root, const Checkpoint & ckpt, int keep,
                            const std::function<void()> & between_files) {
    const long step = ckpt.meta.at("step").get<long>();
    const fs::path dir = fs::path(root) / fmt::format("step-{:06d}", step);
    const fs::path tmp = fs::path(root) / fmt::format(".step-{:06d}.tmp", step);
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) throw IoError(fmt::format("cannot create checkpoint folder {}: {}", root, ec.message()));
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", tmp.string(), ec.message()));

    const TrainState & s = ckpt.state;
    const int64_t P = int64_t(s.params.size());
    auto tensor = [&](const char * name, const std::vector<float> & v) {
        return TensorToWrite{name, "F32", {P}, v.data(), v.size() * sizeof(float)};
    };
    write_safetensors((tmp / "state.safetensors").string(),
                      {tensor("params", s.params), tensor("adamw.m", s.m), tensor("adamw.v", s.v)});
    if (between_files) between_files();
    nlohmann::json meta = ckpt.meta;
    meta["format"] = kFormat;
    meta["optimizer_step"] = s.t;
    meta["loss_scaler"] = {{"scale", s.scaler.scale}, {"clean", s.scaler.clean}, {"skipped", s.scaler.skipped}};
    write_file_atomic((tmp / "meta.json").string(), meta.dump(2) + "\n");
    fsync_dir(tmp.string());
    fs::remove_all(dir, ec);   // a checkpoint of the same step from an earlier run
    fs::rename(tmp, dir, ec);
    if (ec) throw IoError(fmt::format("cannot rename {} to {}: {}", tmp.string(), dir.string(), ec.message()));
    fsync_dir(root);

    const auto all = complete_checkpoints(root);
    for (size_t i = 0; i + size_t(std::max(keep, 1)) < all.size(); ++i) fs::remove_all(all[i].second, ec);
    return dir.string();
}

Checkpoint load_checkpoint(const std::string & path) {
    fs::path dir = path;
    if (!fs::is_directory(dir)) throw IoError(fmt::format("{}: no such checkpoint folder", path));
    if (!fs::exists(dir / "meta.json")) {
        const auto all = complete_checkpoints(dir);
        if (all.empty())
            throw IoError(fmt::format("{}: holds no complete checkpoint (step-NNNNNN/ with meta.json and "
                                      "state.safetensors)", path));
        dir = all.back().second;
    }
    Checkpoint c;
    const std::string meta_path = (dir / "meta.json").string();
    try {
        c.meta = nlohmann::json::parse(std::ifstream(meta_path));
    } catch (const std::exception & e) {
        throw FormatError(fmt::format("{}: not valid JSON ({})", meta_path, e.what()));
    }
    if (!c.meta.is_object() || c.meta.value("format", "") != kFormat || !c.meta.contains("step"))
        throw FormatError(fmt::format("{}: not a {} file", meta_path, kFormat));
    const SafetensorsFile f = SafetensorsFile::open((dir / "state.safetensors").string());
    c.state.params = f.read_f32("params");
    c.state.m = f.read_f32("adamw.m");
    c.state.v = f.read_f32("adamw.v");
    if (c.state.m.size() != c.state.params.size() || c.state.v.size() != c.state.params.size())
        throw FormatError(fmt::format("{}: params, adamw.m and adamw.v differ in size ({}, {}, {})", f.path(),
                                      c.state.params.size(), c.state.m.size(), c.state.v.size()));
    try {
        c.state.t = json_get<int>(c.meta, "optimizer_step", meta_path);
        const auto & ls = c.meta.at("loss_scaler");
        c.state.scaler.scale = json_get<float>(ls, "scale", meta_path);
        c.state.scaler.clean = json_get<int>(ls, "clean", meta_path);
        c.state.scaler.skipped = json_get<long long>(ls, "skipped", meta_path);
    } catch (const std::exception & e) {
        throw FormatError(fmt::format("{}: {}", meta_path, e.what()));
    }
    return c;
}

}  // namespace memfit
