#include "app/export.h"

#include <optional>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/file_digest.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/units.h"
#include "data/instruct.h"
#include "model/gptq_folder.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "train/engine.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

// The tokenizer file a checkpoint's "tokenizer" names, its name in an export, and its folder.
struct TokenizerSource {
    std::string file, own;
    fs::path from;
};

std::optional<TokenizerSource> tokenizer_source(const std::string & kind) {
    const std::string sp = sentencepiece_model_path(kind);
    const std::string file = is_tokenizer_json(kind) ? kind : sp;
    if (file.empty()) return std::nullopt;
    return TokenizerSource{file, sp.empty() ? "tokenizer.json" : "tokenizer.model", fs::path(file).parent_path()};
}

const char * const kTokenizerSiblings[] = {"tokenizer_config.json", "chat_template.jinja"};

}  // namespace

nlohmann::json tokenizer_file_digests(const std::string & tokenizer) {
    nlohmann::json out = nlohmann::json::object();
    const std::optional<TokenizerSource> t = tokenizer_source(tokenizer);
    if (!t) return out;
    std::error_code ec;
    if (fs::is_regular_file(t->file, ec)) out[t->own] = file_digest(t->file);
    for (const char * n : kTokenizerSiblings)
        if (fs::is_regular_file(t->from / n, ec)) out[n] = file_digest((t->from / n).string());
    return out;
}

ModelConfig checkpoint_model_config(const Checkpoint & c, const std::string & what) {
    if (!c.meta.contains("model") || !c.meta["model"].is_object())
        throw FormatError(fmt::format("{}: the checkpoint's meta.json has no model", what));
    ModelConfig cfg = parse_hf_config(c.meta["model"], what + "/meta.json");
    cfg.name = c.meta["model"].value("name", cfg.name);
    return cfg;
}

bool is_lora_checkpoint(const Checkpoint & c) { return c.meta.is_object() && c.meta.contains("lora"); }

LoraCheckpointMeta lora_checkpoint_meta(const Checkpoint & c, const ModelConfig & cfg, const std::string & what) {
    const std::string where = what + "/meta.json";
    const nlohmann::json & j = c.meta.at("lora");
    if (!j.is_object()) throw FormatError(fmt::format("{}: \"lora\" is not an object", where));
    LoraCheckpointMeta m;
    m.lora = lora_from_json(j, cfg, where);
    if (!j.contains("base_model") || !j["base_model"].is_string())
        throw FormatError(fmt::format("{}: the LoRA record has no \"base_model\" string", where));
    m.base_model = j["base_model"].get<std::string>();
    if (j.contains(kBaseDigestKey)) {
        if (!j[kBaseDigestKey].is_string())
            throw FormatError(fmt::format("{}: the LoRA record's \"{}\" is not a string", where, kBaseDigestKey));
        m.base_digest = j[kBaseDigestKey].get<std::string>();
    }
    if (m.base_model.empty()) m.seed = json_get<uint64_t>(c.meta, "seed", where);
    const size_t A = lora_param_count(cfg, m.lora);
    if (c.state.params.size() != A || c.state.m.size() != A || c.state.v.size() != A)
        throw FormatError(fmt::format("{}: {} parameters in the state, LoRA rank {} on {} of this model has {} "
                                      "adapter parameters",
                                      what, c.state.params.size(), m.lora.rank, fmt::join(m.lora.targets, ","), A));
    return m;
}

std::vector<float> fold_adapters(const ModelConfig & cfg, const LoraOptions & lora, const std::string & base,
                                 uint64_t seed, const std::vector<float> & adapters, const std::string & want_digest,
                                 const std::string & what, const std::string & recorded_base) {
    if (!base.empty() && !has_hf_weights(base))
        throw IoError(fmt::format("{}: the LoRA base model folder {} holds no model.safetensors (moved or deleted?); "
                                  "pass --base-model DIR with the folder the run trained from",
                                  what, base));
    // The engine the run trained with, minus the activations: its base storage (rounded or
    // quantized) is what the adapters were trained against.
    const std::unique_ptr<Backend> owned = make_backend("cpu");
    Backend & backend = *owned;
    EngineOptions eo;
    eo.B = 1;
    eo.T = 1;
    eo.with_eval = false;
    eo.lora = lora;
    Engine engine(cfg, backend, eo);
    if (base.empty()) {
        engine.init_params(seed);
    } else {
        std::vector<float> full(size_t(cfg.num_params()));
        std::vector<uint8_t> packed;   // a GPTQ base's projections, as the run stored them
        if (lora.base == BaseWeights::gptq) {
            GptqModel g = read_gptq_folder(base);
            full = std::move(g.params);
            packed = std::move(g.packed);
        } else {
            load_hf_weights(base, cfg, make_param_layout(cfg), full.data());
        }
        const std::string got = bytes_digest(full.data(), full.size() * sizeof(float));
        if (!want_digest.empty() && got != want_digest)
            throw ConfigError(fmt::format("{}: the adapters were trained on the base {} (weights digest {}); {} holds "
                                          "other weights (digest {}): pass --base-model with the folder the run "
                                          "trained from",
                                          what, recorded_base, want_digest, base, got));
        engine.set_base(full.data(), packed.empty() ? nullptr : &packed);
    }
    TrainState state;
    state.params = adapters;
    state.m.assign(adapters.size(), 0.0f);
    state.v.assign(adapters.size(), 0.0f);
    state.total = adapters.size();
    engine.import_state(state);
    return engine.merged_weights();
}

