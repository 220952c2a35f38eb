#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/json_num.h"
#include "model/hf_weights.h"
#include "model/llama_types.h"
#include "model/moe_config.h"

namespace memfit {

namespace {

// One adaptable module of a layer: its target name, the fused matmul it belongs to and its
// slice of that matmul's output.
struct Module {
    const char * target;
    Proj         proj;
    int64_t      col0, cols, in;
    std::string  hf;   // module name without the layer prefix
};

// Phi-3's checkpoints fuse q|k|v and gate|up, GPT-NeoX's q|k|v (model/llama_types.h): PEFT
// adapts those modules.
bool fused(const ModelConfig & cfg) {
    const LlamaType * t = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    return t && t->fused;
}
bool neox(const ModelConfig & cfg) {
    const LlamaType * t = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    return t && t->neox;
}

std::vector<Module> family_modules(const ModelConfig & cfg) {
    const int64_t C = cfg.n_embd, F = cfg.ffn_dim();
    if (cfg.llama()) {
        const int64_t Q = int64_t(cfg.n_head) * cfg.head_dim(), KV = int64_t(cfg.kv_heads()) * cfg.head_dim();
        if (neox(cfg))   // GPT-NeoX's names; query_key_value's rows are q, k, v here (hf_weights.h)
            return {{"query_key_value", Proj::qkv, 0, 3 * Q, C, "attention.query_key_value"},
                    {"dense", Proj::o, 0, C, Q, "attention.dense"},
                    {"dense_h_to_4h", Proj::fc, 0, F, C, "mlp.dense_h_to_4h"},
                    {"dense_4h_to_h", Proj::down, 0, C, F, "mlp.dense_4h_to_h"}};
        if (fused(cfg))
            return {{"qkv", Proj::qkv, 0, Q + 2 * KV, C, "self_attn.qkv_proj"},
                    {"o", Proj::o, 0, C, Q, "self_attn.o_proj"},
                    {"gate_up", Proj::fc, 0, 2 * F, C, "mlp.gate_up_proj"},
                    {"down", Proj::down, 0, C, F, "mlp.down_proj"}};
        return {{"q", Proj::qkv, 0, Q, C, "self_attn.q_proj"},
                {"k", Proj::qkv, Q, KV, C, "self_attn.k_proj"},
                {"v", Proj::qkv, Q + KV, KV, C, "self_attn.v_proj"},
                {"o", Proj::o, 0, C, Q, "self_attn.o_proj"},
                {"gate", Proj::fc, 0, F, C, "mlp.gate_proj"},
                {"up", Proj::fc, F, F, C, "mlp.up_proj"},
                {"down", Proj::down, 0, C, F, "mlp.down_proj"}};
    }
    // A tensor rank's slice (tp_local_config) has 3 H / T q|k|v columns and H / T attention inputs.
    const int64_t H = cfg.attn_dim();
    return {{"c_attn", Proj::qkv, 0, 3 * H, C, "attn.c_attn"},
            {"attn.c_proj", Proj::o, 0, C, H, "attn.c_proj"},
            {"c_fc", Proj::fc, 0, F, C, "mlp.c_fc"},
            {"mlp.c_proj", Proj::down, 0, C, F, "mlp.c_proj"}};
}

std::string layer_prefix(const ModelConfig & cfg, int l) {
    if (neox(cfg)) return fmt::format("gpt_neox.layers.{}.", l);
    return cfg.llama() ? fmt::format("model.layers.{}.", l) : fmt::format("transformer.h.{}.", l);
}

// The family targets one user-given name selects.
std::vector<std::string> expand_target(const ModelConfig & cfg, std::string t) {
    if (t == "lm_head" || t == "embed_tokens") return {t};   // around the blocks (lora_sites)
    if (t.size() > 5 && t.ends_with("_proj") && cfg.llama()) t.resize(t.size() - 5);   // q_proj -> q
    if (neox(cfg)) {   // LLaMA's names select GPT-NeoX's modules too
        if (t == "q" || t == "k" || t == "v" || t == "qkv" || t == "query_key_value") return {"query_key_value"};
        if (t == "o" || t == "dense") return {"dense"};
        if (t == "gate" || t == "up" || t == "dense_h_to_4h") return {"dense_h_to_4h"};
        if (t == "down" || t == "dense_4h_to_h") return {"dense_4h_to_h"};
        return {};
    }
    if (fused(cfg)) {   // a part names its fused module, as GPT-2's q names c_attn
        if (t == "q" || t == "k" || t == "v" || t == "qkv") return {"qkv"};
        if (t == "gate" || t == "up" || t == "gate_up") return {"gate_up"};
        if (t == "o" || t == "down") return {t};
        return {};
    }
    if (cfg.llama()) {
        // Mixtral's expert matrices (PEFT's target_modules w1, w3, w2): the gate, up and down ones.
        const LlamaType * type = find_llama_type(cfg.model_type);
        if (type && type->moe == MoeNaming::mixtral) {
            if (t == "w1") return {"gate"};
            if (t == "w3") return {"up"};
            if (t == "w2") return {"down"};
        }
        for (const char * n : {"q", "k", "v", "o", "gate", "up", "down"})
            if (t == n) return {t};
        return {};
    }
    if (t == "q" || t == "k" || t == "v" || t == "c_attn") return {"c_attn"};
    if (t == "o" || t == "attn.c_proj") return {"attn.c_proj"};
    if (t == "gate" || t == "up" || t == "c_fc") return {"c_fc"};
    if (t == "down" || t == "mlp.c_proj") return {"mlp.c_proj"};
    if (t == "c_proj") return {"attn.c_proj", "mlp.c_proj"};
    return {};
}

}  // namespace

std::vector<std::string> parse_lora_targets(const ModelConfig & cfg, const std::string & csv) {
    std::vector<std::string> chosen;
    const std::string list = csv.empty() ? (cfg.llama() ? "q,v" : "c_attn") : csv;
    size_t pos = 0;
    while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const std::string t = list.substr(pos, comma - pos);
        pos = comma + 1;
        if (t.empty()) continue;
        if (t == "all") {   // every block projection ("all,lm_head": and the head)
            for (const auto & m : family_modules(cfg)) chosen.push_back(m.target);
            continue;
        }
        const auto names = expand_target(cfg, t);
        if (names.empty())
            throw ConfigError(fmt::format("--lora-targets: '{}' is not a {} module; use {} (or all; lm_head adapts "
                                          "an untied LM head)", t,
                                          fused(cfg) ? cfg.model_type : cfg.llama() ? "LLaMA" : "GPT-2",
                                          neox(cfg)      ? "query_key_value,dense,dense_h_to_4h,dense_4h_to_h (or q,k,v,o,up,down)"
                                          : fused(cfg)   ? "qkv,o,gate_up,down (q,k,v and gate,up name the fused ones)"
                                          : cfg.llama() ? "q,k,v,o,gate,up,down"
                                                        : "q,k,v,o,gate,up,down or c_attn,c_proj,c_fc"));
        chosen.insert(chosen.end(), names.begin(), names.end());
    }
    if (chosen.empty()) throw ConfigError("--lora-targets: no module named");
    // Module order, each once; the head last.
    std::vector<std::string> out;
    auto edge = [&](const char * t) {   // the embedding and the head: untied only
        if (std::find(chosen.begin(), chosen.end(), t) == chosen.end()) return;
        if (neox(cfg))
            throw ConfigError(fmt::format("--lora-targets {}: not for gpt_neox models yet (embed_in, embed_out); "
                                          "adapt the blocks only", t));
        if (cfg.tied_head || !cfg.llama())
            throw ConfigError(fmt::format("--lora-targets {}: model '{}' ties its LM head to the token embedding, "
                                          "which an adapter on one would change in the other too; adapt the blocks "
                                          "only", t, cfg.name));
        out.push_back(t);
    };
    edge("embed_tokens");
    for (const auto & m : family_modules(cfg))
        if (std::find(chosen.begin(), chosen.end(), m.target) != chosen.end()) out.push_back(m.target);
    edge("lm_head");
    return out;
}

