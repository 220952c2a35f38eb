// The views of a model's weights (and gradients) into flat buffers: the whole layout, a pipeline
// stage's part, a quantized base's dense part and packed projections, LoRA's adapters.
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/error.h"
#include "model/moe_config.h"
#include "model/transformer.h"

namespace memfit {

namespace {
// A layout's parameters by name, looked up by hash (a scan per name is quadratic in the layers);
// null for a name the layout lacks.
class ByName {
public:
    explicit ByName(const ParamLayout & layout) {
        map_.reserve(layout.params.size());
        for (const ParamInfo & p : layout.params) map_.emplace(p.name, &p);
    }
    const ParamInfo * operator()(const std::string & name) const {
        const auto it = map_.find(name);
        return it == map_.end() ? nullptr : it->second;
    }

private:
    std::unordered_map<std::string_view, const ParamInfo *> map_;
};
}  // namespace

ModelWeights model_weights(const ModelConfig & cfg, const ParamLayout & layout, BufferId flat, DType dtype) {
    const ByName find(layout);
    // The blocks the layout holds (a pipeline stage's few): the others' views are all invalid.
    std::vector<bool> held(size_t(std::max(0, cfg.n_layer)), false);
    for (const ParamInfo & p : layout.params)
        if (const int b = param_block(p.name); b >= 0 && b < cfg.n_layer) held[size_t(b)] = true;
    // A name the layout lacks (a quantized projection of a LoRA base) gives an invalid view.
    auto view = [&](const std::string & name) {
        const ParamInfo * pp = find(name);
        if (!pp) return Tensor{};
        const ParamInfo & p = *pp;
        Tensor t(flat, dtype, {int64_t(p.numel)}, p.offset * dtype_size(dtype));
        t.ndim = int(p.shape.size());
        for (int i = 0; i < t.ndim; ++i) t.shape[i] = p.shape[size_t(i)];
        return t;
    };
    // Adjacent [out, in] matrices as one [sum of outs, in] matrix; adjacent vectors as one
    // vector (Qwen2's q, k and v biases: the fused q|k|v bias).
    auto fused = [&](std::initializer_list<std::string> names) {
        if (!find(*names.begin())) return Tensor{};
        const ParamInfo & first = *find(*names.begin());
        const bool matrix = first.shape.size() == 2;
        size_t end = first.offset;
        int64_t rows = 0;
        for (const auto & n : names) {
            const ParamInfo * pp = find(n);
            MF_ASSERT(pp && "parameter not in layout");
            const ParamInfo & p = *pp;
            MF_ASSERT(p.offset == end && p.shape.size() == first.shape.size() &&
                      (!matrix || p.shape[1] == first.shape[1]));
            end += p.numel;
            rows += p.shape[0];
        }
        if (!matrix) return Tensor(flat, dtype, {rows}, first.offset * dtype_size(dtype));
        return Tensor(flat, dtype, {rows, first.shape[1]}, first.offset * dtype_size(dtype));
    };
    // A mixture of experts' stack of adjacent matrices from the first one's offset.
    auto stacked = [&](const std::string & first, std::initializer_list<int64_t> dims) {
        const ParamInfo * p = find(first);
        if (!p) return Tensor{};
        return Tensor(flat, dtype, dims, p->offset * dtype_size(dtype));
    };
    ModelWeights w;
    if (cfg.llama()) {
        w.wte = view("model.embed_tokens.weight");
        w.lnfw = view("model.norm.weight");
        w.lnfb = view("model.norm.bias");   // GPT-NeoX's (else invalid)
        w.head = cfg.tied_head ? w.wte : view("lm_head.weight");
        for (int l = 0; l < cfg.n_layer; ++l) {
            ModelWeights::Layer y;
            if (!held[size_t(cfg.stored_block(l))]) {
                w.h.push_back(y);
                continue;
            }
            const std::string h = fmt::format("model.layers.{}.", cfg.stored_block(l));   // shared: one per group
            // OLMo 2's norms follow attention and the MLP: ln1 and ln2 are those.
            y.ln1w = view(h + (cfg.post_norm ? "post_attention_layernorm.weight" : "input_layernorm.weight"));
            if (cfg.layer_norm) {   // GPT-NeoX: LayerNorms with biases, every projection biased
                y.ln1b = view(h + "input_layernorm.bias");
                y.ln2b = view(h + "post_attention_layernorm.bias");
                y.projb = view(h + "self_attn.o_proj.bias");
                y.fcb = view(h + "mlp.up_proj.bias");
                y.fcprojb = view(h + "mlp.down_proj.bias");
            }
            y.qkvw = fused({h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"});
            if (cfg.qkv_bias) y.qkvb = fused({h + "self_attn.q_proj.bias", h + "self_attn.k_proj.bias",
                                                   h + "self_attn.v_proj.bias"});
            y.qnw = view(h + "self_attn.q_norm.weight");
            y.knw = view(h + "self_attn.k_norm.weight");
            y.projw = view(h + "self_attn.o_proj.weight");
            y.ln2w = view(h + (cfg.post_norm       ? "post_feedforward_layernorm.weight"
                               : cfg.sandwich_norm ? "pre_feedforward_layernorm.weight"
                                                   : "post_attention_layernorm.weight"));
            if (cfg.sandwich_norm) {   // Gemma 3: and the norms on the attention's and the MLP's outputs
                y.pn1w = view(h + "post_attention_layernorm.weight");
                y.pn2w = view(h + "post_feedforward_layernorm.weight");
            }
            if (cfg.moe_layer(l)) {   // the experts' stacks: [E, 2F, C] gate|up, [E, C, F] down
                const int64_t E = cfg.moe.local_experts(), F = cfg.moe.ffn, C = cfg.n_embd, e0 = cfg.moe.first_expert();
                y.routerw = view(router_param(cfg, h));
                y.fcw = stacked(expert_param(cfg, h, int(e0), ExpertPart::gate), {E, 2 * F, C});
                y.fcprojw = stacked(expert_param(cfg, h, int(e0), ExpertPart::down), {E, C, F});
                y.shw1 = fused({h + "mlp.shared_expert.gate_proj.weight", h + "mlp.shared_expert.up_proj.weight"});
                y.shw2 = view(h + "mlp.shared_expert.down_proj.weight");
                y.shgw = view(h + "mlp.shared_expert_gate.weight");
                w.h.push_back(y);
                continue;
            }
            y.fcw = cfg.gated() ? fused({h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"}) : view(h + "mlp.up_proj.weight");
            y.fcprojw = view(h + "mlp.down_proj.weight");
            w.h.push_back(y);
        }
        return w;
    }
    w.wte = view("wte.weight");
    w.wpe = view("wpe.weight");
    w.lnfw = view("ln_f.weight");
    w.lnfb = view("ln_f.bias");
    w.head = w.wte;
    for (int l = 0; l < cfg.n_layer; ++l) {
        ModelWeights::Layer y;
        if (!held[size_t(cfg.stored_block(l))]) {
            w.h.push_back(y);
            continue;
        }
        const std::string h = fmt::format("h.{}.", cfg.stored_block(l));   // shared: one per group
        y.ln1w = view(h + "ln_1.weight"), y.ln1b = view(h + "ln_1.bias");
        y.qkvw = view(h + "attn.c_attn.weight"), y.qkvb = view(h + "attn.c_attn.bias");
        y.projw = view(h + "attn.c_proj.weight"), y.projb = view(h + "attn.c_proj.bias");
        y.ln2w = view(h + "ln_2.weight"), y.ln2b = view(h + "ln_2.bias");
        y.fcw = view(h + "mlp.c_fc.weight"), y.fcb = view(h + "mlp.c_fc.bias");
        y.fcprojw = view(h + "mlp.c_proj.weight"), y.fcprojb = view(h + "mlp.c_proj.bias");
        w.h.push_back(y);
    }
    return w;
}

ModelWeights quantized_model_weights(const ModelConfig & cfg, const QuantLayout & q, BufferId flat, DType dtype,
                                     BufferId qflat) {
    return quantized_model_weights(cfg, dense_layout(cfg, q), q, flat, dtype, qflat);
}

ModelWeights quantized_model_weights(const ModelConfig & cfg, const ParamLayout & dense, const QuantLayout & q,
                                     BufferId flat, DType dtype, BufferId qflat) {
    ModelWeights w = model_weights(cfg, dense, flat, dtype);
    for (size_t i = 0; i < q.entries.size(); ++i) {
        const QuantEntry & e = q.entries[i];
        if (e.expert > 0) continue;   // the first expert's view spans the stack
        QWeight qw{Tensor(qflat, DType::u8, {int64_t(quant_bytes(e.q))}, e.offset), e.q};
        if (e.expert == 0 && cfg.moe.experts > 1) {   // expert e's bytes at e strides (its entries adjacent)
            const QuantEntry & next = q.entries[i + 1];
            MF_ASSERT(next.expert == 1 && next.proj == e.proj && next.layer == e.layer);
            qw.stride = int64_t(next.offset - e.offset);
            qw.packed = Tensor(qflat, DType::u8, {(cfg.moe.experts - 1) * qw.stride + int64_t(quant_bytes(e.q))}, e.offset);
        }
        auto & y = w.h[size_t(e.layer)];
        switch (e.proj) {
            case Proj::qkv: y.qkvq = qw; break;
            case Proj::o: y.projq = qw; break;
            case Proj::fc: y.fcq = qw; break;
            case Proj::down: y.fcprojq = qw; break;
        }
    }
    return w;
}

ModelWeights lora_model_weights(const ModelConfig & cfg, const LoraOptions & lora, BufferId flat, DType dtype,
                                const QuantLayout & q, BufferId qflat, BufferId adapters, DType adtype) {
    return lora_model_weights(cfg, lora, dense_layout(cfg, q), flat, dtype, q, qflat, make_lora_layout(cfg, lora),
                              adapters, adtype);
}

ModelWeights lora_model_weights(const ModelConfig & cfg, const LoraOptions & lora, const ParamLayout & dense,
                                BufferId flat, DType dtype, const QuantLayout & q, BufferId qflat,
                                const ParamLayout & adapter_layout, BufferId adapters, DType adtype) {
    ModelWeights w;
    if (flat >= 0) w = quantized_model_weights(cfg, dense, q, flat, dtype, qflat);
    else w.h.resize(size_t(cfg.n_layer));
    auto view = [&](const ParamInfo & p) {
        return Tensor(adapters, adtype, {p.shape[0], p.shape[1]}, p.offset * dtype_size(adtype));
    };
    const ByName find(adapter_layout);
    const auto sites = lora_sites(cfg, lora);
    for (size_t i = 0; i < sites.size(); ++i) {
        const LoraSite & s = sites[i];
        const ParamInfo * a = find(peft_name(s, false)), * b = find(peft_name(s, true));
        if (!a || !b) continue;   // another pipeline stage's
        ModelWeights::Adapter ad{s.proj, int(i), view(*a), view(*b), {}};
        if (lora.dora) {
            const ParamInfo * m = find(peft_magnitude_name(s.module));
            MF_ASSERT(m);
            ad.mag = Tensor(adapters, adtype, {m->shape[0]}, m->offset * dtype_size(adtype));
        }
        if (s.head) w.head_adapters.push_back(ad);
        else if (s.embed) w.embed_adapters.push_back(ad);
        else w.h[size_t(s.layer)].adapters.push_back(ad);
    }
    return w;
}

}  // namespace memfit
