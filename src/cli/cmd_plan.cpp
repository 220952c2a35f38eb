// memfit plan: predict memory and step time on a cluster and search the fastest configuration
// that fits (src/plan/).
#include <cstdio>
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "backend/make_backend.h"
#include "cli/commands.h"
#include "cli/run_flags.h"
#include "cli/validators.h"
#include "core/error.h"
#include "backend/cuda_sizing.h"
#include "plan/hardware.h"
#include "plan/distill_plan.h"
#include "plan/lora_plan.h"
#include "plan/plan_report.h"
#include "plan/search.h"
#include "plan/fit.h"
#include "run/compat.h"

namespace memfit::cli {

namespace {

// What `memfit plan` takes besides the RunConfig: the cluster and the output.
struct PlanFlags {
    std::string hardware = "h100-80g", calibration = "runs/calibration.json";
    int gpus = 0, nodes = 0, top = 5;
    int min_gpus_limit = 4096;
    bool explain = false, json = false, min_gpus = false;
};

// The run's defaults for planning: a 7B model at 4k tokens in bf16.
RunConfig plan_defaults() {
    RunConfig r;
    r.model = "llama2-7b";
    r.seq = 4096;
    r.compute = DType::bf16;
    return r;
}

// The request: what the flags (or the config file) fix; the rest is searched.
PlanRequest make_request(const PlanFlags & f, const RunConfig & run, const RunFlags & given) {
    PlanRequest r;
    r.cfg = run_model(run);
    if (r.cfg.vocab_size == 0) r.cfg.vocab_size = 256;   // the small presets: a byte vocabulary
    r.cfg.validate();
    r.hw = find_hardware(default_hardware_catalog(f.calibration), f.hardware);
    const int node = std::max(1, r.hw.per_node);
    r.gpus = f.gpus > 0 ? f.gpus : f.nodes > 0 ? f.nodes * node : 1;
    r.nodes = f.nodes > 0 ? f.nodes : (r.gpus + node - 1) / node;
    r.seq = run.seq;
    r.global_batch = run.global_batch > 0 ? run.global_batch : r.gpus;
    if (run.precision_auto) throw ConfigError("--precision auto: memfit plan plans one precision; name it");
    r.compute = run.compute;
    // LoRA: the same flags and checks as `memfit train` (lora_options).
    r.lora = make_lora_plan(r.cfg, lora_options(run, r.cfg, r.compute));
    r.distill = make_distill_plan(run, distill_options(run, r.cfg, r.compute));
    r.optimizer = run.optimizer;
    if (auto why = out_of_range(run)) throw ConfigError(*why);
    if (given.given("zero")) r.zero = run.layout.zero;
    if (given.given("tp")) r.tp = run.layout.tp;
    if (given.given("pp")) r.pp = run.layout.pp;
    if (given.given("micro-batch")) r.micro_batch = run.micro_batch;
    if (given.given("batch"))
        throw ConfigError("--batch: memfit plan takes --micro-batch (per data-parallel rank) and --global-batch");
    if (given.given("grad-accum")) r.grad_accum = run.grad_accum;
    if (given.given("offload")) r.offload = run.layout.offload;
    r.offload_fraction = run.offload_fraction;
    r.offload_dir = run.offload_dir;
    r.master_weights = run.master_weights;
    r.packing = run.packing;
    r.loss_chunk = run.loss_chunk;
    r.mlp_chunk = run.mlp_chunk;
    if (given.given("schedule")) {
        r.schedule = run.layout.schedule;
        if (run.layout.schedule == PipeSchedule::interleaved) r.virtual_stages = run.layout.virtual_stages;
    }
    if (run.layout.sp) r.sp = true;
    if (given.given("recompute")) {
        run.recompute.uniform_mask("memfit plan");   // the planner models the uniform policies
        r.recompute = run.recompute.name();
    }
    if (given.given("attention") && run.attention != Attention::auto_) r.flash = run.attention == Attention::flash;
    r.top = size_t(f.top);
    r.explain = f.explain;
    return r;
}

}  // namespace

void add_plan_commands(CLI::App & app) {
    static PlanFlags f;
    static RunConfig run = plan_defaults();
    CLI::App * p = app.add_subcommand(
        "plan", "predict per-device memory and step time for a model on a cluster; search the fastest configuration that fits");
    // The run's flags as train takes them; those given are fixed, the rest searched.
    static const RunFlags given = add_run_flags(p, run, RunFlagSet{.execution = false, .layout = true});
    p->add_option("--hardware", f.hardware, "device kind from data/hardware.json (cpu: this machine)")->capture_default_str();
    p->add_option("--gpus", f.gpus, "devices in all (default: --nodes x devices per node, else 1)")->check(kPositive);
    p->add_option("--nodes", f.nodes, "nodes (default: as many as --gpus needs)")->check(kPositive);
    p->add_option("--top", f.top, "configurations to list")->capture_default_str()->check(kPositive);
    p->add_flag("--explain", f.explain, "also list the fastest rejected configurations and what would make them fit");
    p->add_flag("--json", f.json, "print the result as JSON (docs/planner.md)");
    p->add_flag("--min-gpus", f.min_gpus, "find the fewest devices of this kind that fit the run, and its best layout");
    CLI::Option * calibration =
        p->add_option("--calibration", f.calibration,
                      "the cpu entry's measurements (memfit bench --calibrate; \"\": none)")
            ->capture_default_str();
    p->callback([calibration] {
        // The default file is optional (no calibration yet); one named on the command line is not.
        if (calibration->count() > 0 && !f.calibration.empty() && !std::filesystem::is_regular_file(f.calibration))
            throw IoError(fmt::format("--calibration {}: no such file; write one with `memfit bench --calibrate`",
                                      f.calibration));
        PlanRequest r = make_request(f, run, given);
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
