// Expert parallelism's model split (model/expert_parallel.h).
#include "model/expert_parallel.h"

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

ModelConfig ep_local_config(const ModelConfig & cfg, const ExpertParallel & ep) {
    if (ep.ranks <= 1) return cfg;
    if (!cfg.moe.enabled())
        throw ConfigError(fmt::format("--ep {}: {} has no experts to split (expert parallelism is for mixtures of "
                                      "experts)", ep.ranks, cfg.name));
    if (cfg.moe.experts % ep.ranks != 0)
        throw ConfigError(fmt::format("--ep {}: {} experts do not split evenly over {} ranks; pick a divisor of {}",
                                      ep.ranks, cfg.moe.experts, ep.ranks, cfg.moe.experts));
    MF_ASSERT(ep.rank >= 0 && ep.rank < ep.ranks);
    ModelConfig local = cfg;
    local.moe.ep_ranks = ep.ranks;
    local.moe.ep_rank = ep.rank;
    local.moe.capacity_factor = ep.capacity_factor > 0 ? ep.capacity_factor : kDefaultCapacityFactor;
    local.moe.ep_data_ranks = ep.data_ranks > 0 ? ep.data_ranks : ep.ranks;
    local.moe.ep_drop_probs = ep.drop_probs;
    return local;
}

bool is_expert_param(const std::string & name) { return name.find(".experts.") != std::string::npos; }

std::vector<TpRange> ep_dense_ranges(const ParamLayout & local) {
    std::vector<TpRange> out;
    for (const auto & p : local.params) {
        if (is_expert_param(p.name)) continue;
        if (!out.empty() && out.back().b == p.offset) out.back().b += p.numel;
        else out.push_back({p.offset, p.offset + p.numel});
    }
    return out;
}

}  // namespace memfit