BaseWeights parse_base_weights(const std::string & s, const char * flag) {
    if (s == "compute" || s == "fp32" || s == "bf16" || s == "fp16") return BaseWeights::compute;
    if (s == "int8") return BaseWeights::int8;
    if (s == "nf4") return BaseWeights::nf4;
    if (s == "sparse24") return BaseWeights::sparse24;
    // A GPTQ folder's own weights: 4-bit, groups of 128 (the Hub's usual) unless the folder says.
    if (s == "gptq" && std::string_view(flag) == "--base-weights") return BaseWeights::gptq;
    throw ConfigError(fmt::format("{} {}: expected bf16, fp16, fp32, int8, nf4{} or sparse24", flag, s,
                                  std::string_view(flag) == "--base-weights" ? ", gptq" : ""));
}

const char * base_weights_name(BaseWeights b) {
    switch (b) {
        case BaseWeights::compute: return "compute";
        case BaseWeights::int8: return "int8";
        case BaseWeights::nf4: return "nf4";
        case BaseWeights::sparse24: return "sparse24";
        case BaseWeights::gptq: return "gptq";
    }
    return "?";
}

std::string peft_name(const std::string & module, bool b_matrix) {
    return "base_model.model." + module + (b_matrix ? ".lora_B.weight" : ".lora_A.weight");
}

