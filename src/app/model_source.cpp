// Reading a model to run: a Hugging Face folder, a PEFT adapter folder on its base, or a training
// checkpoint (app/model_source.h).
#include "app/model_source.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/export.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/json_num.h"
#include "core/json_read.h"
#include "model/gptq_folder.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace memfit {

LoraOptions peft_lora_options(const ModelConfig & cfg, const nlohmann::json & j, const std::string & where) {
    if (!j.is_object()) throw FormatError(fmt::format("{}: not a JSON object", where));
    if (j.value("peft_type", std::string("LORA")) != "LORA")
        throw ConfigError(fmt::format("{}: peft_type {}: memfit reads LoRA adapters", where, j["peft_type"].dump()));
    // What would change the product memfit computes (scale alpha / r on W + B A): refused by name.
    for (const char * k : {"modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform"})
        if (j.contains(k) && !j[k].is_null() && !j[k].empty())
            throw ConfigError(fmt::format("{}: {} {} is not supported (adapters on every layer's listed modules only)",
                                          where, k, j[k].dump()));
    LoraOptions l;
    l.rank = json_get_in<int>(j, "r", where, 1, cfg.n_embd);
    l.alpha = json_get_in<float>(j, "lora_alpha", where, 1e-6f, 1e6f);
    LoraOptions every;
    every.targets = parse_lora_targets(cfg, "all");
    const std::vector<std::string> projections = peft_target_modules(cfg, every);   // PEFT's all-linear: no head
    if (!cfg.tied_head) {   // an untied model's embedding and head are targets too
        every.targets.insert(every.targets.begin(), "embed_tokens");
        every.targets.push_back("lm_head");
    }
    std::vector<std::string> wanted;
    const nlohmann::json & tm = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
    if (tm.is_string() && tm.get<std::string>() == "all-linear") wanted = projections;
    else if (tm.is_array())
        for (const auto & t : tm)
            if (t.is_string()) wanted.push_back(t.get<std::string>());
    if (wanted.empty()) throw FormatError(fmt::format("{}: no target_modules list", where));
    std::vector<std::string> mapped;
    for (const std::string & t : every.targets) {
        LoraOptions one;
        one.targets = {t};
        for (const std::string & m : peft_target_modules(cfg, one))
            if (std::find(wanted.begin(), wanted.end(), m) != wanted.end()) {
                l.targets.push_back(t);
                mapped.push_back(m);
            }
    }
    for (const std::string & m : wanted)
        if (std::find(mapped.begin(), mapped.end(), m) == mapped.end())
            throw ConfigError(fmt::format("{}: target module '{}' is not one of this {} model's projections ({})", where,
                                          m, cfg.family, fmt::join(projections, ", ")));
    // DoRA (use_dora): a lora_magnitude_vector per adapted module (model/lora.h).
    l.dora = j.contains("use_dora") && j["use_dora"].is_boolean() && j["use_dora"].get<bool>();
    l.rslora = j.contains("use_rslora") && j["use_rslora"].is_boolean() && j["use_rslora"].get<bool>();
    for (const std::string & t : l.targets)
        if (l.dora && (t == "lm_head" || t == "embed_tokens"))
            throw ConfigError(fmt::format("{}: use_dora on {}: memfit's DoRA adapts the block projections only", where, t));
    return l;
}

namespace {

// The adapters of a PEFT folder in make_lora_layout's order (PEFT's tensor names), checked.
std::vector<float> read_peft_adapters(const std::string & file, const ModelConfig & cfg, const LoraOptions & l) {
    const SafetensorsFile f = SafetensorsFile::open(file);
    const ParamLayout layout = make_lora_layout(cfg, l);
    std::vector<float> out(layout.total);
    for (const ParamInfo & p : layout.params) {
        if (!f.has(p.name)) throw FormatError(fmt::format("{}: missing tensor '{}'", file, p.name));
        const bool t = peft_transposed(p.name);   // PEFT's [r, V]; memfit holds [V, r]
        const std::vector<int64_t> want = t ? std::vector<int64_t>{p.shape[1], p.shape[0]} : p.shape;
        if (f.info(p.name).shape != want)
            throw FormatError(fmt::format("{}: tensor '{}' has shape [{}], adapter_config.json's r and this model "
                                          "need [{}]", file, p.name, fmt::join(f.info(p.name).shape, ", "),
                                          fmt::join(want, ", ")));
        std::vector<float> v = f.read_f32(p.name);
        if (t) v = transpose_rows(v.data(), want[0], want[1]);
        from_checkpoint(cfg, p, v.data());   // GPT-NeoX's query_key_value B rows: by head in PEFT's file
        if (const NonFinite bad = find_non_finite(v.data(), v.size()))
            throw FormatError(fmt::format("{}: tensor '{}' holds {}", file, p.name, bad.describe()));
        std::copy(v.begin(), v.end(), out.begin() + std::ptrdiff_t(p.offset));
    }
    if (f.names().size() != layout.params.size())
        throw FormatError(fmt::format("{}: {} tensors, adapter_config.json describes {}", file, f.names().size(),
                                      layout.params.size()));
    return out;
}

// The tokenizer a checkpoint's run used, while its files are the ones it recorded ("" if not).
std::string checkpoint_tokenizer(const nlohmann::json & meta) {
    const std::string kind = meta.contains("tokenizer") && meta["tokenizer"].is_string()
                                 ? meta["tokenizer"].get<std::string>() : "";
    if (kind.empty() || kind == "gpt2" || kind == "bytes") return kind;
    const nlohmann::json want = meta.value("tokenizer_files", nlohmann::json::object());
    return !want.empty() && tokenizer_file_digests(kind) == want ? kind : "";
}

}  // namespace

