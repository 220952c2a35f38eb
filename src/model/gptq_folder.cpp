#include "model/gptq_folder.h"

#include <cstring>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/error.h"
#include "core/json_read.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

constexpr const char * kParts[] = {".qweight", ".qzeros", ".scales", ".g_idx"};

bool packed_tensor(const std::string & name) {
    for (const char * p : kParts)
        if (name.ends_with(p)) return true;
    return false;
}

// One module of a packed entry: its file name stem and its columns [col0, col0 + out).
struct Module {
    std::string stem;
    int64_t col0 = 0, out = 0;
};
std::vector<Module> modules_of(const ModelConfig & cfg, const ParamLayout & all, const QuantEntry & e) {
    std::vector<Module> m;
    int64_t col = 0;
    for (const auto & n : e.names) {
        const ParamInfo & p = all.find(n);
        const int64_t out = cfg.llama() ? p.shape[0] : p.shape[1];
        m.push_back({n.substr(0, n.size() - std::string(".weight").size()), col, out});
        col += out;
    }
    return m;
}

void check_writable(const ModelConfig & cfg) {
    if (cfg.share_layers > 1)
        throw ConfigError("a GPTQ folder of a model with shared layers (--share-layers): export it first, then "
                          "quantize the export");
    const ParamLayout all = make_param_layout(cfg);
    if (checkpoint_layout(cfg, all).params.size() != all.params.size())
        throw ConfigError(fmt::format("GPTQ folders of {}: its checkpoints fuse projections memfit keeps apart; "
                                      "not supported", cfg.describe()));
}

// rows x cols elements of `elem` bytes between a fused [rows, out] matrix's columns col0.. (fused)
// and a module's own [rows, cols] (mod).
void to_module(const uint8_t * fused, uint8_t * mod, int64_t rows, int64_t out, int64_t col0, int64_t cols, size_t elem) {
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(mod + size_t(r * cols) * elem, fused + size_t(r * out + col0) * elem, size_t(cols) * elem);
}
void from_module(uint8_t * fused, const uint8_t * mod, int64_t rows, int64_t out, int64_t col0, int64_t cols, size_t elem) {
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(fused + size_t(r * out + col0) * elem, mod + size_t(r * cols) * elem, size_t(cols) * elem);
}

}  // namespace

nlohmann::json gptq_config_json(const GptqSpec & s) {
    const GptqOptions & o = s.options;
    return {{"quant_method", "gptq"},   {"bits", o.bits},
            {"group_size", o.group > 0 ? o.group : -1},
            {"desc_act", o.desc_act},   {"sym", o.sym},
            {"damp_percent", o.damp},   {"static_groups", false},
            {"true_sequential", o.true_sequential}, {"checkpoint_format", "gptq"},
            {"meta", {{"quantizer", {"memfit"}}, {"method", s.method}}}};
}

std::optional<GptqSpec> read_gptq_spec(const std::string & dir) {
    const std::string path = (fs::path(dir) / "config.json").string();
    if (!fs::is_regular_file(path)) return std::nullopt;
    const nlohmann::json j = read_json_file(path);
    if (!j.is_object() || !j.contains("quantization_config")) return std::nullopt;
    const nlohmann::json & q = j["quantization_config"];
    const std::string method = q.is_object() && q.value("quant_method", "") != "" ? q.value("quant_method", "") : "?";
    if (method != "gptq")
        throw ConfigError(fmt::format("{}: quantization_config's quant_method is \"{}\"; memfit reads \"gptq\" folders "
                                      "(or plain ones)", path, method));
    GptqSpec s;
    try {
        s.options.bits = q.value("bits", 4);
        s.options.group = q.value("group_size", 128);
        s.options.desc_act = q.value("desc_act", false);
        s.options.sym = q.value("sym", true);
        s.options.damp = q.value("damp_percent", 0.01);
        s.options.true_sequential = q.value("true_sequential", true);
        if (q.contains("meta") && q["meta"].is_object()) s.method = q["meta"].value("method", "gptq");
    } catch (const nlohmann::json::exception & e) {
        throw FormatError(fmt::format("{}: quantization_config: {}", path, e.what()));
    }
    const std::string fmt_name = q.value("checkpoint_format", "gptq");
    if (fmt_name != "gptq")
        throw ConfigError(fmt::format("{}: checkpoint_format \"{}\"; memfit reads the v1 format \"gptq\" (GPTQModel "
                                      "converts with its v2-to-v1 save)", path, fmt_name));
    if (s.options.bits != 4 && s.options.bits != 8)
        throw ConfigError(fmt::format("{}: {}-bit GPTQ; memfit computes with 4 or 8 bits", path, s.options.bits));
    if (q.value("static_groups", false) && s.options.desc_act)
        throw ConfigError(fmt::format("{}: static_groups with desc_act: not read by memfit", path));
    return s;
}