std::string peft_name(const LoraSite & s, bool b_matrix) {
    if (!s.embed) return peft_name(s.module, b_matrix);
    return "base_model.model." + s.module + (b_matrix ? ".lora_embedding_B" : ".lora_embedding_A");
}

std::string peft_magnitude_name(const std::string & module) {
    return "base_model.model." + module + ".lora_magnitude_vector";
}

namespace {
// A sparse layer's sites of target gate, up or down: one per expert, on the expert's own matrix.
void add_expert_sites(const ModelConfig & cfg, int l, const std::string & target, std::vector<LoraSite> & sites) {
    const int64_t C = cfg.n_embd, F = cfg.moe.ffn;
    const ExpertPart part = target == "gate" ? ExpertPart::gate : target == "up" ? ExpertPart::up : ExpertPart::down;
    for (int e = 0; e < cfg.moe.experts; ++e) {
        LoraSite s;
        s.layer = l;
        s.expert = e;
        s.proj = part == ExpertPart::down ? Proj::down : Proj::fc;
        s.col0 = part == ExpertPart::up ? F : 0;
        s.cols = part == ExpertPart::down ? C : F;
        s.in = part == ExpertPart::down ? F : C;
        const std::string name = expert_param(cfg, layer_prefix(cfg, l), e, part);
        s.module = name.substr(0, name.size() - std::string(".weight").size());
        sites.push_back(std::move(s));
    }
}
}  // namespace

std::vector<LoraSite> lora_sites(const ModelConfig & cfg, const LoraOptions & lora) {
    MF_ASSERT(lora.enabled());
    const auto targets = lora.targets.empty() ? parse_lora_targets(cfg, "") : lora.targets;
    std::vector<LoraSite> sites;
    if (std::find(targets.begin(), targets.end(), "embed_tokens") != targets.end()) {
        LoraSite s;
        s.layer = -1;
        s.embed = true;
        s.in = cfg.vocab_size;
        s.cols = cfg.n_embd;
        s.module = "model.embed_tokens";
        sites.push_back(std::move(s));
    }
    for (int l = 0; l < cfg.n_layer; ++l)
        for (const auto & m : family_modules(cfg)) {
            if (std::find(targets.begin(), targets.end(), m.target) == targets.end()) continue;
            if (cfg.moe_layer(l) && (m.proj == Proj::fc || m.proj == Proj::down)) {
                add_expert_sites(cfg, l, m.target, sites);
                continue;
            }
            LoraSite s;
            s.layer = l;
            s.proj = m.proj;
            s.col0 = m.col0;
            s.cols = m.cols;
            s.in = m.in;
            s.module = layer_prefix(cfg, l) + m.hf;
            sites.push_back(std::move(s));
        }
    if (std::find(targets.begin(), targets.end(), "lm_head") != targets.end()) {
        LoraSite s;
        s.layer = cfg.n_layer;
        s.head = true;
        s.cols = cfg.vocab_size;
        s.in = cfg.n_embd;
        s.module = "lm_head";
        sites.push_back(std::move(s));
    }
    size_t at = 0;   // make_lora_layout's order
    for (LoraSite & s : sites) {
        s.a = at++;
        s.b = at++;
        if (lora.dora) s.m = at++;
    }
    return sites;
}

