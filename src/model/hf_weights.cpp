#include "model/hf_weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/finite.h"
#include "model/llama_types.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

// The folder's single weight file: model.safetensors, or the one a GPTQ folder's
// quantization_config names by model_file_base_name (AutoGPTQ's "gptq_model-4bit-128g" in older
// Hub folders); "" when there is none.
fs::path single_file(const fs::path & dir) {
    if (fs::exists(dir / "model.safetensors")) return dir / "model.safetensors";
    std::error_code ec;
    if (!fs::is_regular_file(dir / "config.json", ec)) return {};
    try {
        const nlohmann::json j = read_json_file((dir / "config.json").string());
        const nlohmann::json q = j.is_object() ? j.value("quantization_config", nlohmann::json()) : nlohmann::json();
        const std::string base = q.is_object() ? q.value("model_file_base_name", std::string()) : std::string();
        if (!base.empty() && base.find('/') == std::string::npos && fs::exists(dir / (base + ".safetensors")))
            return dir / (base + ".safetensors");
    } catch (const std::exception &) {   // an unreadable config.json is reported by its reader
    }
    return {};
}

// The safetensors files of a folder: the single file, or the shards the index names.
std::vector<std::string> weight_files(const fs::path & dir) {
    if (const fs::path one = single_file(dir); !one.empty()) return {one.string()};
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

// Buffers, not weights: GPT-2's attention masks and old LLaMA checkpoints' rotary frequencies;
// and a multimodal checkpoint's vision tower (Gemma 3 4B-27B: memfit reads the text model).
bool ignorable(const std::string & name) {
    return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with(".rotary_emb.inv_freq") ||
           name.ends_with(".attention.bias") || name.ends_with(".attention.masked_bias") ||   // GPT-NeoX's masks
           name.starts_with("vision_tower.") || name.starts_with("multi_modal_projector.");
}

// A checkpoint's tensor name as the layout's names go: GPT2LMHeadModel's "transformer." prefix
// dropped; Gemma3ForConditionalGeneration's text model ("language_model.model.", or
// "model.language_model." since transformers 4.52) read as a causal LM's "model.", and its
// vision parts as "vision_tower." / "multi_modal_projector.".
std::string tensor_name_of(const std::string & n) {
    static const std::pair<const char *, const char *> prefixes[] = {
        {"transformer.", ""},
        {"language_model.model.", "model."},
        {"language_model.lm_head.", "lm_head."},
        {"model.language_model.", "model."},
        {"model.vision_tower.", "vision_tower."},
        {"model.multi_modal_projector.", "multi_modal_projector."},
    };
    for (const auto & [from, to] : prefixes)
        if (n.starts_with(from)) return to + n.substr(std::string_view(from).size());
    return n;
}

// The fused tensor parameter i starts, or nullptr: i and the ones after it are the parts, in
// order, of one layer's fused tensor, each [rows, in] and adjacent in the buffer.
const FusedTensor * fused_at(const std::vector<FusedTensor> & fused, const ParamLayout & l, size_t i,
                             std::string & prefix) {
    const std::string & n = l.params[i].name;
    for (const FusedTensor & f : fused) {
        const std::string first = f.parts.front();
        if (!n.ends_with(first) || i + f.parts.size() > l.params.size()) continue;
        prefix = n.substr(0, n.size() - first.size());
        bool all = true;
        for (size_t k = 0; k < f.parts.size() && all; ++k) {
            const ParamInfo & p = l.params[i + k];
            const auto & first_shape = l.params[i].shape;   // matrices of one width, or vectors (biases)
            all = p.name == prefix + f.parts[k] && p.shape.size() == first_shape.size() &&
                  (p.shape.size() == 1 || (p.shape.size() == 2 && p.shape[1] == first_shape[1])) &&
                  (k == 0 || p.offset == l.params[i + k - 1].offset + l.params[i + k - 1].numel);
        }
        if (all) return &f;
    }
    return nullptr;
}

// For a model_type that fuses projections, where the tensor `name` would be: ", a phi3 checkpoint
// holds it in ...qkv_proj.weight"; "" otherwise.
std::string fused_hint(const ModelConfig & cfg, const std::string & name) {
    const LlamaType * type = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    if (!type) return "";
    for (const FusedTensor & f : fused_tensors(*type))
        for (const char * part : f.parts)
            if (name.ends_with(part))
                return fmt::format(": a {} checkpoint holds it fused, in '{}{}'", type->type,
                                   name.substr(0, name.size() - std::string(part).size()), f.name);
    return "";
}

}  // namespace

