#include "plan/plan_report.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "core/units.h"
#include "plan/lora_plan.h"

namespace memfit {

namespace {

// One letter per category, in bar order.
// parameters, master, optimizer, gradients, activations, workspace, comm, runtime, offloaded (host:
// never in a device's bar), teacher.
constexpr std::string_view kBarLetters = "PMOGAWCRHT";
static_assert(kBarLetters.size() == kCategoryCount);

std::string bar(const CategoryBytes & b, uint64_t capacity, int width) {
    std::string s;
    for (size_t c = 0; c < kCategoryCount; ++c) {
        const int n = int(double(b.v[c]) / double(capacity) * width + 0.5);
        s.append(size_t(std::max(0, n)), kBarLetters[c]);
    }
    if (int(s.size()) > width) s = s.substr(0, size_t(width - 1)) + "!";
    return s + std::string(size_t(std::max(0, width - int(s.size()))), '.');
}

nlohmann::json result_json(const PlanResult & p) {
    nlohmann::json mem = nlohmann::json::object();
    for (size_t c = 0; c < kCategoryCount; ++c) mem[std::string(kCategoryNames[c])] = p.mem.device.v[c];
    nlohmann::json stages = nlohmann::json::array();
    for (const auto & st : p.mem.stages) stages.push_back(st.total());
    const Layout & l = p.c.layout;
    return {{"layout", {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"zero", l.zero},
                        {"offload", l.offload == Offload::none ? "none"
                                    : l.offload == Offload::optimizer ? "optimizer" : "optimizer+params"},
                        {"sp", l.sp},
                        {"schedule", l.schedule == PipeSchedule::gpipe ? "gpipe"
                                     : l.schedule == PipeSchedule::one_f_one_b ? "1f1b"
                                     : fmt::format("interleaved:{}", l.virtual_stages)}}},
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
            {"why", p.why}};
}

// 4194304 -> "4.19M" (and the exact count).
std::string format_count(int64_t n) {
    const double x = double(n);
    const std::string short_form = x >= 1e9 ? fmt::format("{:.2f}B", x / 1e9)
                                   : x >= 1e6 ? fmt::format("{:.2f}M", x / 1e6)
                                   : x >= 1e3 ? fmt::format("{:.1f}K", x / 1e3) : fmt::format("{}", n);
    return fmt::format("{} ({})", short_form, n);
}

nlohmann::json lora_json_of(const PlanRequest & r) {
    if (!r.lora) return nullptr;
    const LoraPlan & lp = *r.lora;
    return {{"rank", lp.opts.rank}, {"alpha", lp.opts.alpha}, {"targets", lp.opts.targets},
            {"base_weights", lp.quantized() ? base_weights_name(lp.opts.base) : dtype_name(r.compute)},
            {"double_quant", lp.opts.base == BaseWeights::nf4 && lp.opts.double_quant}, {"dropout", lp.opts.dropout},
            {"trainable_params", lp.adapters}};
}

}  // namespace