std::vector<float> merged_lora_weights(const Checkpoint & c, const ModelConfig & cfg, const std::string & what,
                                       const std::string & base_folder) {
    const LoraCheckpointMeta m = lora_checkpoint_meta(c, cfg, what);
    const std::string base = base_folder.empty() ? m.base_model : base_folder;
    return fold_adapters(cfg, m.lora, base, m.seed, c.state.params, m.base_digest, what, m.base_model);
}

nlohmann::json peft_adapter_config(const ModelConfig & cfg, const LoraOptions & lora, const std::string & base_model) {
    // lora_alpha as an integer when it is one (PEFT's type), else as given.
    nlohmann::json alpha = lora.alpha;
    if (lora.alpha < 1e9f && float(int64_t(lora.alpha)) == lora.alpha) alpha = int64_t(lora.alpha);
    // Only fields every PEFT version since 0.3 accepts (newer ones default the rest), and DoRA's
    // use_dora (PEFT 0.9 on) and use_rslora where they apply.
    nlohmann::json j = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", lora.rank},
            {"lora_alpha", alpha},
            // Training's dropout on the adapters' input (as PEFT's); inference ignores it.
            {"lora_dropout", std::round(double(lora.dropout) * 1e6) / 1e6},
            {"target_modules", peft_target_modules(cfg, lora)},
            {"bias", "none"},
            // GPT-2's projections are Conv1D ([in, out] weights): PEFT needs fan_in_fan_out to merge them.
            {"fan_in_fan_out", !cfg.llama()},
            {"base_model_name_or_path", base_model.empty() ? nlohmann::json() : nlohmann::json(base_model)},
            {"inference_mode", true},
            {"init_lora_weights", true},
            {"layers_to_transform", nullptr},
            {"layers_pattern", nullptr},
            {"modules_to_save", nullptr},
            {"revision", nullptr}};
    if (lora.dora) j["use_dora"] = true;
    if (lora.rslora) j["use_rslora"] = true;   // PEFT 0.7 on
    return j;
}

