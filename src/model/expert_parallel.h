// Expert parallelism (Megatron-Core's --expert-model-parallel-size, DeepSpeed-MoE): the experts of
// every sparse layer split over an expert group of R ranks, each holding E / R of them; the
// router, attention, norms, embeddings and head are replicated (data parallel). Each rank routes
// its own tokens over all E experts, sends each expert's rows to the rank holding it and gets the
// outputs back (two all-to-alls each way, model/transformer_ep.cpp).
//
// Every buffer is declared before the step: a rank sends at most C rows to each expert, C =
// moe_capacity_rows(its tokens, k, E, capacity_factor) (backend/moe.h); an expert's rows past C
// are dropped and counted: its least probable by routing weight (Megatron's default "probs" policy)
// or its last in token order ("position").
//
// A rank's share is itself a model: ep_local_config keeps every expert's name (expert 5 is
// "experts.5" on whichever rank holds it) and its flat buffer is make_param_layout(local), mapped
// onto the whole model's by name (take_by_name, put_by_name), so checkpoints and set_params work in
// whole-model terms.
#pragma once

#include <vector>

#include "model/config.h"
#include "model/param_layout.h"
#include "model/tensor_parallel.h"

namespace memfit {

struct ExpertParallel {
    int   ranks = 1, rank = 0;
    float capacity_factor = 0;   // 0: the default, kDefaultCapacityFactor
    int   data_ranks = 0;        // every data-parallel rank (expert groups x their size); 0: ranks
    bool  drop_probs = true;     // past the capacity, drop the least probable (else the last) rows
    bool enabled() const { return ranks > 1; }
};

// Without --moe-capacity-factor: 1.25 times each rank's fair share (the Switch Transformer's
// training factor); what routing sends past it is dropped and counted (moe/dropped).
constexpr float kDefaultCapacityFactor = 1.25f;
inline double ep_capacity_factor(float given) { return given > 0 ? given : kDefaultCapacityFactor; }

// The model rank ep.rank of ep.ranks holds. ConfigError (one line) when the experts do not divide
// by the ranks or the model has none. ep.ranks = 1: cfg itself.
ModelConfig ep_local_config(const ModelConfig & cfg, const ExpertParallel & ep);

// The ranges of a layout that are not an expert's (replicated over the expert group: their
// gradients are summed over it), merged, as [a, b) elements.
std::vector<TpRange> ep_dense_ranges(const ParamLayout & local);
// True for a routed expert's parameter (not the router, not a shared expert).
bool is_expert_param(const std::string & name);

}  // namespace memfit