ParamLayout make_lora_layout(const ModelConfig & cfg, const LoraOptions & lora) {
    ParamLayout l;
    const int64_t r = lora.rank;
    auto add = [&](std::string name, int64_t rows, int64_t cols) {
        const size_t n = size_t(rows) * size_t(cols);
        l.params.push_back(ParamInfo{std::move(name), {rows, cols}, l.total, n});
        l.total += n;
    };
    for (const auto & s : lora_sites(cfg, lora)) {
        if (s.embed) add(peft_name(s, false), s.in, r);   // held transposed, [V, r]
        else add(peft_name(s, false), r, s.in);
        add(peft_name(s, true), s.cols, r);
        if (lora.dora) {
            l.params.push_back(ParamInfo{peft_magnitude_name(s.module), {s.cols}, l.total, size_t(s.cols)});
            l.total += size_t(s.cols);
        }
    }
    return l;
}

std::vector<std::string> peft_target_modules(const ModelConfig & cfg, const LoraOptions & lora) {
    const auto targets = lora.targets.empty() ? parse_lora_targets(cfg, "") : lora.targets;
    std::vector<std::string> out;
    if (std::find(targets.begin(), targets.end(), "embed_tokens") != targets.end()) out.push_back("embed_tokens");
    const LlamaType * type = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    const bool mixtral = type && type->moe == MoeNaming::mixtral;
    for (const auto & m : family_modules(cfg))
        if (std::find(targets.begin(), targets.end(), m.target) != targets.end()) {
            // Mixtral's experts are w1, w3, w2 (it has no dense MLP); Qwen's share the dense names.
            static const std::pair<const char *, const char *> kMixtral[] = {{"gate", "w1"}, {"up", "w3"}, {"down", "w2"}};
            std::string name = cfg.llama() ? m.hf.substr(m.hf.find('.') + 1) : m.hf;
            for (const auto & [ours, theirs] : kMixtral)
                if (mixtral && m.target == std::string(ours)) name = theirs;
            out.push_back(name);
        }
    if (std::find(targets.begin(), targets.end(), "lm_head") != targets.end()) out.push_back("lm_head");
    return out;
}

const QuantEntry * QuantLayout::find(int layer, Proj p) const {
    for (const auto & e : entries)
        if (e.layer == layer && e.proj == p) return &e;
    return nullptr;
}