namespace {

void make_dir(const std::string & dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
}


// The run's tokenizer files beside the model, as save_pretrained writes them: a tokenizer.json
// (or SentencePiece tokenizer.model) with the tokenizer_config.json and chat_template.jinja next to
// it. Only files whose content digest is the one the checkpoint recorded are copied (its path is
// followed as written, so it must still name the run's own file), and a tokenizer.json must read
// as one. Returns what it did, for the export's line ("" for gpt2 and bytes, which need no files).
std::string copy_tokenizer(const nlohmann::json & meta, const std::string & out) {
    const std::string kind = meta.contains("tokenizer") && meta["tokenizer"].is_string() ? meta["tokenizer"].get<std::string>()
                                                                                      : "";
    if (kind.empty() || kind == "gpt2" || kind == "bytes") return "";
    const std::optional<TokenizerSource> t = tokenizer_source(kind);
    if (!t) return fmt::format("; the checkpoint names a tokenizer {} that is neither a tokenizer.json nor a "
                               "tokenizer.model: not copied", kind);
    std::error_code ec;
    if (!fs::is_regular_file(t->file, ec))
        return fmt::format("; the run's tokenizer {} is gone: pass --tokenizer to memfit generate", t->file);
    const nlohmann::json want = meta.value("tokenizer_files", nlohmann::json::object());
    const nlohmann::json have = tokenizer_file_digests(kind);
    if (want.empty() && !unverified_checkpoints_allowed())
        return fmt::format("; the checkpoint records no digest of its tokenizer {}: not copied (pass --tokenizer to "
                           "memfit generate)", t->file);
    if (!want.empty() && (!want.contains(t->own) || !have.contains(t->own) || want[t->own] != have[t->own]))
        return fmt::format("; the tokenizer {} is not the one the run used (its content changed): not copied; pass "
                           "--tokenizer to memfit generate", t->file);
    if (t->own == "tokenizer.json") {
        try {
            read_tokenizer_json(t->file);
        } catch (const Error & e) {
            return fmt::format("; the run's tokenizer does not read as one ({}): not copied", e.what());
        }
    }
    std::vector<std::string> names{t->own};
    for (const char * n : kTokenizerSiblings) names.push_back(n);
    for (const std::string & name : names) {
        const fs::path src = name == t->own ? fs::path(t->file) : t->from / name;
        const bool same = want.empty() || (want.contains(name) && have.contains(name) && want[name] == have[name]);
        if (fs::is_regular_file(src, ec) && same)
            write_file_atomic((fs::path(out) / name).string(), read_whole_file(src.string(), "a tokenizer file", ""));
    }
    return fmt::format("; the tokenizer files from {}", t->from.string());
}

// The tokenizer make_tokenizer takes for an exported folder: its own files (copied from the
// run), else gpt2 when the run used it; "" for bytes or none.
std::string exported_tokenizer_kind(const nlohmann::json & meta, const std::string & out) {
    const std::string own = tokenizer_for_folder(out);
    if (!own.empty()) return own;
    return meta.contains("tokenizer") && meta["tokenizer"] == "gpt2" ? "gpt2" : "";
}

// config.json, the weights and generation_config.json of a model folder; the line's middle part.
std::string write_model_folder(const std::string & out, const ModelConfig & cfg, const float * params,
                               const nlohmann::json & meta, const ExportFormat & format) {
    const std::string precision = !format.dtype.empty() ? format.dtype
                                  : meta.contains("precision") && meta["precision"].is_string()
                                      ? meta["precision"].get<std::string>()
                                      : "fp32";
    HfWriteOptions o;
    o.dtype = hf_dtype_name(precision);
    if (o.dtype.empty())
        throw ConfigError(fmt::format("--dtype {}: expected fp32, bf16 or fp16", precision));
    o.max_shard_bytes = format.max_shard_bytes;
    const nlohmann::json ids = tokenizer_token_ids(exported_tokenizer_kind(meta, out));
    o.config_extra = ids;
    const HfWritten w = export_hf(out, cfg, make_param_layout(cfg), params, o);
    std::string said = fmt::format("{}/config.json and {} ({}, {}{})", out,
                                   w.files.size() == 1 ? out + "/model.safetensors"
                                                       : fmt::format("{} shards with {}/model.safetensors.index.json",
                                                                     w.files.size() - 1, out),
                                   precision, format_bytes(w.tensor_bytes),
                                   w.files.size() == 1 ? "" : fmt::format(", at most {} a shard",
                                                                          format_bytes(format.max_shard_bytes)));
    if (!ids.empty()) {
        write_file_atomic((fs::path(out) / "generation_config.json").string(), ids.dump(2) + "\n");
        said += fmt::format(", generation_config.json (eos {})", ids.value("eos_token_id", nlohmann::json()).dump());
    }
    return said;
}

}  // namespace

nlohmann::json tokenizer_token_ids(const std::string & kind) {
    nlohmann::json j = nlohmann::json::object();
    if (kind.empty() || kind == "bytes") return j;
    const auto tok = make_tokenizer(kind, data_dir());
    int32_t bos = -1, eos = tok->eot_id(), eot = -1, pad = -1;
    try {
        const ChatFormat f = load_chat_format(kind, *tok, "auto");
        bos = f.bos_id;
        eos = f.eos_id >= 0 ? f.eos_id : eos;
        eot = f.end_of_turn_id;
        pad = f.eos_id >= 0 ? f.pad_id : -1;
    } catch (const Error &) {
        // A template or tokenizer_config.json memfit cannot read: the end-of-text id alone.
    }
    if (bos < 0 && kind == "gpt2") bos = eos;   // GPT-2's <|endoftext|> begins and ends a text
    if (bos >= 0) j["bos_token_id"] = bos;
    if (eot >= 0 && eot != eos && eos >= 0) j["eos_token_id"] = {eot, eos};
    else if (eos >= 0 || eot >= 0) j["eos_token_id"] = eos >= 0 ? eos : eot;
    if (pad >= 0) j["pad_token_id"] = pad;
    return j;
}