LoadedModel read_model_weights(const std::string & path, const std::string & adapter) {
    LoadedModel w;
    if (has_hf_weights(path) && read_gptq_spec(path)) {
        if (!adapter.empty())
            throw ConfigError(fmt::format("--adapter {}: folding adapters into a GPTQ model ({}) would undo its "
                                          "quantization; generate from the adapters' base in fp16, or train LoRA on "
                                          "the GPTQ folder and generate from that run's checkpoint", adapter, path));
        GptqModel g = read_gptq_folder(path);
        w.cfg = g.cfg;
        w.tokenizer = tokenizer_for_folder(path);
        w.params = std::move(g.params);
        w.quant = std::move(g.layout);
        w.packed = std::move(g.packed);
        w.what = fmt::format("{} ({}-bit GPTQ, groups of {})", path, g.spec.options.bits,
                             g.spec.options.group > 0 ? std::to_string(g.spec.options.group) : "a whole row");
        return w;
    }
    if (has_hf_weights(path)) {
        w.cfg = resolve_model(path + "/");
        w.tokenizer = tokenizer_for_folder(path);
        if (adapter.empty()) {
            w.params.resize(size_t(w.cfg.num_params()));
            load_hf_weights(path, w.cfg, make_param_layout(w.cfg), w.params.data());
            w.what = path;
            return w;
        }
        const std::string config = (fs::path(adapter) / "adapter_config.json").string();
        if (!fs::is_regular_file(config))
            throw IoError(fmt::format("--adapter {}: no adapter_config.json (a folder from memfit export --adapter-only "
                                      "or PEFT's save_pretrained)", adapter));
        const LoraOptions l = peft_lora_options(w.cfg, read_json_file(config), config);
        const std::vector<float> a =
            read_peft_adapters((fs::path(adapter) / "adapter_model.safetensors").string(), w.cfg, l);
        w.params = fold_adapters(w.cfg, l, path, 0, a, "", adapter, path);
        w.what = fmt::format("{} + the {} adapters of {} (rank {} on {})", path, l.dora ? "DoRA" : "LoRA", adapter, l.rank,
                             fmt::join(l.targets, ","));
        return w;
    }
    if (!adapter.empty())
        throw ConfigError(fmt::format("--adapter {}: goes on a base model folder (config.json + model.safetensors); "
                                      "{} is not one", adapter, path));
    std::string dir;
    try {
        dir = find_checkpoint(path);
    } catch (const IoError &) {
        throw IoError(fmt::format("{}: neither a model folder (config.json + model.safetensors, as memfit export "
                                  "writes) nor a training checkpoint (memfit train writes <out>/checkpoints/step-N at "
                                  "its end and every --checkpoint-every N steps)", path));
    }
    const Checkpoint c = load_checkpoint(dir);
    w.cfg = checkpoint_model_config(c, dir);
    if (is_lora_checkpoint(c)) {
        w.params = merged_lora_weights(c, w.cfg, dir);
    } else {
        if (c.state.params.size() != make_param_layout(w.cfg).total)
            throw FormatError(fmt::format("{}: {} parameters, a model of that shape has {}", dir, c.state.params.size(),
                                          make_param_layout(w.cfg).total));
        w.params = c.state.params;
    }
    w.tokenizer = checkpoint_tokenizer(c.meta);
    w.what = dir;
    return w;
}

}  // namespace memfit
