#include "model/moe_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_num.h"

namespace memfit {

namespace {

int int_of(const nlohmann::json & j, const char * key, int fallback, const std::string & name) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (const auto x = json_number<int>(j[key])) return *x;
    throw ConfigError(fmt::format("{}: {} = {} is not an integer in range", name, key, j[key].dump()));
}

float float_of(const nlohmann::json & j, const char * key, float fallback, const std::string & name) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (const auto x = json_number<float>(j[key])) return *x;
    throw ConfigError(fmt::format("{}: {} = {} is not a number in range", name, key, j[key].dump()));
}

bool bool_of(const nlohmann::json & j, const char * key, bool fallback, const std::string & name) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean())
        throw ConfigError(fmt::format("{}: {} = {} must be true or false", name, key, j[key].dump()));
    return j[key].get<bool>();
}

// Each type's Config defaults: experts, top-k, aux coefficient, norm_topk_prob.
struct MoeDefaults {
    const char * type, * experts_key;
    int experts, top_k;
    float aux;
    bool norm_topk;
    bool own_width;   // the experts' width is moe_intermediate_size (else intermediate_size)
    int width;        // its default
};
constexpr MoeDefaults kMoeDefaults[] = {
    {"mixtral", "num_local_experts", 8, 2, 0.001f, true, false, 14336},
    {"qwen2_moe", "num_experts", 60, 4, 0.001f, false, true, 1408},
    {"qwen3_moe", "num_experts", 128, 8, 0.001f, false, true, 768},
    {"olmoe", "num_experts", 64, 8, 0.01f, false, false, 2048},
};

const MoeDefaults & defaults_of(const std::string & type) {
    for (const MoeDefaults & d : kMoeDefaults)
        if (type == d.type) return d;
    MF_UNREACHABLE();
}

// The MoE presets' experts: count, top-k, each one's width, norm_topk_prob, the aux-loss
// coefficient a run from scratch applies (their Config's router_aux_loss_coef), head_dim (0:
// the type's default).
struct MoePreset {
    const char * name;
    int experts, top_k, ffn;
    bool norm_topk;
    float aux;
    int head_dim;
};
constexpr MoePreset kMoePresets[] = {
    {"mixtral-nano", 4, 2, 64, true, 0.01f, 0},      {"qwen3-moe-nano", 8, 2, 32, true, 0.01f, 16},
    {"mixtral-8x7b", 8, 2, 14336, true, 0.001f, 0},  {"qwen3-30b-a3b", 128, 8, 768, true, 0.001f, 128},
    {"qwen3-235b-a22b", 128, 8, 1536, true, 0.001f, 128}, {"olmoe-1b-7b", 64, 8, 1024, false, 0.01f, 0},
    {"qwen1.5-moe-a2.7b", 60, 4, 1408, false, 0.001f, 0},
};

}  // namespace

void apply_moe_preset(const std::string & name, ModelConfig & c) {
    for (const MoePreset & m : kMoePresets)
        if (name == m.name) {
            c.moe.experts = m.experts;
            c.moe.top_k = m.top_k;
            c.moe.ffn = m.ffn;
            c.moe.norm_topk = m.norm_topk;
            c.moe.aux_coef = m.aux;
            if (m.head_dim > 0) c.head_size = m.head_dim;
            if (c.model_type == "qwen2_moe") c.moe.shared_ffn = 4 * m.ffn;   // Qwen1.5-MoE's 5632
        }
}

void parse_moe_fields(const nlohmann::json & j, const LlamaType & t, const std::string & name, ModelConfig & c) {
    const MoeDefaults & d = defaults_of(t.type);
    auto refuse = [&](const char * key, const std::string & why) {
        throw ConfigError(fmt::format("{}: {} = {} is not supported ({})", name, key, j[key].dump(), why));
    };
    MoeConfig & m = c.moe;
    // transformers 5 writes num_local_experts for either spelling of the type's key.
    const char * alt = std::string(d.experts_key) == "num_experts" ? "num_local_experts" : "num_experts";
    m.experts = int_of(j, d.experts_key, int_of(j, alt, d.experts, name), name);
    m.top_k = int_of(j, "num_experts_per_tok", d.top_k, name);
    m.ffn = d.own_width ? int_of(j, "moe_intermediate_size", d.width, name) : c.ffn;
    m.norm_topk = t.moe == MoeNaming::mixtral ? true : bool_of(j, "norm_topk_prob", d.norm_topk, name);
    m.sparse_step = int_of(j, "decoder_sparse_step", 1, name);
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
        if (!j["mlp_only_layers"].is_array()) refuse("mlp_only_layers", "a list of layer indices");
        for (const auto & v : j["mlp_only_layers"]) {
            const auto l = json_number<int>(v);
            if (!l) refuse("mlp_only_layers", "a list of layer indices");
            m.dense_layers.push_back(*l);
        }
    }
    const float aux = float_of(j, "router_aux_loss_coef", d.aux, name);
    const bool on = bool_of(j, "output_router_logits", false, name);
    m.aux_coef = on ? aux : 0.0f;
    m.aux_coef_off = on ? 0.0f : aux;
    m.z_coef = float_of(j, "router_z_loss_coef", 0.0f, name);
    if (float_of(j, "router_jitter_noise", 0.0f, name) != 0.0f)
        refuse("router_jitter_noise", "memfit routes without noise; set it to 0");
    if (j.contains("clip_qkv") && !j["clip_qkv"].is_null()) refuse("clip_qkv", "memfit does not clip q, k and v");
    const bool shared = std::string(t.type) == "qwen2_moe";   // Qwen2MoeConfig's default: 5632
    m.shared_ffn = int_of(j, "shared_expert_intermediate_size", shared ? 5632 : 0, name);
    if (!shared && m.shared_ffn > 0)
        refuse("shared_expert_intermediate_size", fmt::format("{} has no shared experts (qwen2_moe does)", t.type));
}

