// memfit plan: predict memory and step time on a cluster and search the fastest configuration
// that fits (src/plan/).
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "backend/make_backend.h"
#include "cli/commands.h"
#include "cli/lora_flags.h"
#include "cli/validators.h"
#include "core/error.h"
#include "backend/cuda_sizing.h"
#include "plan/hardware.h"
#include "plan/lora_plan.h"
#include "plan/plan_report.h"
#include "plan/search.h"
#include "train/techniques.h"

namespace memfit::cli {

namespace {

struct PlanFlags {
    std::string model = "llama2-7b", hardware = "h100-80g", precision = "bf16", optimizer = "adamw";
    std::string offload, schedule, recompute, attention, calibration = "runs/calibration.json";
    int gpus = 0, nodes = 0, seq = 4096, global_batch = 0, zero = -1, tp = 0, pp = 0, micro_batch = 0, top = 5;
    int min_gpus_limit = 4096;
    bool sp = false, explain = false, json = false, min_gpus = false;
    // LoRA, as `memfit train` takes it (RunShape).
    int lora_rank = 0;
    float lora_alpha = 16, lora_dropout = 0;
    std::string lora_targets, base_weights = "compute";
};

template <class T>
T pick(const std::string & flag, const std::string & v, std::initializer_list<std::pair<const char *, T>> choices) {
    std::string names;
    for (const auto & [n, t] : choices) {
        if (v == n) return t;
        names += names.empty() ? n : std::string(", ") + n;
    }
    throw ConfigError(fmt::format("{} '{}': expected one of {}", flag, v, names));
}

PlanRequest make_request(const PlanFlags & f) {
    PlanRequest r;
    r.cfg = resolve_model(f.model);
    if (r.cfg.vocab_size == 0) r.cfg.vocab_size = 256;   // the small presets: a byte vocabulary
    r.cfg.validate();
    r.hw = find_hardware(default_hardware_catalog(f.calibration), f.hardware);
    const int node = std::max(1, r.hw.per_node);
    r.gpus = f.gpus > 0 ? f.gpus : f.nodes > 0 ? f.nodes * node : 1;
    r.nodes = f.nodes > 0 ? f.nodes : (r.gpus + node - 1) / node;
    r.seq = f.seq;
    r.global_batch = f.global_batch > 0 ? f.global_batch : r.gpus;
    r.compute = pick<DType>("--precision", f.precision, {{"bf16", DType::bf16}, {"fp16", DType::f16}, {"fp32", DType::f32}});
    // LoRA: the same flags and checks as `memfit train` (lora_options).
    RunShape shape;
    shape.precision = f.precision;
    shape.lora_rank = f.lora_rank;
    shape.lora_alpha = f.lora_alpha;
    shape.lora_dropout = f.lora_dropout;
    shape.lora_targets = f.lora_targets;
    shape.base_weights = f.base_weights;
    r.lora = make_lora_plan(r.cfg, lora_options(shape, r.cfg, r.compute));
    r.optimizer = pick<Optimizer>("--optimizer", f.optimizer,
                                  {{"adamw", Optimizer::adamw}, {"sgd", Optimizer::sgd}, {"adamw-8bit", Optimizer::adamw_8bit}});
    if (f.zero >= 0) r.zero = f.zero;
    if (f.tp > 0) r.tp = f.tp;
    if (f.pp > 0) r.pp = f.pp;
    if (f.micro_batch > 0) r.micro_batch = f.micro_batch;
    if (!f.offload.empty())
        r.offload = pick<Offload>("--offload", f.offload, {{"none", Offload::none}, {"optimizer", Offload::optimizer},
                                                           {"optimizer+params", Offload::optimizer_params}});
    if (!f.schedule.empty()) {
        if (f.schedule.starts_with("interleaved:")) {
            r.schedule = Schedule::interleaved;
            try {
                r.virtual_stages = std::stoi(f.schedule.substr(12));
            } catch (const std::exception &) {
                r.virtual_stages = 0;
            }
            if (r.virtual_stages < 2)
                throw ConfigError(fmt::format("--schedule {}: interleaved:V needs V >= 2 model chunks per device", f.schedule));
        } else {
            r.schedule = pick<Schedule>("--schedule", f.schedule, {{"gpipe", Schedule::gpipe}, {"1f1b", Schedule::one_f_one_b}});
        }
    }
    if (f.sp) r.sp = true;
    if (!f.recompute.empty()) {
        pick<int>("--recompute", f.recompute, {{"none", 0}, {"selective", 0}, {"full", 0}});
        r.recompute = f.recompute;
    }
    if (!f.attention.empty()) r.flash = pick<bool>("--attention", f.attention, {{"flash", true}, {"naive", false}});
    r.top = size_t(f.top);
    r.explain = f.explain;
    return r;
}

}  // namespace

void add_plan_commands(CLI::App & app) {
    static PlanFlags f;
    CLI::App * p = app.add_subcommand(
        "plan", "predict per-device memory and step time for a model on a cluster; search the fastest configuration that fits");
    p->add_option("--model", f.model, "preset or Hugging Face config.json")->capture_default_str();
    p->add_option("--hardware", f.hardware, "device kind from data/hardware.json (cpu: this machine)")->capture_default_str();
    p->add_option("--gpus", f.gpus, "devices in all (default: --nodes x devices per node, else 1)")->check(kPositive);
    p->add_option("--nodes", f.nodes, "nodes (default: as many as --gpus needs)")->check(kPositive);
    p->add_option("--seq", f.seq, "tokens per sequence")->capture_default_str()->check(kPositive);
    p->add_option("--global-batch", f.global_batch, "sequences per optimizer step (default: one per device)")
        ->check(kPositive);
    p->add_option("--precision", f.precision, "bf16|fp16|fp32")->capture_default_str();
    p->add_option("--optimizer", f.optimizer, "adamw|sgd|adamw-8bit")->capture_default_str();
    p->add_option("--zero", f.zero, "fix the ZeRO stage 0..3")->check(CLI::Range(0, 3));
    p->add_option("--offload", f.offload, "fix offload: none|optimizer|optimizer+params");
    p->add_option("--tp", f.tp, "fix the tensor-parallel size")->check(kPositive);
    p->add_option("--pp", f.pp, "fix the pipeline-parallel size")->check(kPositive);
    p->add_option("--schedule", f.schedule, "fix the pipeline schedule: gpipe|1f1b|interleaved:V");
    p->add_flag("--sp", f.sp, "fix sequence parallelism on (with --tp > 1)");
    p->add_option("--micro-batch", f.micro_batch, "fix the micro-batch (sequences per data-parallel rank)")
        ->check(kPositive);
    p->add_option("--recompute", f.recompute, "fix recomputation: none|selective|full");
    p->add_option("--attention", f.attention, "fix attention: flash|naive");
    add_lora_flags(p, f);
    p->add_option("--top", f.top, "configurations to list")->capture_default_str()->check(kPositive);
    p->add_flag("--explain", f.explain, "also list the fastest rejected configurations and what would make them fit");
    p->add_flag("--json", f.json, "print the result as JSON (docs/planner.md)");
    p->add_flag("--min-gpus", f.min_gpus, "find the fewest devices of this kind that fit the run, and its best layout");
    p->add_option("--calibration", f.calibration, "the cpu entry's measurements (memfit bench --calibrate)")
        ->capture_default_str();
    p->callback([] {
        PlanRequest r = make_request(f);
        // The engine's own scratch sizes: oneDNN's on the CPU, the CUDA backend's on a GPU.
        const std::unique_ptr<Backend> cpu_owned = make_backend("cpu");
        const Backend & cpu = *cpu_owned;
        const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
        r.exact_sizing = r.hw.name == "cpu" ? static_cast<const Backend *>(&cpu) : cuda.get();
        SearchReport rep;
        if (f.min_gpus) {
            const int n = min_gpus(r, f.min_gpus_limit, &rep);
            if (n == 0)
                throw Error(fmt::format("no configuration of up to {} x {} fits {} at seq {} and global batch {}",
                                        f.min_gpus_limit, r.hw.name, r.cfg.name, r.seq, r.global_batch));
            r.gpus = n;
            r.nodes = (n + std::max(1, r.hw.per_node) - 1) / std::max(1, r.hw.per_node);
            if (!f.json) std::printf("fewest devices that fit: %d x %s\n", n, r.hw.name.c_str());
        } else {
            rep = search_plans(r);
        }
        if (f.json) {
            nlohmann::json j = plan_json(r, rep);
            if (f.min_gpus) j["min_gpus"] = r.gpus;
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("%s", format_plan(r, rep, f.explain).c_str());
        }
        if (rep.best.empty())
            throw Error(fmt::format("nothing fits on {} x {}; see the closest above (--explain lists more)", r.gpus,
                                    r.hw.name));
    });
}

}  // namespace memfit::cli
