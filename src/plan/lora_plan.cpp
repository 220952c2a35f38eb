#include "plan/lora_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/error.h"

namespace memfit {

std::shared_ptr<const LoraPlan> make_lora_plan(const ModelConfig & cfg, const LoraOptions & lora) {
    if (!lora.enabled()) return nullptr;
    auto lp = std::make_shared<LoraPlan>();
    lp->opts = lora;
    if (lp->opts.targets.empty()) lp->opts.targets = parse_lora_targets(cfg, "");
    const int64_t r = lora.rank;
    for (const LoraSite & s : lora_sites(cfg, lp->opts)) {
        const int64_t n = r * (s.in + s.cols) + (lora.dora ? s.cols : 0);   // DoRA: the magnitude [cols]
        lp->adapters += n;
        if (s.head) lp->head_adapters += n;
        if (s.embed) lp->embed_adapters += n;
        if (s.layer != 0) continue;   // every layer has the same sites (a mixture's dense ones: below)
        lp->adapters_per_layer += n;
        lp->adapters_by_proj[size_t(s.proj)] += n;
        lp->adapted |= 1u << int(s.proj);
        if (s.expert > 0) continue;   // an expert module's buffers: its first expert's, over k rows per token
        const int64_t k = s.expert == 0 ? cfg.moe.top_k : 1;
        lp->u_cols += r * k;
        lp->site_cols += s.cols * k;
        lp->max_site_cols = std::max(lp->max_site_cols, s.cols * k);
        lp->site_in += s.in * k;
        lp->site_weights += s.cols * s.in * k;
        lp->max_site_in = std::max(lp->max_site_in, s.in * k);
    }
    // A mixture of experts with dense layers (mlp_only_layers): the blocks' mean.
    const int64_t blocks = lp->adapters - lp->head_adapters - lp->embed_adapters;
    if (cfg.moe.enabled()) lp->adapters_per_layer = (blocks + cfg.n_layer - 1) / cfg.n_layer;
    else MF_ASSERT(blocks == lp->adapters_per_layer * cfg.n_layer);
    MF_ASSERT(size_t(lp->adapters) == lora_param_count(cfg, lp->opts));
    const int64_t C = cfg.n_embd;
    lp->projection_params = C * (int64_t(cfg.qkv_dim()) + C + int64_t(cfg.fc_dim()) + int64_t(cfg.ffn_dim()));
    if (cfg.moe.enabled())   // a sparse layer's: every expert's gate|up and down
        lp->projection_params = C * (int64_t(cfg.qkv_dim()) + C + 3 * int64_t(cfg.moe.experts) * cfg.moe.ffn);
    lp->largest_projection = C * std::max<int64_t>({cfg.qkv_dim(), C, cfg.fc_dim(), cfg.ffn_dim()});
    for (int p = 0; p < 4 && lora.dora; ++p)
        if (lp->adapts(Proj(p))) {
            lp->dora_out_cols = std::max(lp->dora_out_cols, proj_out_cols(cfg, Proj(p)));
            lp->dora_out_total += proj_out_cols(cfg, Proj(p));
        }
    if (lora.quantized()) {
        const QuantLayout q = make_quant_layout(cfg, lora.quant());
        for (const QuantEntry & e : q.entries)   // a sparse layer's: every expert's
            if (e.layer == 0) lp->packed[size_t(e.proj)] += (quant_bytes(e.q) + 63) / 64 * 64;
        for (uint64_t b : lp->packed) lp->packed_per_layer += b;
        if (cfg.moe.enabled()) lp->packed_per_layer = (q.bytes + uint64_t(cfg.n_layer) - 1) / uint64_t(cfg.n_layer);
        else MF_ASSERT(q.bytes == lp->packed_per_layer * uint64_t(cfg.n_layer));
    }
    return lp;
}

std::string lora_description(const LoraPlan & lp, DType compute) {
    std::string targets;
    for (const auto & t : lp.opts.targets) targets += (targets.empty() ? "" : ",") + t;
    std::string base = lp.quantized() ? base_weights_name(lp.opts.base) : std::string(dtype_name(compute));
    if (lp.opts.base == BaseWeights::nf4 && lp.opts.double_quant) base += " (double-quantized)";
    if (lp.opts.base == BaseWeights::gptq)
        base += lp.opts.gptq_group > 0 ? fmt::format(" ({}-bit, groups of {})", lp.opts.gptq_bits, lp.opts.gptq_group)
                                       : fmt::format(" ({}-bit, one group per row)", lp.opts.gptq_bits);
    return fmt::format("{} rank {} (alpha {:g}{}{}), targets {}, base {}", lp.opts.dora ? "DoRA" : "LoRA", lp.opts.rank,
                       double(lp.opts.alpha), lp.opts.rslora ? ", rsLoRA scale alpha / sqrt(r)" : "",
                       lp.opts.dropout > 0 ? fmt::format(", dropout {:g}", double(lp.opts.dropout)) : std::string(),
                       targets, base);
}

}  // namespace memfit
