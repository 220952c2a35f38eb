// Activation recomputation policies for the transformer chain.
//
// Each layer's forward saves eight units for backward (Saved below). A policy says, per layer,
// which units stay in memory from forward to backward (a bitmask); every dropped unit is
// recomputed once, just before that layer's backward, from its predecessor in the chain
//   input -> ln_1 -> qkv -> attention (out, probs | lse) -> residual_attn -> ln_2 -> fc -> gelu
// (the layer's input is always kept: it is the previous layer's output). Bitwise exact: the
// recompute runs the same kernels on the same inputs. Separately, `segment` K >= 2 keeps only
// every K-th layer's input and recomputes whole segments (Chen et al. 2016).
//
//   none       every unit kept
//   full       nothing kept but the layer input (same as every:1)
//   every:K    segments of K layers
//   sqrt       segments of ceil(sqrt(L)) layers
//   selective  keep the matmul outputs (qkv, attention output, residual, fc); recompute the
//              norms, the T x T probabilities and the GELU (Korthikanti et al. 2022)
//   budget     per layer and per unit, the minimum recompute FLOPs whose kept bytes fit a
//              budget (recompute_for_budget; the engine turns the memory budget into kept bytes)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "memory/keep_choice.h"
#include "model/config.h"

namespace memfit {

enum class Saved : int { ln1, qkv, attn_out, attn_probs, res2, ln2, fc, gelu, count };
constexpr uint32_t kKeepAll = (1u << int(Saved::count)) - 1;
constexpr uint32_t kKeepSelective =
    (1u << int(Saved::qkv)) | (1u << int(Saved::attn_out)) | (1u << int(Saved::res2)) | (1u << int(Saved::fc));

struct RecomputePlan {
    int segment = 0;             // K >= 2: checkpoint every K-th layer input (masks unused)
    std::vector<uint32_t> keep;  // per layer: bitmask of kept Saved units; empty = all kept
    std::string name = "none";   // the policy as the user wrote it (for reports)

    uint32_t kept(int layer) const { return keep.empty() ? kKeepAll : keep[size_t(layer)]; }
    bool keeps(int layer, Saved u) const { return (kept(layer) >> int(u)) & 1u; }
    bool recomputes() const;
};

// none | full | every:K | sqrt | selective for an L-layer model. "budget" needs the budget:
// see recompute_for_budget. Throws ConfigError on anything else.
RecomputePlan parse_recompute(const std::string & policy, int n_layer);

// Bytes kept and FLOPs recomputed by one layer under keep mask `mask` (B sequences of T tokens,
// activations stored in `compute`). FLOPs use the same formulas as Graph's op records.
KeepSet layer_keep_cost(const ModelConfig & cfg, int B, int T, bool flash, DType compute, uint32_t mask);

// The per-layer masks of minimum total recompute FLOPs whose kept bytes (sum over layers of
// layer_keep_cost().bytes) are at most `kept_budget`. Keeping nothing always fits.
RecomputePlan recompute_for_budget(const ModelConfig & cfg, int B, int T, bool flash, DType compute,
                                   uint64_t kept_budget);

}  // namespace memfit
