#include "plan/plan_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "core/units.h"
#include "plan/launch.h"
#include "plan/lora_plan.h"

namespace memfit {

const char * const kExactMeaning =
    "exact = the byte-exact step program of memfit's engine for this backend, recorded and placed as memfit train "
    "does (measured equal on CPUs; on GPUs the CUDA backend's accounting, measured on one H200); model = the "
    "analytic model (docs/plan.md)";

namespace {

// A space wrap() does not break at ("28.59 GiB").
constexpr char kKeep = '\x1f';

// One letter per category, in bar order.
// parameters, master, optimizer, gradients, activations, workspace, comm, runtime, offloaded (host:
// never in a device's bar), teacher, reference.
constexpr std::string_view kBarLetters = "PMOGAWCRHTF";
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

std::string offload_short(const Layout & l) {
    const std::string o = l.offload == Offload::none ? "" : l.offload == Offload::optimizer ? "opt" : "opt+par";
    if (!l.offload_acts) return o.empty() ? "-" : o;
    return o.empty() ? "act" : o + "+act";
}

std::string schedule_short(const Layout & l) {
    if (l.pp <= 1) return "-";
    if (l.schedule == PipeSchedule::interleaved) return fmt::format("intl:{}", l.virtual_stages);
    return l.schedule == PipeSchedule::gpipe ? "GPipe" : "1F1B";
}

// Tokens/s as the model knows them: to the token where the kind's efficiencies are its own,
// to two significant figures ("~86,000") where they are borrowed from another kind.
std::string speed(const Hardware & hw, double tokens_per_s) {
    if (hw.efficiencies_from.empty() || tokens_per_s < 100) return fmt::format("{:.0f}", tokens_per_s);
    const double mag = std::pow(10.0, std::floor(std::log10(tokens_per_s)) - 1);
    return fmt::format("~{:.0f}", std::round(tokens_per_s / mag) * mag);
}

// 4194304 -> "4.19M (4194304)".
std::string format_count(int64_t n) {
    const double x = double(n);
    const std::string short_form = x >= 1e9 ? fmt::format("{:.2f}B", x / 1e9)
                                   : x >= 1e6 ? fmt::format("{:.2f}M", x / 1e6)
                                   : x >= 1e3 ? fmt::format("{:.1f}K", x / 1e3) : fmt::format("{}", n);
    return fmt::format("{} ({})", short_form, n);
}

std::string plan_kind(const PlanResult & p) { return p.mem.exact ? "exact" : "model"; }

std::string compact_row(const PlanRequest & r, const PlanResult & p, int i) {
    const Layout & l = p.c.layout;
    const std::string cells = fmt::format("{} x {} x {}{}{}", l.dp, l.tp, l.pp, l.cp > 1 ? fmt::format(" cp{}", l.cp) : "",
                                          l.ep > 1 ? fmt::format(" ep{}", l.ep) : "");
    return fmt::format("  {:<4}{:<14}{:>4}  {:<4}{:<7}{:<12}{:<10}{:<10}{:<6}{:>10}{:>9.4g}{:>10}{:>5.0f}%  {}\n",
                       fmt::format("{}{}", i, p.runnable() ? "" : "!"), cells,
                       l.zero, l.sp ? "sp" : "-", schedule_short(l), offload_short(l),
                       fmt::format("{} x {}", p.c.micro_batch, p.c.grad_accum), p.c.recompute.name(),
                       p.c.flash() ? "flash" : "naive", format_bytes(p.mem.total()), p.time.total,
                       speed(r.hw, p.time.tokens_per_s), 100.0 * p.time.mfu, plan_kind(p));
}

// A command over lines of at most kPlanColumns, cut before its flags and continued with " \",
// so that it pastes into a shell as it is printed.
std::string command_lines(const std::string & cmd, size_t indent) {
    std::vector<std::string> parts;
    for (size_t at = 0; at < cmd.size();) {
        size_t next = cmd.find(" --", at + 1);
        if (next == std::string::npos) next = cmd.size();
        parts.push_back(cmd.substr(at, next - at));
        at = next;
    }
    std::string out, line(indent, ' ');
    for (const std::string & p : parts) {
        if (line.size() > indent + 2 && line.size() + p.size() + 2 > kPlanColumns) {
            out += line + " \\\n";
            line = std::string(indent + 1, ' ') + p;   // p starts with its space
        } else {
            line += p;
        }
    }
    return out + line + "\n";
}

std::string table(const PlanRequest & r, const SearchReport & rep, bool wide) {
    std::string out;
    if (wide) {
        size_t w = 50;   // the layout column: as wide as its longest name
        for (const PlanResult & p : rep.best) w = std::max(w, layout_name(p.c.layout).size());
        out += fmt::format("\n  {:<4} {:<{}} {:<48} {:>10} {:>9} {:>11} {:>5}  {:<42} {}\n", "#", "layout", w,
                           "micro-batch x accumulation", "per device", "step s", "tokens/s", "MFU",
                           "memory per device (bar, legend below)", "plan");
        int i = 0;
        for (const PlanResult & p : rep.best) {
            ++i;
            out += fmt::format("  {:<4} {:<{}} {:<48} {:>10} {:>9.3f} {:>11} {:>4.0f}%  |{}| {}\n",
                               fmt::format("{}{}", i, p.runnable() ? "" : "!"), layout_name(p.c.layout), w,
                               technique_name(p.c), format_bytes(p.mem.total()), p.time.total,
                               speed(r.hw, p.time.tokens_per_s), 100.0 * p.time.mfu, bar(p.mem.device, r.hw.memory, 40),
                               plan_kind(p));
        }
        out += "  bar: P params, M master, O optimizer, G grads, A activations, W workspace, C comm, R runtime, T teacher, F frozen reference\n";
    } else {
        out += fmt::format("\n  {:<4}{:<14}{:>4}  {:<4}{:<7}{:<12}{:<10}{:<10}{:<6}{:>10}{:>9}{:>10}{:>6}  {}\n", "#",
                           "dp x tp x pp", "ZeRO", "sp", "pipe", "offload", "batch", "recompute", "attn",
                           "per device", "step s", "tokens/s", "MFU", "plan");
        int i = 0;
        for (const PlanResult & p : rep.best) out += compact_row(r, p, ++i);
    }
    // The rows memfit train refuses, grouped by its reason.
    std::vector<std::pair<std::string, std::vector<int>>> refused;
    for (size_t i = 0; i < rep.best.size(); ++i) {
        const std::string & why = rep.best[i].refused;
        if (why.empty()) continue;
        auto it = std::find_if(refused.begin(), refused.end(), [&](const auto & g) { return g.first == why; });
        if (it == refused.end()) it = refused.insert(refused.end(), {why, {}});
        it->second.push_back(int(i) + 1);
    }
    for (const auto & [why, rows] : refused)
        out += wrap(fmt::format("  {}! memfit train does not run {} yet: {}", fmt::join(rows, ", "),
                                rows.size() > 1 ? "these" : "this", why), 6);
    if (!wide)
        out += wrap("  batch: micro-batch x accumulation per data-parallel rank; pipe: schedule; offload: opt = "
                    "optimizer states, opt+par = also the weights, act = the saved activations; --wide: the whole names and a bar of the bytes",
                    4);
    out += wrap("  plan: " + std::string(kExactMeaning), 4);
    if (const std::string b = borrowed_efficiencies(r.hw); !b.empty())
        out += wrap("  speed: " + b + " (no published run on this kind calibrates it): step s, tokens/s and MFU are "
                    "estimates, a ranking more than a promise", 4);
    return out;
}

// --explain: how the best row's gradients meet the shard when micro-batches accumulate under
// ZeRO 2/3 (train/step.h: each micro-batch's buckets reduce-scattered into the rank's fp32 shard
// as backward finishes them, FSDP's and DeepSpeed's way), so that their bytes do not grow with
// the accumulation; empty otherwise.
std::string gradient_path(const PlanResult & b) {
    const Layout & L = b.c.layout;
    if (L.zero < 2 || L.dp < 2 || b.c.grad_accum < 2) return {};
    return wrap(fmt::format("    gradients: each of the {} micro-batches' buckets ({}) reduce-scattered into this rank's "
                            "fp32 shard as its backward finishes them: {}, the same at any --grad-accum above 1",
                            b.c.grad_accum, precision_name(b.c.compute), format_bytes(b.mem.device[Category::gradients])),
                6);
}

// The best row: where its bytes go, every pipeline stage, and the command that runs it.
std::string best_block(const PlanRequest & r, const SearchReport & rep) {
    const uint64_t cap = r.hw.memory;
    const PlanResult & b = rep.best.front();
    std::string out = "\n";
    out += wrap(fmt::format("  best (#1): most loaded device is {}; {}headroom {}", b.mem.loaded,
                                              b.mem.host ? fmt::format("{} offloaded to host memory per device; ",
                                                                       format_bytes(b.mem.host))
                                                         : std::string(),
                                              format_bytes(cap - std::min(cap, b.mem.total()))), 4);
    std::string cats;
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (b.mem.device.v[c] > 0)
            cats += fmt::format("{}{} {}", cats.empty() ? "" : ", ", kCategoryNames[c],
                                format_bytes(b.mem.device.v[c]));
    out += wrap("    " + cats, 4);
    out += fmt::format("    |{}|\n", bar(b.mem.device, cap, 80));
    for (size_t st = 0; st < b.mem.stages.size(); ++st)
        out += fmt::format("    pipeline stage {}: {} peak live (without runtime)\n", st,
                           format_bytes(b.mem.stages[st].total()));
    if (r.lora)   // ZeRO-3 shards the base like the adapters and gathers a layer's weights at a time
        out += fmt::format("    parameters on that device: frozen base {}{}, {} {}\n", format_bytes(b.mem.frozen),
                           b.c.layout.zero >= 3 ? " (its shard)" : "",
                           b.c.layout.zero >= 3 ? "adapters' shard and the weights gathered at a time" : "adapters",
                           format_bytes(b.mem.device[Category::parameters] - b.mem.frozen));
    if (r.explain) out += gradient_path(b);
    if (b.runnable()) {
        out += "  run it (with --data DIR from memfit prepare, and --steps N):\n";
        out += command_lines(launch_command(r, b), 4);
    }
    return out;
}

std::string header(const PlanRequest & r, const SearchReport & rep) {
    const uint64_t cap = r.hw.memory;
    std::string out = fmt::format("memfit plan: {} ({:.2f}B parameters), seq {}, {}, {}\n", r.cfg.name,
                                  double(r.cfg.num_params()) / 1e9, r.run.seq,
                                  r.run.global_batch > 0 ? fmt::format("global batch {}", r.run.global_batch)
                                                         : std::string("global batch micro-batch x accumulation x dp"),
                                  dtype_name(r.run.compute));
    out += fmt::format("  on {} x {}{} ({} per device: {} usable + {} runtime)\n", r.gpus, r.hw.name,
                       r.nodes > 1 ? fmt::format(" in {} nodes", r.nodes) : std::string(), format_bytes(cap),
                       format_bytes(r.hw.usable), format_bytes(cap - std::min(cap, r.hw.usable)));
    if (r.lora)
        out += wrap(fmt::format("  {}: {} trainable parameters ({:.3f}% of {:.2f}B), the base frozen",
                                lora_description(*r.lora, r.run.compute), format_count(r.lora->adapters),
                                100.0 * double(r.lora->adapters) / double(r.cfg.num_params()),
                                double(r.cfg.num_params()) / 1e9), 4);
    out += wrap(fmt::format("  {} configurations evaluated, {} fit, {} layouts pruned on model states alone, {} engine "
                            "programs recorded, {}",
                            rep.evaluated, rep.fitting, rep.pruned_layouts, rep.exact_recorded,
                            fmt::format("{:.2f} s", rep.seconds)), 4);
    if (rep.plan_only > 0 && !r.include_plan_only)
        out += wrap(fmt::format("  {} more fit in layouts memfit train does not run yet (--include-plan-only lists "
                                "them)", rep.plan_only), 4);
    return out;
}

}  // namespace

std::string wrap(const std::string & text, size_t indent, size_t width) {
    // A number and its unit stay on one line ("28.59 GiB", "0.11 s").
    std::string kept = text;
    for (size_t i = 1; i + 1 < kept.size(); ++i) {
        if (kept[i] != ' ' || !std::isdigit(static_cast<unsigned char>(kept[i - 1]))) continue;
        const size_t end = kept.find_first_of(" ,;:)", i + 1);
        const std::string_view unit = std::string_view(kept).substr(i + 1, end == std::string::npos ? end : end - i - 1);
        for (std::string_view u : {"B", "KiB", "MiB", "GiB", "TiB", "EiB", "s"})
            if (unit == u) kept[i] = kKeep;
    }
    std::string out, line;
    std::istringstream words(kept);
    const size_t lead = text.find_first_not_of(' ');
    line = std::string(lead == std::string::npos ? 0 : lead, ' ');
    std::string w;
    bool first = true;
    while (words >> w) {
        const bool fresh = line.find_first_not_of(' ') == std::string::npos;
        if (!fresh && line.size() + 1 + w.size() > width) {
            out += line + "\n";
            line = std::string(indent, ' ');
            first = true;
        }
        line += (first ? "" : " ") + w;
        first = false;
    }
    out += line + "\n";
    std::replace(out.begin(), out.end(), kKeep, ' ');
    return out;
}

std::string borrowed_efficiencies(const Hardware & hw) {
    if (hw.efficiencies_from.empty()) return "";
    return fmt::format("{}'s efficiencies are {}'s", hw.name, hw.efficiencies_from);
}

std::string format_plan(const PlanRequest & r, const SearchReport & rep, bool explain, bool wide) {
    std::string out = header(r, rep);
    if (rep.best.empty()) {
        out += wrap("  nothing fits" + (rep.closest.empty() ? std::string() : ": closest, " + rep.closest.front().why), 4);
        if (!rep.hint.empty()) out += wrap("  hint: " + rep.hint, 4);
    } else {
        out += table(r, rep, wide);
        out += best_block(r, rep);
    }
    if (explain && !rep.rejected.empty()) {
        out += "\n  rejected (fastest first):\n";
        for (const PlanResult & p : rep.rejected)
            out += wrap(fmt::format("    {} | {}: {}", layout_name(p.c.layout), technique_name(p.c), p.why), 6,
                        wide ? size_t(100000) : kPlanColumns);
    }
    return out;
}

}  // namespace memfit