ParamLayout checkpoint_layout(const ModelConfig & cfg, const ParamLayout & layout) {
    const LlamaType * type = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    if (!type || (!type->fused && tensor_renames(*type).empty())) return layout;
    const std::vector<FusedTensor> & fused = fused_tensors(*type);
    ParamLayout out;
    out.total = layout.total;
    for (size_t i = 0; i < layout.params.size();) {
        std::string prefix;
        const FusedTensor * f = fused_at(fused, layout, i, prefix);
        if (!f) {
            out.params.push_back(layout.params[i++]);
            continue;
        }
        ParamInfo merged{prefix + f->name, layout.params[i].shape, layout.params[i].offset, 0};
        merged.shape[0] = 0;
        for (size_t k = 0; k < f->parts.size(); ++k, ++i) {
            merged.shape[0] += layout.params[i].shape[0];
            merged.numel += layout.params[i].numel;
        }
        out.params.push_back(std::move(merged));
    }
    for (ParamInfo & p : out.params)   // GPT-NeoX's own names
        for (const TensorRename & r : tensor_renames(*type))
            if (const size_t at = p.name.find(r.ours); at != std::string::npos)
                p.name.replace(at, std::string_view(r.ours).size(), r.theirs);
    return out;
}

namespace {
// A by_head fused tensor (GPT-NeoX's query_key_value): rows [part][head][i] in memfit's layout,
// [head][part][i] in the checkpoint; `to` the checkpoint's order, else memfit's.
void permute_by_head(const ModelConfig & cfg, const ParamInfo & p, float * v, bool to) {
    const int64_t H = cfg.n_head, hd = cfg.head_dim(), parts = p.shape[0] / (H * hd);
    const int64_t cols = p.shape.size() == 2 ? p.shape[1] : 1;
    MF_ASSERT(parts * H * hd == p.shape[0] && cfg.kv_heads() == cfg.n_head);
    std::vector<float> src(v, v + p.numel);
    for (int64_t part = 0; part < parts; ++part)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < hd; ++i) {
                const int64_t ours = (part * H + h) * hd + i, theirs = (h * parts + part) * hd + i;
                std::copy_n(src.data() + (to ? ours : theirs) * cols, cols, v + (to ? theirs : ours) * cols);
            }
}

// The tensor, or a PEFT adapter's B or DoRA magnitude on it (rows of its output), of a by_head module.
bool by_head(const ModelConfig & cfg, const std::string & name) {
    const LlamaType * type = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    if (!type) return false;
    for (const FusedTensor & f : fused_tensors(*type)) {
        if (!f.by_head) continue;
        const std::string stem = std::string(f.name).substr(0, std::string(f.name).rfind('.'));
        if (name.ends_with(f.name) || name.ends_with(stem + ".lora_B.weight") ||
            name.ends_with(stem + ".lora_magnitude_vector"))
            return true;
    }
    return false;
}

// Gemma 3's RMSNorms multiply by (1 + w): its checkpoints store w, memfit's layout the multiplier.
float norm_shift(const ModelConfig & cfg, const std::string & name) {
    return cfg.norm_plus_one && name.ends_with("norm.weight") ? 1.0f : 0.0f;
}
}  // namespace

