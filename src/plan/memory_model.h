// The per-device memory model of `memfit plan`.
//
// Exact, for what memfit's engine runs (one device, no sharding or offload): the step program
// is recorded symbolically and placed by the same arena planner as `memfit train`
// (exact_memory; the caller passes the backend whose workspace sizes apply). For every layout,
// analytic (predict_memory, O(1) in the layer count, for the search), with the engine's own
// sizing functions where they exist:
//
//   model states  Ψ = parameters on the most loaded device: the busiest pipeline stage's
//                 (ceil(L/pp) layers, plus the embedding on the first stage and the head and final
//                 norm on the last, a tied head keeping its own copy there), divided by tp (norm
//                 gains are counted split too: they are < 0.1% of a layer). Bytes per parameter:
//                 weights s (the compute dtype), fp32 master weights 4 when s < 4, optimizer
//                 states 8 (AdamW), 2 (8-bit AdamW), 4 (SGD with momentum), gradients s (4 when
//                 micro-batches accumulate in fp32, as the engine does). ZeRO-1 divides master
//                 weights and optimizer states by dp, ZeRO-2 also gradients, ZeRO-3 also the
//                 weights, and adds two layers' gathered weights (in use and prefetched) to
//                 `communication`. Optimizer offload moves master weights, optimizer states and
//                 gradients to the host (reported as host bytes; gradients stream there bucket
//                 by bucket);
//                 optimizer+params also the weights (two layers stay gathered on the device).
//   activations   per layer and micro-batch, the engine's kept units (layer_keep_cost) for the
//                 recompute policy plus the layer's input; tensor parallelism divides the units
//                 that are split by heads or by the MLP width (qkv, attention output and
//                 probabilities, fc, activation), sequence parallelism also the rest (norm
//                 outputs, residuals, layer inputs) — Korthikanti et al. 2022. The first
//                 pipeline stage holds m micro-batches in flight under GPipe, min(m, pp) under
//                 1F1B, and min(m, pp) (1 + (pp-1)/(pp v)) under interleaving (Narayanan et al.
//                 2021). On top: one layer's backward working set, the recomputed units of one
//                 layer, and the fp32 logits of one micro-batch (split by tp: vocabulary-parallel).
//   workspace     32 MiB of GEMM workspace (cuBLASLt's recommendation for Hopper) on GPUs.
//   communication gradient buckets: two of 25 MB (compute dtype) when dp > 1, plus ZeRO-3's
//                 gathered layers; pipeline send/receive buffers of one micro-batch's boundary
//                 activation each way.
//   runtime       memory - usable (the hardware entry's context and handles).
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "memory/category.h"
#include "model/config.h"
#include "plan/plan_types.h"

namespace memfit {

struct DeviceMemory {
    CategoryBytes device;      // bytes per category on the most loaded device (runtime included)
    uint64_t host = 0;         // bytes offloaded to host memory, per device
    std::string loaded;        // which device that is ("the only device", "first pipeline stage", ...)
    bool exact = false;        // from the engine's own recorded program
    uint64_t total() const { return device.total(); }
};

// Parameters per layer, before the layers (embeddings), and after them (final norm, head).
struct ParamSplit { int64_t per_layer = 0, embed = 0, head = 0; };
ParamSplit param_split(const ModelConfig & cfg);

// Model-state bytes per device, [parameters, master_weights, optimizer_states, gradients].
// `params` is Ψ, the parameters this device holds before ZeRO partitioning.
CategoryBytes model_state_bytes(int64_t params, const Candidate & c);

// Activation bytes one transformer layer keeps for backward under Korthikanti et al. 2022's
// accounting (16-bit activations, naive attention, no norm statistics, and the dropout memfit's
// model does not have: a 1-byte mask after attention and after the MLP, and the attention
// probabilities' mask and dropped-out copy), for tensor parallel degree t with or without
// sequence parallelism. policy: none, attention (their selective: the attention core is
// recomputed) or full. Their Table 2: sbh(34 + 5as/h) for t = 1, sbh(10 + 24/t + 5as/(ht)),
// sbh/t (34 + 5as/h) with sp, sbh(10 + 24/t) and 34 sbh/t selective, 2sbh full.
uint64_t megatron_layer_activation_bytes(const ModelConfig & cfg, int b, int s, int t, bool sp,
                                         const std::string & policy);

DeviceMemory predict_memory(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq);

// The engine's own program for a one-device candidate (layout 1 x 1 x 1, ZeRO 0, no offload),
// recorded and placed, nothing allocated: the peak live bytes per category `memfit train`
// measures, plus the hardware's runtime. `sizing` answers the backend's workspace queries.
DeviceMemory exact_memory(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq,
                          const Backend & sizing);

}  // namespace memfit
