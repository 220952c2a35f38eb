// `memfit plan --json` (docs/plan.md, "JSON").
#include <fmt/format.h>

#include "plan/launch.h"
#include "plan/lora_plan.h"
#include "plan/plan_report.h"

namespace memfit {

namespace {

nlohmann::json result_json(const PlanRequest & r, const PlanResult & p) {
    nlohmann::json mem = nlohmann::json::object();
    for (size_t c = 0; c < kCategoryCount; ++c) mem[std::string(kCategoryNames[c])] = p.mem.device.v[c];
    nlohmann::json stages = nlohmann::json::array();
    for (const auto & st : p.mem.stages) stages.push_back(st.total());
    const Layout & l = p.c.layout;
    return {{"layout", {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"zero", l.zero}, {"offload", offload_flag(l)}, {"cp", l.cp}, {"ep", l.ep},
                        {"sp", l.sp}, {"schedule", schedule_spelling(l)}}},
            {"micro_batch", p.c.micro_batch}, {"accumulation", p.c.grad_accum}, {"recompute", p.c.recompute.name()},
            {"attention", p.c.flash() ? "flash" : "naive"},
            {"memory", {{"per_device", mem}, {"total", p.mem.total()}, {"host", p.mem.host},
                        {"most_loaded", p.mem.loaded}, {"exact", p.mem.exact}, {"frozen", p.mem.frozen},
                        {"stages", stages}}},
            {"time", {{"step_s", p.time.total}, {"compute_s", p.time.compute}, {"recompute_s", p.time.recompute},
                      {"memory_bound_s", p.time.memory_bound}, {"comm_s", p.time.comm},
                      {"comm_exposed_s", p.time.comm_exposed}, {"bubble_s", p.time.bubble},
                      {"offload_s", p.time.offload}}},
            {"tokens_per_s", p.time.tokens_per_s}, {"mfu", p.time.mfu}, {"fits", p.fits},
            {"why", p.why}, {"runnable", p.runnable()}, {"runnable_why", p.refused},
            {"command", p.fits && p.runnable() ? launch_command(r, p) : std::string()}};
}

nlohmann::json lora_json_of(const PlanRequest & r) {
    if (!r.lora) return nullptr;
    const LoraPlan & lp = *r.lora;
    return {{"rank", lp.opts.rank}, {"alpha", lp.opts.alpha}, {"targets", lp.opts.targets},
            {"base_weights", lp.quantized() ? base_weights_name(lp.opts.base) : dtype_name(r.run.compute)},
            {"double_quant", lp.opts.base == BaseWeights::nf4 && lp.opts.double_quant}, {"dropout", lp.opts.dropout},
            {"trainable_params", lp.adapters}};
}

}  // namespace

nlohmann::json plan_json(const PlanRequest & r, const SearchReport & rep) {
    nlohmann::json best = nlohmann::json::array(), rejected = nlohmann::json::array(),
                   plan_only = nlohmann::json::array();
    for (const auto & p : rep.best) best.push_back(result_json(r, p));
    for (const auto & p : rep.rejected) rejected.push_back(result_json(r, p));
    for (const auto & p : rep.plan_only_best) plan_only.push_back(result_json(r, p));
    return {{"model", r.cfg.name}, {"params", r.cfg.num_params()}, {"hardware", r.hw.name}, {"gpus", r.gpus},
            {"nodes", r.nodes}, {"seq", r.run.seq}, {"global_batch", r.run.global_batch},
            {"precision", std::string(dtype_name(r.run.compute))}, {"lora", lora_json_of(r)},
            {"device_memory", r.hw.memory}, {"usable_memory", r.hw.usable}, {"evaluated", rep.evaluated},
            {"fitting", rep.fitting}, {"pruned_layouts", rep.pruned_layouts}, {"exact_recorded", rep.exact_recorded},
            {"seconds", rep.seconds}, {"include_plan_only", r.include_plan_only}, {"plan_only_fitting", rep.plan_only},
            {"plan_only_fastest", plan_only}, {"exact_means", kExactMeaning},
            {"efficiencies_from", r.hw.efficiencies_from.empty() ? nlohmann::json(nullptr)
                                                                 : nlohmann::json(r.hw.efficiencies_from)},
            {"hint", rep.hint}, {"best", best}, {"rejected", rejected},
            {"closest", rep.closest.empty() ? nlohmann::json(nullptr) : result_json(r, rep.closest.front())}};
}

}  // namespace memfit