QuantDesc gptq_proto(const GptqOptions & o) { return QuantDesc{QuantFormat::gptq, 0, 0, o.bits, o.group}; }

QuantLayout gptq_layout(const ModelConfig & cfg, const GptqSpec & s) { return make_quant_layout(cfg, gptq_proto(s.options)); }

uint64_t write_gptq_folder(const std::string & dir, const GptqModel & m, const std::string & dtype,
                           const nlohmann::json & config_extra) {
    check_writable(m.cfg);
    const ParamLayout all = make_param_layout(m.cfg), dense = dense_layout(m.cfg, m.layout);
    MF_ASSERT(m.params.size() == all.total && m.packed.size() == m.layout.bytes);
    std::vector<float> dp(dense.total);
    for (const ParamInfo & p : dense.params)
        std::copy_n(m.params.data() + all.find(p.name).offset, p.numel, dp.data() + p.offset);
    std::list<std::vector<uint8_t>> store;
    HfWriteOptions o;
    o.dtype = dtype;
    for (const QuantEntry & e : m.layout.entries) {
        const GptqQuant L{e.q.out, e.q.in, e.q.bits, e.q.group};
        const int p = L.per_word();
        const uint8_t * base = m.packed.data() + e.offset;
        for (const Module & mod : modules_of(m.cfg, all, e)) {
            auto add = [&](const char * part, const char * dt, std::vector<int64_t> shape, size_t at, int64_t rows,
                           int64_t out, int64_t col0, int64_t cols, size_t elem) {
                std::vector<uint8_t> & b = store.emplace_back(size_t(rows * cols) * elem);
                to_module(base + at, b.data(), rows, out, col0, cols, elem);
                o.extra.push_back(TensorToWrite{mod.stem + part, dt, std::move(shape), b.data(), b.size()});
            };
            add(".qweight", "I32", {e.q.in / p, mod.out}, 0, e.q.in / p, e.q.out, mod.col0, mod.out, 4);
            add(".qzeros", "I32", {L.groups(), mod.out / p}, L.qzeros_at(), L.groups(), e.q.out / p, mod.col0 / p,
                mod.out / p, 4);
            add(".scales", "F16", {L.groups(), mod.out}, L.scales_at(), L.groups(), e.q.out, mod.col0, mod.out, 2);
            add(".g_idx", "I32", {e.q.in}, L.g_idx_at(), 1, e.q.in, 0, e.q.in, 4);
        }
    }
    o.config_extra = config_extra;
    o.config_extra["quantization_config"] = gptq_config_json(m.spec);
    return export_hf(dir, m.cfg, dense, dp.data(), o).tensor_bytes;
}

