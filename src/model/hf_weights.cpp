#include "model/hf_weights.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/finite.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

// The safetensors files of a folder: the single file, or the shards the index names.
std::vector<std::string> weight_files(const fs::path & dir) {
    if (fs::exists(dir / "model.safetensors")) return {(dir / "model.safetensors").string()};
    const fs::path index = dir / "model.safetensors.index.json";
    if (!fs::exists(index))
        throw IoError(fmt::format("{}: no model.safetensors or model.safetensors.index.json", dir.string()));
    const nlohmann::json j = read_json_file(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw FormatError(fmt::format("{}: no \"weight_map\" object", index.string()));
    std::set<std::string> shards;
    for (const auto & item : j["weight_map"].items()) {
        if (!item.value().is_string())
            throw FormatError(fmt::format("{}: weight_map[\"{}\"] is not a file name", index.string(), item.key()));
        const std::string f = item.value().get<std::string>();
        if (f.find('/') != std::string::npos || f.starts_with("."))
            throw FormatError(fmt::format("{}: shard '{}' is not a file in the folder", index.string(), f));
        shards.insert(f);
    }
    std::vector<std::string> out;
    for (const auto & s : shards) out.push_back((dir / s).string());
    return out;
}

// Buffers, not weights: GPT-2's attention masks and old LLaMA checkpoints' rotary frequencies.
bool ignorable(const std::string & name) {
    return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with(".rotary_emb.inv_freq");
}

}  // namespace

bool has_hf_weights(const std::string & dir) {
    return fs::is_directory(dir) &&
           (fs::exists(fs::path(dir) / "model.safetensors") || fs::exists(fs::path(dir) / "model.safetensors.index.json"));
}

void load_hf_weights(const std::string & dir, const ModelConfig & cfg, const ParamLayout & layout, float * params) {
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    std::map<std::string, std::pair<const SafetensorsFile *, std::string>> found;   // our name -> (file, its name)
    for (const auto & path : weight_files(dir)) {
        files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
        const SafetensorsFile & f = *files.back();
        for (const auto & n : f.names()) {
            std::string ours = n.starts_with("transformer.") ? n.substr(12) : n;
            if (ignorable(ours)) continue;
            // Shared blocks (--share-layers G): each group takes its first layer's weights.
            if (const int b = param_block(ours); cfg.share_layers > 1 && b >= 0 && b < cfg.n_layer) {
                if (b % cfg.share_layers != 0) continue;
                ours = in_block(ours, cfg.stored_block(b));
            }
            if (ours == "lm_head.weight" && cfg.tied_head) {
                // A tied head may be saved anyway; it must be the embedding's shape.
                const ParamInfo & wte = layout.params.front();
                if (f.info(n).shape != wte.shape)
                    throw FormatError(fmt::format("{}: lm_head.weight has shape {} but the tied head needs {}'s {}",
                                                  path, fmt::join(f.info(n).shape, "x"), wte.name,
                                                  fmt::join(wte.shape, "x")));
                continue;
            }
            if (!layout.try_find(ours))
                throw FormatError(fmt::format("{}: unexpected tensor '{}' for the config's model ({})", path, n,
                                              cfg.describe()));
            if (found.count(ours)) throw FormatError(fmt::format("{}: tensor '{}' appears twice", path, n));
            found[ours] = {&f, n};
        }
    }
    for (const ParamInfo & p : layout.params) {
        const auto it = found.find(p.name);
        if (it == found.end()) throw FormatError(fmt::format("{}: missing tensor '{}'", dir, p.name));
        const auto & info = it->second.first->info(it->second.second);
        if (info.shape != p.shape)
            throw FormatError(fmt::format("{}: tensor '{}' has shape [{}], the config needs [{}]",
                                          it->second.first->path(), it->second.second, fmt::join(info.shape, ", "),
                                          fmt::join(p.shape, ", ")));
        if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
            throw FormatError(fmt::format("{}: tensor '{}' is {}; weights must be F32, F16 or BF16",
                                          it->second.first->path(), it->second.second, info.dtype));
    }
    for (const ParamInfo & p : layout.params) {
        const auto & [file, name] = found.at(p.name);
        const std::vector<float> v = file->read_f32(name);
        if (const NonFinite bad = find_non_finite(v.data(), v.size()))
            throw FormatError(fmt::format("{}: tensor '{}' holds {}; the weights are corrupt (or were saved from a "
                                          "diverged run)", file->path(), name, bad.describe()));
        std::copy(v.begin(), v.end(), params + p.offset);
    }
}

void export_hf(const std::string & dir, const ModelConfig & cfg, const ParamLayout & layout, const float * params) {
    if (cfg.share_layers > 1) {   // a plain model for transformers: every block written out
        MF_ASSERT(layout.total == make_param_layout(cfg).total);
        ModelConfig one = cfg;
        one.share_layers = 1;
        const std::vector<float> all = unshared_params(cfg, params);
        export_hf(dir, one, make_param_layout(one), all.data());
        return;
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
    const nlohmann::json config = hf_config_json(cfg);
    std::vector<TensorToWrite> tensors;
    for (const ParamInfo & p : layout.params)
        tensors.push_back(TensorToWrite{p.name, "F32", p.shape, params + p.offset, p.numel * sizeof(float)});
    write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
    write_file_atomic((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace memfit