std::string export_checkpoint(const std::string & path, const std::string & out, ExportMode mode,
                              const std::string & base_model, const ExportFormat & format) {
    try {
        find_checkpoint(path);
    } catch (const IoError & e) {
        throw IoError(fmt::format("{}; memfit train writes checkpoints into <out>/checkpoints: one at the end of the "
                                  "run (unless --save-final false) and one every --checkpoint-every N steps",
                                  e.what()));
    }
    const Checkpoint c = load_checkpoint(path);
    const ModelConfig cfg = checkpoint_model_config(c, path);
    const int step = json_get_in<int>(c.meta, "step", path + "/meta.json", 1, (1 << 30));
    if (!is_lora_checkpoint(c)) {
        if (mode != ExportMode::plain)
            throw ConfigError(fmt::format("{}: {} applies to LoRA checkpoints; this one holds the whole model: drop "
                                          "the flag",
                                          path, mode == ExportMode::merge_lora ? "--merge-lora" : "--adapter-only"));
        if (!base_model.empty())
            throw ConfigError(fmt::format("{}: --base-model applies to LoRA checkpoints; this one holds the whole "
                                          "model: drop the flag", path));
        const ParamLayout layout = make_param_layout(cfg);
        if (layout.total != c.state.params.size())
            throw FormatError(fmt::format("{}: {} parameters, a model of that shape has {}", path,
                                          c.state.params.size(), layout.total));
        make_dir(out);
        const std::string tokenizer = copy_tokenizer(c.meta, out);
        return fmt::format("wrote {} (step {}){}", write_model_folder(out, cfg, c.state.params.data(), c.meta, format),
                           step, tokenizer);
    }
    const LoraCheckpointMeta m = lora_checkpoint_meta(c, cfg, path);
    const std::string what_lora =
        fmt::format("{} rank {} on {}", m.lora.dora ? "DoRA" : "LoRA", m.lora.rank, fmt::join(m.lora.targets, ","));
    const std::string quant = m.lora.quantized() ? quant_format_name(m.lora.format()) : "";
    if (mode == ExportMode::plain)
        throw ConfigError(fmt::format("{} is a LoRA checkpoint ({}; its state holds only the adapters): pass "
                                      "--merge-lora for a plain Hugging Face folder with the adapters folded in, or "
                                      "--adapter-only for a PEFT adapter folder",
                                      path, what_lora));
    if (!base_model.empty() && m.base_model.empty())
        throw ConfigError(fmt::format("{}: --base-model {}: this run's base was the seed's initialisation, not a "
                                      "folder; drop --base-model",
                                      path, base_model));
    const std::string base = base_model.empty() ? m.base_model : fs::absolute(base_model).string();
    const std::string from = base.empty() ? fmt::format("the seed-{} initialisation", m.seed) : base;
    if (mode == ExportMode::merge_lora) {
        const std::vector<float> w = merged_lora_weights(c, cfg, path, base);
        make_dir(out);
        const std::string tokenizer = copy_tokenizer(c.meta, out);
        return fmt::format("wrote {} (step {}): {} merged into the base from {}{}{}",
                           write_model_folder(out, cfg, w.data(), c.meta, format), step, what_lora, from,
                           quant.empty() ? "" : fmt::format(", {}-dequantized as in training", quant), tokenizer);
    }
    if (!format.dtype.empty() && format.dtype != "fp32")
        throw ConfigError(fmt::format("--dtype {} with --adapter-only: PEFT adapter folders are written in fp32 (the "
                                      "adapters are small); drop --dtype", format.dtype));
    make_dir(out);
    const ParamLayout al = make_lora_layout(cfg, m.lora);
    std::vector<TensorToWrite> tensors;
    // PEFT's [r, V] of an embedding's A (memfit holds [V, r]); every tensor as the checkpoint's rows
    // (to_checkpoint: GPT-NeoX's query_key_value B rows interleaved by head).
    std::vector<std::vector<float>> converted;
    converted.reserve(al.params.size());
    for (const ParamInfo & p : al.params) {
        const float * src = c.state.params.data() + p.offset;
        std::vector<int64_t> shape = p.shape;
        std::vector<float> & v = converted.emplace_back(src, src + p.numel);
        to_checkpoint(cfg, p, v.data());
        if (peft_transposed(p.name)) {
            v = transpose_rows(v.data(), p.shape[0], p.shape[1]);
            shape = {p.shape[1], p.shape[0]};
        }
        const float * data = v.data();
        tensors.push_back(TensorToWrite{p.name, "F32", shape, data, p.numel * sizeof(float)});
    }
    write_safetensors((fs::path(out) / "adapter_model.safetensors").string(), tensors,
                      {{"format", "pt"}, {"memfit.base_weights", base_weights_name(m.lora.base)}});
    write_file_atomic((fs::path(out) / "adapter_config.json").string(),
                      peft_adapter_config(cfg, m.lora, base).dump(2) + "\n");
    return fmt::format("wrote {}/adapter_config.json and {}/adapter_model.safetensors (step {}): {}, base {}{}", out,
                       out, step, what_lora, from, quant.empty() ? "" : fmt::format(" ({} in training)", quant));
}

}  // namespace memfit