void from_checkpoint(const ModelConfig & cfg, const ParamInfo & p, float * values) {
    if (by_head(cfg, p.name)) permute_by_head(cfg, p, values, false);
    if (const float shift = norm_shift(cfg, p.name); shift != 0)
        for (size_t i = 0; i < p.numel; ++i) values[i] += shift;
}

void to_checkpoint(const ModelConfig & cfg, const ParamInfo & p, float * values, bool gradient) {
    if (by_head(cfg, p.name)) permute_by_head(cfg, p, values, true);
    if (const float shift = gradient ? 0.0f : norm_shift(cfg, p.name); shift != 0)
        for (size_t i = 0; i < p.numel; ++i) values[i] -= shift;
}

std::string checkpoint_tensor_name(const std::string & n) { return tensor_name_of(n); }

std::vector<std::string> hf_weight_files(const std::string & dir) { return weight_files(dir); }

bool has_hf_weights(const std::string & dir) {
    return fs::is_directory(dir) &&
           (!single_file(dir).empty() || fs::exists(fs::path(dir) / "model.safetensors.index.json"));
}

void load_hf_weights(const std::string & dir, const ModelConfig & cfg, const ParamLayout & model_layout, float * params,
                     const std::function<bool(const std::string &)> & skip) {
    const ParamLayout layout = checkpoint_layout(cfg, model_layout);
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    std::map<std::string, std::pair<const SafetensorsFile *, std::string>> found;   // our name -> (file, its name)
    for (const auto & path : weight_files(dir)) {
        files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
        const SafetensorsFile & f = *files.back();
        for (const auto & n : f.names()) {
            std::string ours = tensor_name_of(n);
            if (ignorable(ours) || (skip && skip(ours))) continue;
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
                throw FormatError(fmt::format("{}: unexpected tensor '{}' for the config's model ({}){}", path, n,
                                              cfg.describe(), fused_hint(cfg, ours)));
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
        from_checkpoint(cfg, p, params + p.offset);
    }
}

std::string hf_dtype_name(const std::string & precision) {
    if (precision == "fp32" || precision == "float32" || precision == "F32") return "F32";
    if (precision == "bf16" || precision == "bfloat16" || precision == "BF16") return "BF16";
    if (precision == "fp16" || precision == "float16" || precision == "F16") return "F16";
    return "";
}

namespace {

const char * torch_dtype(const std::string & dtype) {
    return dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32";
}

// One shard's tensors (indices into layout.params) and their bytes.
struct Shard {
    std::vector<size_t> params;
    uint64_t            bytes = 0;
};

// Layout order, a new shard whenever the next tensor would take this one past `max`.
std::vector<Shard> plan_shards(const ParamLayout & layout, size_t elem, uint64_t max) {
    std::vector<Shard> out(1);
    for (size_t i = 0; i < layout.params.size(); ++i) {
        const uint64_t b = uint64_t(layout.params[i].numel) * elem;
        if (!out.back().params.empty() && out.back().bytes + b > max) out.emplace_back();
        out.back().params.push_back(i);
        out.back().bytes += b;
    }
    return out;
}

// The shard's tensors in `dtype`: fp32 pointed at in place (those to_checkpoint changes: copies in
// `shifted`), 16-bit ones converted into `store`.
std::vector<TensorToWrite> shard_tensors(const ModelConfig & cfg, const ParamLayout & layout, const Shard & s,
                                         const float * params, const std::string & dtype,
                                         std::vector<uint16_t> & store, std::list<std::vector<float>> & shifted) {
    std::vector<TensorToWrite> t;
    if (dtype != "F32") store.resize(size_t(s.bytes / 2));
    size_t at = 0;
    for (const size_t i : s.params) {
        const ParamInfo & p = layout.params[i];
        const float * src = params + p.offset;
        if (by_head(cfg, p.name) || norm_shift(cfg, p.name) != 0) {
            std::vector<float> & v = shifted.emplace_back(src, src + p.numel);
            to_checkpoint(cfg, p, v.data());
            src = v.data();
        }
        if (dtype == "F32") {
            t.push_back(TensorToWrite{p.name, "F32", p.shape, src, p.numel * sizeof(float)});
            continue;
        }
        uint16_t * dst = store.data() + at;
        for (size_t k = 0; k < p.numel; ++k) {
            if (dtype == "F16" && std::fabs(src[k]) > 65504.0f)
                throw ConfigError(fmt::format("{} element {} is {:g}, beyond float16's range (65504): export with "
                                              "--dtype bf16 or fp32", p.name, k, double(src[k])));
            dst[k] = dtype == "BF16" ? f32_to_bf16(src[k]) : f32_to_f16(src[k]);
        }
        t.push_back(TensorToWrite{p.name, dtype, p.shape, dst, p.numel * sizeof(uint16_t)});
        at += p.numel;
    }
    return t;
}

// Weight files of an earlier export that this one did not write (a single file after shards, or
// shards after a single file, or more shards than now): transformers would read them first.
void remove_stale_weights(const fs::path & dir, const std::vector<std::string> & written) {
    std::error_code ec;
    for (const auto & e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        const bool weights = n == "model.safetensors" || n == "model.safetensors.index.json" ||
                             (n.starts_with("model-") && n.ends_with(".safetensors") && n.find("-of-") != std::string::npos);
        if (weights && std::find(written.begin(), written.end(), n) == written.end()) fs::remove(e.path(), ec);
    }
}

}  // namespace

HfWritten export_hf(const std::string & dir, const ModelConfig & cfg, const ParamLayout & model_layout,
                    const float * params, const HfWriteOptions & opts) {
    if (cfg.share_layers > 1) {   // a plain model for transformers: every block written out
        MF_ASSERT(model_layout.total == make_param_layout(cfg).total);
        ModelConfig one = cfg;
        one.share_layers = 1;
        const std::vector<float> all = unshared_params(cfg, params);
        return export_hf(dir, one, make_param_layout(one), all.data(), opts);
    }
    const ParamLayout layout = checkpoint_layout(cfg, model_layout);
    const size_t elem = safetensors_dtype_size(opts.dtype);
    if (hf_dtype_name(opts.dtype) != opts.dtype || elem == 0)
        throw ConfigError(fmt::format("export dtype '{}': expected F32, BF16 or F16", opts.dtype));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
    nlohmann::json config = hf_config_json(cfg);
    config["torch_dtype"] = torch_dtype(opts.dtype);
    config.update(opts.config_extra);
    const std::vector<Shard> shards = plan_shards(layout, elem, std::max<uint64_t>(opts.max_shard_bytes, 1));
    HfWritten w;
    nlohmann::json weight_map = nlohmann::json::object();
    std::vector<uint16_t> store;
    std::list<std::vector<float>> shifted;
    for (size_t k = 0; k < shards.size(); ++k) {
        const std::string name = shards.size() == 1 ? std::string("model.safetensors")
                                                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1,
                                                                  shards.size());
        std::vector<TensorToWrite> tensors = shard_tensors(cfg, layout, shards[k], params, opts.dtype, store, shifted);
        if (k + 1 == shards.size()) {
            tensors.insert(tensors.end(), opts.extra.begin(), opts.extra.end());
            for (const auto & t : opts.extra) weight_map[t.name] = name, w.tensor_bytes += t.nbytes;
        }
        write_safetensors((fs::path(dir) / name).string(), tensors, {{"format", "pt"}});
        for (const size_t i : shards[k].params) weight_map[layout.params[i].name] = name;
        w.files.push_back(name);
        w.tensor_bytes += shards[k].bytes;
    }
    if (shards.size() > 1) {
        const nlohmann::json index = {{"metadata", {{"total_size", w.tensor_bytes}}}, {"weight_map", weight_map}};
        write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
        w.files.push_back("model.safetensors.index.json");
    }
    write_file_atomic((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
    remove_stale_weights(dir, w.files);
    return w;
}

}  // namespace memfit