GptqModel read_gptq_folder(const std::string & dir) {
    GptqModel m;
    const std::optional<GptqSpec> spec = read_gptq_spec(dir);
    if (!spec) throw ConfigError(fmt::format("{}: config.json has no GPTQ quantization_config", dir));
    m.spec = *spec;
    m.cfg = resolve_model(dir + "/");
    check_writable(m.cfg);
    m.layout = gptq_layout(m.cfg, m.spec);
    const ParamLayout all = make_param_layout(m.cfg), dense = dense_layout(m.cfg, m.layout);
    // AutoGPTQ gave every quantized module a bias, zeros where the model has none (its issue
    // #555: the Hub's Llama GPTQ folders hold them): read as nothing, when they are zeros.
    std::set<std::string> no_bias;
    for (const QuantEntry & e : m.layout.entries)
        for (const Module & mod : modules_of(m.cfg, all, e))
            if (!dense.try_find(mod.stem + ".bias")) no_bias.insert(mod.stem + ".bias");
    auto elsewhere = [&](const std::string & n) { return packed_tensor(n) || no_bias.count(n) != 0; };
    std::vector<float> dp(dense.total);
    load_hf_weights(dir, m.cfg, dense, dp.data(), elsewhere);
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    std::map<std::string, std::pair<const SafetensorsFile *, std::string>> found;
    for (const auto & path : hf_weight_files(dir)) {
        files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
        for (const auto & n : files.back()->names()) {
            const std::string ours = checkpoint_tensor_name(n);
            if (packed_tensor(ours)) found[ours] = {files.back().get(), n};
            if (!no_bias.count(ours)) continue;
            for (const float v : files.back()->read_f32(n))
                if (v != 0.0f)
                    throw FormatError(fmt::format("{}: tensor '{}' is a bias with nonzero values, and {} has no bias "
                                                  "there", path, n, m.cfg.describe()));
        }
    }
    m.packed.assign(m.layout.bytes, 0);
    for (const QuantEntry & e : m.layout.entries) {
        const GptqQuant L{e.q.out, e.q.in, e.q.bits, e.q.group};
        const int p = L.per_word();
        uint8_t * base = m.packed.data() + e.offset;
        std::vector<int32_t> g_idx;
        for (const Module & mod : modules_of(m.cfg, all, e)) {
            auto take = [&](const char * part, const char * dt, std::vector<int64_t> shape, size_t at, int64_t rows,
                            int64_t out, int64_t col0, int64_t cols, size_t elem) {
                const auto it = found.find(mod.stem + part);
                if (it == found.end()) throw FormatError(fmt::format("{}: missing tensor '{}{}'", dir, mod.stem, part));
                const auto & info = it->second.first->info(it->second.second);
                if (info.dtype != dt || info.shape != shape)
                    throw FormatError(fmt::format("{}: tensor '{}' is {} [{}]; {}-bit groups of {} need {} [{}]",
                                                  it->second.first->path(), it->second.second, info.dtype,
                                                  fmt::join(info.shape, ", "), e.q.bits, e.q.group, dt,
                                                  fmt::join(shape, ", ")));
                from_module(base + at, info.data, rows, out, col0, cols, elem);
            };
            take(".qweight", "I32", {e.q.in / p, mod.out}, 0, e.q.in / p, e.q.out, mod.col0, mod.out, 4);
            take(".qzeros", "I32", {L.groups(), mod.out / p}, L.qzeros_at(), L.groups(), e.q.out / p, mod.col0 / p,
                 mod.out / p, 4);
            take(".scales", "F16", {L.groups(), mod.out}, L.scales_at(), L.groups(), e.q.out, mod.col0, mod.out, 2);
            take(".g_idx", "I32", {e.q.in}, L.g_idx_at(), 1, e.q.in, 0, e.q.in, 4);
            std::vector<int32_t> gi(size_t(e.q.in));
            std::memcpy(gi.data(), base + L.g_idx_at(), gi.size() * 4);
            for (const int32_t g : gi)
                if (g < 0 || g >= L.groups())
                    throw FormatError(fmt::format("{}: {}.g_idx names group {} of {}", dir, mod.stem, g, L.groups()));
            if (!g_idx.empty() && gi != g_idx)
                throw FormatError(fmt::format("{}: {}.g_idx differs from {}'s; memfit fuses these projections and "
                                              "needs one input order", dir, mod.stem, e.names.front()));
            g_idx = std::move(gi);
        }
    }
    m.params.assign(all.total, 0.0f);
    for (const ParamInfo & p : dense.params)
        std::copy_n(dp.data() + p.offset, p.numel, m.params.data() + all.find(p.name).offset);
    for (const QuantEntry & e : m.layout.entries) {
        std::vector<float> w(size_t(e.q.out * e.q.in));
        GptqQuant{e.q.out, e.q.in, e.q.bits, e.q.group}.dequantize_rows(w.data(), m.packed.data() + e.offset, 0, e.q.out);
        scatter_quant_entry(m.cfg, all, e, w.data(), m.params.data());
    }
    return m;
}

}  // namespace memfit
