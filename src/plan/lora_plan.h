// What `memfit plan` needs to know about a LoRA / QLoRA run (model/lora.h), computed once per
// request so that the memory and time models stay O(1) per candidate.
//
// memfit puts the same adapters on every layer (lora_sites), so every figure here is per layer
// except the totals. The frozen base of a layer is its four projections (q|k|v, o, fc | gate|up,
// down), held packed when the base is quantized (make_quant_layout: quant_bytes per matrix,
// padded to 64 bytes), plus its norm gains and biases in the compute dtype; embeddings and the
// LM head always stay in the compute dtype, as in QLoRA.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/lora.h"

namespace memfit {

struct LoraPlan {
    LoraOptions opts;                     // as the engine takes them (EngineOptions::lora)
    int64_t adapters = 0;                 // Ψ_A: trainable parameters of the whole model (lora_param_count)
    int64_t adapters_per_layer = 0;
    int64_t head_adapters = 0;            // the LM head's (target lm_head): r (C + V), beside the last layer
    int64_t embed_adapters = 0;           // the token embedding's (embed_tokens): r (V + C), before the first
    std::array<int64_t, 4> adapters_by_proj{};   // per layer, by Proj: the adapters on that projection
    int64_t projection_params = 0;        // per layer: elements of the four projections
    uint64_t packed_per_layer = 0;        // per layer: bytes of the packed projections (0: dense base)
    std::array<uint64_t, 4> packed{};     // per layer, by Proj
    int64_t largest_projection = 0;       // elements of the largest (fused) projection
    uint32_t adapted = 0;                 // bit (1 << Proj) per projection with an adapter
    int64_t u_cols = 0;                   // per layer: sum of the sites' ranks (the kept u buffers' width)
    int64_t site_cols = 0;                // per layer: sum of the sites' output slices (add/take_columns)
    int64_t max_site_cols = 0;            // the widest site (backward's dd transient)
    int64_t site_in = 0;                  // per layer: sum of the sites' input widths (dropout's traffic)
    int64_t max_site_in = 0;              // the widest input (dropout's transients)
    // DoRA: each site also keeps z [rows, cols] and its norms (f32 [cols]), and backward scales a
    // copy of each adapted projection's output gradient: the widest such output.
    int64_t dora_out_cols = 0, dora_out_total = 0;   // the widest, and their sum (per layer)
    int64_t site_weights = 0;             // per layer: sum of the sites' cols x in (DoRA's norms read them)

    bool quantized() const { return opts.quantized(); }
    bool adapts(Proj p) const { return (adapted >> int(p)) & 1u; }
    // Bytes of one layer's frozen base with activations/weights of s bytes.
    uint64_t layer_base_bytes(int64_t per_layer_params, uint64_t s) const {
        return quantized() ? uint64_t(per_layer_params - projection_params) * s + packed_per_layer
                           : uint64_t(per_layer_params) * s;
    }
};

// Null when `lora` is not enabled.
std::shared_ptr<const LoraPlan> make_lora_plan(const ModelConfig & cfg, const LoraOptions & lora);

// "LoRA rank 16 (alpha 32), targets q,v, base nf4 (double-quantized)" (DoRA: "DoRA rank ..."): the setting as the report
// prints it (a dense base is named by the compute dtype).
std::string lora_description(const LoraPlan & lp, DType compute);

}  // namespace memfit