std::string format_plan(const PlanRequest & r, const SearchReport & rep, bool explain) {
    const uint64_t cap = r.hw.memory;
    std::string out = fmt::format(
        "memfit plan: {} ({:.2f}B parameters) on {} x {} ({} per device: {} usable + {} runtime), seq {}, global batch "
        "{}, {}\n",
        r.cfg.name, double(r.cfg.num_params()) / 1e9, r.gpus, r.hw.name, format_bytes(cap), format_bytes(r.hw.usable),
        format_bytes(cap - std::min(cap, r.hw.usable)), r.seq, r.global_batch, dtype_name(r.compute));
    if (r.lora)
        out += fmt::format("  LoRA {}: {} trainable parameters ({:.3f}% of {:.2f}B), the base frozen\n",
                           lora_description(*r.lora, r.compute), format_count(r.lora->adapters),
                           100.0 * double(r.lora->adapters) / double(r.cfg.num_params()),
                           double(r.cfg.num_params()) / 1e9);
    out += fmt::format("  {} configurations evaluated, {} fit, {} layouts pruned on model states alone, {} engine "
                       "programs recorded, in {:.2f} s\n",
                       rep.evaluated, rep.fitting, rep.pruned_layouts, rep.exact_recorded, rep.seconds);
    if (rep.best.empty()) {
        out += "  nothing fits";
        if (!rep.rejected.empty()) out += ": closest, " + rep.rejected.front().why;
        out += std::string("\n  hint: more devices (--min-gpus), a smaller --global-batch or --seq, or ") +
               (!r.lora ? "--offload optimizer\n"
                : r.lora->quantized() ? "a smaller --lora-rank or fewer --lora-targets\n"
                                      : "a packed base (--base-weights nf4)\n");
    } else {
        out += fmt::format("\n  {:<3} {:<50} {:<48} {:>10} {:>9} {:>11} {:>5}  memory per device ({})\n", "#",
                           "layout", "micro-batch x accumulation", "per device", "step s", "tokens/s", "MFU",
                           "P params, M master, O optimizer, G grads, A activations, W workspace, C comm, R runtime, T teacher");
        int i = 0;
        for (const PlanResult & p : rep.best)
            out += fmt::format("  {:<3} {:<50} {:<48} {:>10} {:>9.3f} {:>11.0f} {:>4.0f}%  |{}|{}\n", ++i,
                               layout_name(p.c.layout), technique_name(p.c), format_bytes(p.mem.total()), p.time.total,
                               p.time.tokens_per_s, 100.0 * p.time.mfu, bar(p.mem.device, cap, 40),
                               p.mem.exact ? " exact" : "");
        const PlanResult & b = rep.best.front();
        out += fmt::format("  best: most loaded device is {}; {}", b.mem.loaded,
                           b.mem.host ? fmt::format("{} offloaded to host memory per device; ", format_bytes(b.mem.host))
                                      : std::string());
        out += fmt::format("headroom {}\n", format_bytes(cap - std::min(cap, b.mem.total())));
        for (size_t st = 0; st < b.mem.stages.size(); ++st)
            out += fmt::format("    pipeline stage {}: {} peak live (without runtime)\n", st,
                               format_bytes(b.mem.stages[st].total()));
        if (r.lora)
            out += fmt::format("  parameters on that device: frozen base {}, adapters {}\n", format_bytes(b.mem.frozen),
                               format_bytes(b.mem.device[Category::parameters] - b.mem.frozen));
    }
    if (explain && !rep.rejected.empty()) {
        out += "\n  rejected (fastest first):\n";
        for (const PlanResult & p : rep.rejected)
            out += fmt::format("    {} | {}: {}\n", layout_name(p.c.layout), technique_name(p.c), p.why);
    }
    return out;
}

nlohmann::json plan_json(const PlanRequest & r, const SearchReport & rep) {
    nlohmann::json best = nlohmann::json::array(), rejected = nlohmann::json::array();
    for (const auto & p : rep.best) best.push_back(result_json(p));
    for (const auto & p : rep.rejected) rejected.push_back(result_json(p));
    return {{"model", r.cfg.name}, {"params", r.cfg.num_params()}, {"hardware", r.hw.name}, {"gpus", r.gpus},
            {"nodes", r.nodes}, {"seq", r.seq}, {"global_batch", r.global_batch},
            {"precision", std::string(dtype_name(r.compute))}, {"lora", lora_json_of(r)}, {"device_memory", r.hw.memory},
            {"usable_memory", r.hw.usable}, {"evaluated", rep.evaluated}, {"fitting", rep.fitting},
            {"pruned_layouts", rep.pruned_layouts}, {"exact_recorded", rep.exact_recorded},
            {"seconds", rep.seconds}, {"best", best},
            {"rejected", rejected}};
}

}  // namespace memfit