void add_moe_fields(const ModelConfig & cfg, const LlamaType & t, nlohmann::json & j) {
    const MoeDefaults & d = defaults_of(t.type);
    const MoeConfig & m = cfg.moe;
    j[d.experts_key] = m.experts;
    j["num_experts_per_tok"] = m.top_k;
    if (d.own_width) j["moe_intermediate_size"] = m.ffn;
    else j["intermediate_size"] = m.ffn;
    if (t.moe != MoeNaming::mixtral) j["norm_topk_prob"] = m.norm_topk;
    if (t.moe == MoeNaming::mixtral) j["router_jitter_noise"] = 0.0;
    if (m.shared_ffn > 0) j["shared_expert_intermediate_size"] = m.shared_ffn;
    if (std::string(t.type) != "mixtral" && std::string(t.type) != "olmoe") {
        j["decoder_sparse_step"] = m.sparse_step;
        j["mlp_only_layers"] = m.dense_layers;
    }
    j["output_router_logits"] = m.aux_coef > 0;
    j["router_aux_loss_coef"] = std::stod(fmt::format("{}", m.aux_coef > 0 ? m.aux_coef : m.aux_coef_off));
    if (m.z_coef > 0) j["router_z_loss_coef"] = std::stod(fmt::format("{}", m.z_coef));
}

std::string router_param(const ModelConfig & cfg, const std::string & h) {
    const LlamaType * t = find_llama_type(cfg.model_type);
    return h + (t && t->moe == MoeNaming::mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}

std::string expert_param(const ModelConfig & cfg, const std::string & h, int e, ExpertPart part) {
    const LlamaType * t = find_llama_type(cfg.model_type);
    if (t && t->moe == MoeNaming::mixtral) {
        static constexpr const char * kMixtral[] = {"w1", "w3", "w2"};   // gate, up, down
        return fmt::format("{}block_sparse_moe.experts.{}.{}.weight", h, e, kMixtral[int(part)]);
    }
    static constexpr const char * kQwen[] = {"gate_proj", "up_proj", "down_proj"};
    return fmt::format("{}mlp.experts.{}.{}.weight", h, e, kQwen[int(part)]);
}

void validate_moe(const ModelConfig & cfg, const LlamaType * t) {
    auto bad = [&](const std::string & what) { throw ConfigError(fmt::format("model '{}': {}", cfg.name, what)); };
    const MoeConfig & m = cfg.moe;
    const bool moe_type = t && t->moe != MoeNaming::none;
    if (!moe_type) {
        if (m.experts != 0) bad("experts belong to mixtral, qwen3_moe and olmoe (model_type)");
        return;
    }
    if (m.experts < 1 || m.experts > 4096) bad(fmt::format("{} experts: from 1 to 4096", m.experts));
    if (m.top_k < 1 || m.top_k > m.experts)
        bad(fmt::format("num_experts_per_tok = {} must be from 1 to the {} experts", m.top_k, m.experts));
    if (m.ffn < 1 || m.ffn > (1 << 22)) bad(fmt::format("the experts' intermediate size = {} must be positive", m.ffn));
    if (m.sparse_step < 1) bad(fmt::format("decoder_sparse_step = {} must be positive", m.sparse_step));
    for (int l : m.dense_layers)
        if (l < 0 || l >= cfg.n_layer) bad(fmt::format("mlp_only_layers holds {}, not a layer of {}", l, cfg.n_layer));
    if (!(m.aux_coef >= 0) || !(m.aux_coef_off >= 0) || !(m.z_coef >= 0))
        bad(fmt::format("router_aux_loss_coef = {} and router_z_loss_coef = {} must not be negative",
                        m.aux_coef + m.aux_coef_off, m.z_coef));
    if (cfg.share_layers > 1) bad("shared blocks of a mixture of experts are not supported");
    if (m.shared_ffn < 0 || m.shared_ffn > (1 << 22))
        bad(fmt::format("shared_expert_intermediate_size = {} out of range", m.shared_ffn));
}

}  // namespace memfit