QuantLayout make_quant_layout(const ModelConfig & cfg, const QuantDesc & proto) {
    const QuantFormat format = proto.format;
    QuantLayout q;
    const ParamLayout full = make_param_layout(cfg);
    std::unordered_map<std::string_view, const ParamInfo *> by_name;   // a mixture: thousands of matrices
    for (const ParamInfo & p : full.params) by_name.emplace(p.name, &p);
    for (int l = 0; l < cfg.n_layer; ++l) {
        std::vector<std::pair<Proj, std::vector<std::string>>> groups;
        std::vector<int> experts;   // by group: the expert it holds (-1: none)
        if (cfg.llama()) {
            const std::string h = fmt::format("model.layers.{}.", l);
            groups = {{Proj::qkv, {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"}},
                      {Proj::o, {h + "self_attn.o_proj.weight"}},
                      {Proj::fc, {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"}},
                      {Proj::down, {h + "mlp.down_proj.weight"}}};
            if (!cfg.gated()) groups[2].second = {h + "mlp.up_proj.weight"};   // GPT-NeoX's one MLP input matrix
            if (cfg.moe_layer(l)) {   // each expert's gate|up, then each one's down
                groups.resize(2);
                experts = {-1, -1};
                for (int e = 0; e < cfg.moe.experts; ++e, experts.push_back(e - 1))
                    groups.push_back({Proj::fc, {expert_param(cfg, h, e, ExpertPart::gate), expert_param(cfg, h, e, ExpertPart::up)}});
                for (int e = 0; e < cfg.moe.experts; ++e, experts.push_back(e - 1))
                    groups.push_back({Proj::down, {expert_param(cfg, h, e, ExpertPart::down)}});
            }
        } else {
            const std::string h = fmt::format("h.{}.", l);
            groups = {{Proj::qkv, {h + "attn.c_attn.weight"}},
                      {Proj::o, {h + "attn.c_proj.weight"}},
                      {Proj::fc, {h + "mlp.c_fc.weight"}},
                      {Proj::down, {h + "mlp.c_proj.weight"}}};
        }
        experts.resize(groups.size(), -1);
        for (size_t gi = 0; gi < groups.size(); ++gi) {
            auto & [proj, names] = groups[gi];
            QuantEntry e;
            e.layer = l;
            e.proj = proj;
            e.expert = experts[gi];
            e.q.format = format;
            e.q.bits = proto.bits;
            for (const auto & n : names) {
                const auto found = by_name.find(n);
                MF_ASSERT(found != by_name.end());
                const ParamInfo & p = *found->second;
                // [out, in]: LLaMA's Linear as stored; GPT-2's Conv1D [in, out] transposed.
                const int64_t out = cfg.llama() ? p.shape[0] : p.shape[1], in = cfg.llama() ? p.shape[1] : p.shape[0];
                MF_ASSERT(e.q.in == 0 || e.q.in == in);
                e.q.in = in;
                e.q.out += out;
                if (format == QuantFormat::gptq)   // every module's own tensors are whole int32 columns
                    check_gptq_shape(QuantDesc{format, out, in, proto.bits, proto.group > 0 ? proto.group : int32_t(in)}, n);
            }
            if (format == QuantFormat::gptq) e.q.group = proto.group > 0 ? proto.group : int32_t(e.q.in);
            if ((format == QuantFormat::nf4 || format == QuantFormat::nf4_dq) && (e.q.out * e.q.in) % 64 != 0)
                throw ConfigError(fmt::format("--base-weights nf4: {} has {} x {} elements, not a multiple of the "
                                              "64-element block; use int8", names.front(), e.q.out, e.q.in));
            if (format == QuantFormat::sparse24 && (e.q.in % 4 != 0 || (e.q.out * e.q.in) % 8 != 0))
                throw ConfigError(fmt::format("--base-weights sparse24: {} is {} x {}; 2:4 groups need an input "
                                              "dimension that is a multiple of 4; use int8", names.front(), e.q.out,
                                              e.q.in));
            e.names = std::move(names);
            e.offset = q.bytes;
            q.bytes += (quant_bytes(e.q) + 63) / 64 * 64;   // each matrix 64-byte aligned
            q.entries.push_back(std::move(e));
        }
    }
    return q;
}

ParamLayout dense_layout(const ModelConfig & cfg, const QuantLayout & q) { return dense_part(make_param_layout(cfg), q); }

ParamLayout dense_part(const ParamLayout & layout, const QuantLayout & q) {
    std::unordered_set<std::string_view> held;   // a mixture of experts packs thousands of matrices
    for (const auto & e : q.entries) held.insert(e.names.begin(), e.names.end());
    ParamLayout out;
    for (auto p : layout.params) {
        if (held.count(p.name)) continue;
        p.offset = out.total;
        out.total += p.numel;
        out.params.push_back(std::move(p));
    }
    return out;
}

std::vector<float> gather_quant_entry(const ModelConfig & cfg, const ParamLayout & all, const QuantEntry & e,
                                      const float * full) {
    std::vector<float> m(size_t(e.q.out) * size_t(e.q.in));
    size_t row = 0;
    for (const auto & n : e.names) {
        const ParamInfo & p = all.find(n);
        const float * src = full + p.offset;
        if (cfg.llama()) {
            std::copy(src, src + p.numel, m.data() + row * size_t(e.q.in));
            row += size_t(p.shape[0]);
        } else {
            const size_t in = size_t(p.shape[0]), out = size_t(p.shape[1]);
            for (size_t i = 0; i < in; ++i)
                for (size_t o = 0; o < out; ++o) m[(row + o) * in + i] = src[i * out + o];
            row += out;
        }
    }
    return m;
}

void scatter_quant_entry(const ModelConfig & cfg, const ParamLayout & all, const QuantEntry & e, const float * m,
                         float * full) {
    size_t row = 0;
    for (const auto & n : e.names) {
        const ParamInfo & p = all.find(n);
        float * dst = full + p.offset;
        if (cfg.llama()) {
            std::copy(m + row * size_t(e.q.in), m + row * size_t(e.q.in) + p.numel, dst);
            row += size_t(p.shape[0]);
        } else {
            const size_t in = size_t(p.shape[0]), out = size_t(p.shape[1]);
            for (size_t i = 0; i < in; ++i)
                for (size_t o = 0; o < out; ++o) dst[i * out + o] = m[(row + o) * in + i];
            row += out;
        }
    }
}

nlohmann::json lora_json(const LoraOptions & lora) {
    return {{"r", lora.rank}, {"alpha", lora.alpha}, {"targets", lora.targets},
            {"base_weights", base_weights_name(lora.base)}, {"double_quant", lora.double_quant},
            {"gptq_bits", lora.gptq_bits}, {"gptq_group", lora.gptq_group},
            {"dropout", lora.dropout}, {"use_dora", lora.dora}, {"use_rslora", lora.rslora}};
}

LoraOptions lora_from_json(const nlohmann::json & j, const ModelConfig & cfg, const std::string & what) {
    try {
        LoraOptions l;
        l.rank = json_get<int>(j, "r", what);
        l.alpha = json_get<float>(j, "alpha", what);
        if (l.rank < 1 || l.rank > cfg.n_embd || !(l.alpha > 0))
            throw FormatError(fmt::format("{}: LoRA rank {} / alpha {} out of range", what, l.rank, l.alpha));
        std::string csv;
        for (const auto & t : j.at("targets")) csv += t.get<std::string>() + ",";
        l.targets = parse_lora_targets(cfg, csv);
        l.base = parse_base_weights(j.at("base_weights").get<std::string>());
        l.double_quant = j.at("double_quant").get<bool>();
        l.gptq_bits = j.value("gptq_bits", 4);
        l.gptq_group = j.value("gptq_group", 128);
        l.dropout = j.contains("dropout") ? json_get<float>(j, "dropout", what) : 0.0f;
        if (!(l.dropout >= 0 && l.dropout < 1)) throw FormatError(fmt::format("{}: LoRA dropout {} out of [0, 1)", what, l.dropout));
        l.dora = j.contains("use_dora") && j.at("use_dora").get<bool>();   // older records: plain LoRA
        l.rslora = j.contains("use_rslora") && j.at("use_rslora").get<bool>();
        return l;
    } catch (const nlohmann::json::exception & e) {
        throw FormatError(fmt::format("{}: malformed LoRA record ({})", what, json_error_text(e.what())));
    } catch (const ConfigError & e) {
        throw FormatError(fmt::format("{}: {}", what, e.what()));
    }
}

namespace {

// Output o's row of a block site's adapted weight, W + s B A, in fp32 (W the module's weight in the
// family's storage: LLaMA's row, GPT-2's column, whole modules with col0 = 0).
void adapted_row(const ModelConfig & cfg, const LoraSite & site, const float * W, const float * A, const float * B,
                 int64_t r, float s, int64_t o, std::vector<float> & row) {
    const int64_t in = site.in;
    row.resize(size_t(in));
    for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(B[o * r + k]) * double(A[k * in + i]);
        row[size_t(i)] = (cfg.llama() ? W[o * in + i] : W[i * site.cols + o]) + float(s * d);
    }
}

double row_norm(const std::vector<float> & row) {
    double sq = 0;
    for (float x : row) sq += double(x) * double(x);
    return std::sqrt(sq);
}

// The whole model's weight a site adapts, in `full`, the checkpoint_layout (a fused module's
// parts are adjacent rows: its one entry). Our names are Hugging Face's, without GPT2LMHeadModel's
// "transformer." prefix.
const ParamInfo & site_weight(const ModelConfig & cfg, const ParamLayout & full, const LoraSite & site) {
    std::string name = site.module + ".weight";
    if (!cfg.llama()) name = name.substr(std::string("transformer.").size());
    return full.find(name);
}

}  // namespace

void merge_lora(const ModelConfig & cfg, const LoraOptions & lora, float * w, const float * adapters) {
    const ParamLayout full = checkpoint_layout(cfg, make_param_layout(cfg)), al = make_lora_layout(cfg, lora);
    const int64_t r = lora.rank;
    const float s = lora.scaling();
    std::vector<float> row;
    for (const auto & site : lora_sites(cfg, lora)) {
        const float * A = adapters + al.params[site.a].offset;   // [r, in] (an embedding's [V, r])
        const float * B = adapters + al.params[site.b].offset;   // [cols, r]
        float * W = w + site_weight(cfg, full, site).offset;
        const int64_t in = site.in;
        if (site.embed) {   // E[v, c] += s sum_k A^T[v, k] B[c, k]
            for (int64_t v = 0; v < in; ++v)
                for (int64_t c = 0; c < site.cols; ++c) {
                    double d = 0;
                    for (int64_t k = 0; k < r; ++k) d += double(A[v * r + k]) * double(B[c * r + k]);
                    W[v * site.cols + c] += float(s * d);
                }
            continue;
        }
        for (int64_t o = 0; o < site.cols; ++o) {
            adapted_row(cfg, site, W, A, B, r, s, o, row);
            // DoRA: the row times m / ||row||.
            const double g = lora.dora ? double(adapters[al.params[site.m].offset + size_t(o)]) / row_norm(row) : 1.0;
            for (int64_t i = 0; i < in; ++i)
                (cfg.llama() ? W[o * in + i] : W[i * site.cols + o]) = lora.dora ? float(g * double(row[size_t(i)])) : row[size_t(i)];
        }
    }
}

void init_dora_magnitudes(const ModelConfig & cfg, const LoraOptions & lora, const float * w, float * adapters) {
    MF_ASSERT(lora.dora);
    const ParamLayout full = checkpoint_layout(cfg, make_param_layout(cfg)), al = make_lora_layout(cfg, lora);
    std::vector<float> row;
    for (const auto & site : lora_sites(cfg, lora)) {
        const float * W = w + site_weight(cfg, full, site).offset;
        const float * A = adapters + al.params[site.a].offset, * B = adapters + al.params[site.b].offset;
        float * m = adapters + al.params[site.m].offset;
        for (int64_t o = 0; o < site.cols; ++o) {
            adapted_row(cfg, site, W, A, B, lora.rank, lora.scaling(), o, row);
            m[o] = float(row_norm(row));
        }
    }
}

size_t lora_param_count(const ModelConfig & cfg, const LoraOptions & lora) {
    return lora.enabled() ? make_lora_layout(cfg, lora).total : 0;
}

}  // namespace memfit
