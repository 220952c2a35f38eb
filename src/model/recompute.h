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
#include <string_view>
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

// The policies, one row each (kRecomputePolicies in recompute.cpp): every command's flag, help
// text, config key, the planner's models and searches read this table, so a new policy is a row.
struct RecomputePolicy {
    const char * name;      // as users write it ("every" is written every:K)
    const char * help;      // for --help
    enum Kind { uniform, segments, sqrt_segments, budget } kind;
    uint32_t mask = 0;      // uniform: the units every layer keeps
    bool searched = false;  // --fit auto and `memfit plan` try it (uniform policies only)
};
const std::vector<RecomputePolicy> & recompute_policies();
// "none (every unit kept), full (...), ...": the flag's help, from the table.
std::string recompute_help();
// The uniform policies the searches try (none, selective, full).
std::vector<std::string> searched_recompute_policies();

// A policy as the user spelled it, checked against the table (ConfigError naming the choices).
struct Recompute {
    std::string policy = "none";
    int k = 0;                       // every:K
    Recompute() = default;
    Recompute(std::string_view spelled);   // NOLINT: "selective" converts, checked
    Recompute(const char * spelled) : Recompute(std::string_view(spelled)) {}
    Recompute(const std::string & spelled) : Recompute(std::string_view(spelled)) {}
    std::string name() const { return policy == "every" ? "every:" + std::to_string(k) : policy; }
    const RecomputePolicy & info() const;
    // Uniform policies' kept units (the planner's analytic models know only these); ConfigError otherwise.
    uint32_t uniform_mask(const char * who) const;
    bool operator==(const Recompute & o) const { return policy == o.policy && k == o.k; }
    bool operator==(std::string_view s) const { return name() == s; }
    bool operator==(const char * s) const { return name() == s; }
};

// The per-layer plan of a policy for an L-layer model. "budget" needs the budget: see
// recompute_for_budget.
RecomputePlan recompute_plan(const Recompute & r, int n_layer);
inline RecomputePlan parse_recompute(const std::string & policy, int n_layer) {
    return recompute_plan(Recompute(policy), n_layer);
}

// Bytes kept and FLOPs recomputed by one layer under keep mask `mask` (B sequences of T tokens,
// activations stored in `compute`). FLOPs use the same formulas as Graph's op records.
KeepSet layer_keep_cost(const ModelConfig & cfg, int B, int T, bool flash, DType compute, uint32_t mask);

// The per-layer masks of minimum total recompute FLOPs whose kept bytes (sum over layers of
// layer_keep_cost().bytes) are at most `kept_budget`. Keeping nothing always fits.
RecomputePlan recompute_for_budget(const ModelConfig & cfg, int B, int T, bool flash, DType compute,
                                   uint64_t kept_budget);

}  // namespace memfit
