#include "model/param_layout.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"
#include "model/moe_config.h"

namespace memfit {

const ParamInfo * ParamLayout::try_find(const std::string & name) const {
    for (const auto & p : params)
        if (p.name == name) return &p;
    return nullptr;
}

std::vector<float> take_by_name(const ParamLayout & whole, const ParamLayout & part, const float * from) {
    std::vector<float> out(part.total);
    for (const auto & p : part.params) std::copy_n(from + whole.find(p.name).offset, p.numel, out.data() + p.offset);
    return out;
}

void put_by_name(const ParamLayout & whole, const ParamLayout & part, const float * from, float * into) {
    for (const auto & p : part.params) std::copy_n(from + p.offset, p.numel, into + whole.find(p.name).offset);
}

const ParamInfo & ParamLayout::find(const std::string & name) const {
    const ParamInfo * p = try_find(name);
    MF_ASSERT(p && "parameter not in layout");
    return *p;
}

ParamLayout make_param_layout(const ModelConfig & cfg) {
    MF_ASSERT(cfg.vocab_size > 0);
    const int64_t C = cfg.n_embd, V = cfg.vocab_size, P = cfg.max_seq, F = cfg.ffn_dim(), Q = cfg.qkv_dim(),
                  A = cfg.attn_dim();
    ParamLayout l;
    auto add = [&](std::string name, std::vector<int64_t> shape) {
        size_t n = 1;
        for (auto d : shape) n *= size_t(d);
        l.params.push_back(ParamInfo{std::move(name), std::move(shape), l.total, n});
        l.total += n;
    };
    if (cfg.llama()) {
        // q, k, v (and gate, up) are adjacent [out, in] matrices: together they are the fused
        // [(NH + 2 KVH) hd, C] (and [2F, C]) weight one matmul reads.
        const int64_t KV = int64_t(cfg.kv_heads()) * cfg.head_dim();
        add("model.embed_tokens.weight", {V, C});
        for (int i = 0; i < cfg.stored_layers(); ++i) {   // shared blocks once
            const std::string h = fmt::format("model.layers.{}.", i);
            if (!cfg.post_norm) add(h + "input_layernorm.weight", {C});
            if (cfg.layer_norm) add(h + "input_layernorm.bias", {C});   // GPT-NeoX's LayerNorms
            add(h + "self_attn.q_proj.weight", {A, C});
            add(h + "self_attn.k_proj.weight", {KV, C});
            add(h + "self_attn.v_proj.weight", {KV, C});
            if (cfg.qkv_bias) {   // Qwen2: adjacent too, the fused q|k|v bias
                add(h + "self_attn.q_proj.bias", {A});
                add(h + "self_attn.k_proj.bias", {KV});
                add(h + "self_attn.v_proj.bias", {KV});
            }
            if (cfg.qk_norm) {   // RMSNorm over each head of q and of k (Qwen3), or all of them (OLMo 2)
                add(h + "self_attn.q_norm.weight", {cfg.qk_norm_width()});
                add(h + "self_attn.k_norm.weight", {cfg.qk_norm_width()});
            }
            add(h + "self_attn.o_proj.weight", {C, A});
            if (cfg.proj_bias) add(h + "self_attn.o_proj.bias", {C});
            add(h + "post_attention_layernorm.weight", {C});   // OLMo 2, Gemma 3: on the attention's output
            if (cfg.layer_norm) add(h + "post_attention_layernorm.bias", {C});
            if (cfg.sandwich_norm) add(h + "pre_feedforward_layernorm.weight", {C});
            if (cfg.post_norm || cfg.sandwich_norm) add(h + "post_feedforward_layernorm.weight", {C});
            if (cfg.moe_layer(i)) {   // the router, every expert's gate|up (adjacent), then their downs
                // (Expert parallel: this rank's share of the experts, under their own numbers.)
                const int64_t E = cfg.moe.experts, Fe = cfg.moe.ffn;
                const int e0 = cfg.moe.first_expert(), e1 = e0 + cfg.moe.local_experts();
                add(router_param(cfg, h), {E, C});
                for (int e = e0; e < e1; ++e) {
                    add(expert_param(cfg, h, e, ExpertPart::gate), {Fe, C});
                    add(expert_param(cfg, h, e, ExpertPart::up), {Fe, C});
                }
                for (int e = e0; e < e1; ++e) add(expert_param(cfg, h, e, ExpertPart::down), {C, Fe});
                if (const int64_t Fs = cfg.moe.shared_ffn; Fs > 0) {   // Qwen2-MoE: gate|up adjacent
                    add(h + "mlp.shared_expert.gate_proj.weight", {Fs, C});
                    add(h + "mlp.shared_expert.up_proj.weight", {Fs, C});
                    add(h + "mlp.shared_expert.down_proj.weight", {C, Fs});
                    add(h + "mlp.shared_expert_gate.weight", {1, C});
                }
                continue;
            }
            if (cfg.gated()) add(h + "mlp.gate_proj.weight", {F, C});
            add(h + "mlp.up_proj.weight", {F, C});   // GPT-NeoX's ungated MLP: its one input matrix
            if (cfg.proj_bias) add(h + "mlp.up_proj.bias", {F});
            add(h + "mlp.down_proj.weight", {C, F});
            if (cfg.proj_bias) add(h + "mlp.down_proj.bias", {C});
        }
        add("model.norm.weight", {C});
        if (cfg.layer_norm) add("model.norm.bias", {C});
        if (!cfg.tied_head) add("lm_head.weight", {V, C});
    } else {
        add("wte.weight", {V, C});
        add("wpe.weight", {P, C});
        for (int i = 0; i < cfg.stored_layers(); ++i) {   // shared blocks once
            const std::string h = fmt::format("h.{}.", i);
            add(h + "ln_1.weight", {C});
            add(h + "ln_1.bias", {C});
            add(h + "attn.c_attn.weight", {C, Q});
            add(h + "attn.c_attn.bias", {Q});
            add(h + "attn.c_proj.weight", {A, C});
            add(h + "attn.c_proj.bias", {C});
            add(h + "ln_2.weight", {C});
            add(h + "ln_2.bias", {C});
            add(h + "mlp.c_fc.weight", {C, F});
            add(h + "mlp.c_fc.bias", {F});
            add(h + "mlp.c_proj.weight", {F, C});
            add(h + "mlp.c_proj.bias", {C});
        }
        add("ln_f.weight", {C});
        add("ln_f.bias", {C});
    }
    MF_ASSERT(int64_t(l.total) == cfg.num_params());
    return l;
}

namespace {
// Where a name's block number starts, or npos.
size_t block_at(const std::string & name) {
    size_t at = std::string::npos;
    if (const size_t p = name.find("layers."); p != std::string::npos) at = p + 7;
    else if (name.starts_with("h.")) at = 2;
    else if (const size_t q = name.find(".h."); q != std::string::npos) at = q + 3;
    if (at == std::string::npos || at >= name.size() || !std::isdigit(static_cast<unsigned char>(name[at])))
        return std::string::npos;
    return at;
}
}  // namespace

int param_block(const std::string & name) {
    const size_t at = block_at(name);
    return at == std::string::npos ? -1 : std::atoi(name.c_str() + at);
}

std::string in_block(const std::string & name, int block) {
    const size_t at = block_at(name);
    MF_ASSERT(at != std::string::npos);
    size_t end = at;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    return name.substr(0, at) + std::to_string(block) + name.substr(end);
}

std::vector<float> unshared_params(const ModelConfig & cfg, const float * params) {
    ModelConfig one = cfg;
    one.share_layers = 1;
    const ParamLayout shared = make_param_layout(cfg), plain = make_param_layout(one);
    std::vector<float> out(plain.total);
    for (const ParamInfo & p : plain.params) {
        const int b = param_block(p.name);
        const ParamInfo & from = shared.find(b < 0 ? p.name : in_block(p.name, cfg.stored_block(b)));
        MF_ASSERT(from.numel == p.numel);
        std::copy(params + from.offset, params + from.offset + from.numel, out.begin() + std::ptrdiff_t(p.offset));
    }
    return out;
}

}  // namespace memfit
