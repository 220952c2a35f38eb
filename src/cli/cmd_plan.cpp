// memfit plan: predict memory and step time on a cluster and search the fastest configuration
// that fits (src/plan/), say how to run it, and answer the inverse questions (the longest
// sequence, the largest micro-batch, the largest model that fits).
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "backend/cuda_sizing.h"
#include "backend/make_backend.h"
#include "cli/commands.h"
#include "cli/run_flags.h"
#include "cli/validators.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "model/gptq_folder.h"
#include "model/hf_weights.h"
#include "plan/distill_plan.h"
#include "plan/fit.h"
#include "plan/hardware.h"
#include "plan/inference_plan.h"
#include "plan/inverse.h"
#include "plan/launch.h"
#include "plan/lora_plan.h"
#include "plan/plan_report.h"
#include "plan/search.h"
#include "run/compat.h"

namespace memfit::cli {

namespace {

// What `memfit plan` takes besides the RunConfig: the cluster, the output and the questions.
struct PlanFlags {
    std::string hardware = "h100-80g", calibration = "runs/calibration.json";
    int gpus = 0, nodes = 0, top = 5;
    int min_gpus_limit = 4096;
    bool explain = false, json = false, min_gpus = false, include_plan_only = false, wide = false;
    bool tp_comm_overlap = false;
    bool max_seq = false, max_micro_batch = false;
    std::string max_model;   // a family prefix, or "presets"; empty: not asked
    std::string emit_config, emit_deepspeed;
    // --inference (plan/inference_plan.h): serving instead of training.
    bool inference = false;
    int context = 0, concurrency = 0, kv_block = 16, batched_tokens = 512;
    std::string weights;   // empty: --precision's dtype
    std::string kv_dtype = "auto";
};

// The run's defaults for planning: a 7B model at 4k tokens in bf16.
RunConfig plan_defaults() {
    RunConfig r;
    r.model = "llama2-7b";
    r.seq = 4096;
    r.compute = DType::bf16;
    return r;
}

// The request: the run as train takes it; of the layout and techniques, what the flags (or the
// config file) fix; the rest is searched.
PlanRequest make_request(const PlanFlags & f, const RunConfig & run, const RunFlags & given) {
    PlanRequest r;
    r.cfg = run_model(run);
    if (r.cfg.vocab_size == 0) r.cfg.vocab_size = 256;   // the small presets: a byte vocabulary
    r.cfg.validate();
    r.hw = find_hardware(default_hardware_catalog(f.calibration), f.hardware);
    const int node = std::max(1, r.hw.per_node);
    // In 64 bits: --gpus or --nodes up to 2^31 - 1 must reach check_sizes' bound, not overflow.
    const int64_t gpus = f.gpus > 0 ? f.gpus : f.nodes > 0 ? int64_t(f.nodes) * node : 1;
    r.gpus = int(std::min<int64_t>(gpus, std::numeric_limits<int>::max()));
    r.nodes = f.nodes > 0 ? f.nodes : int((gpus + node - 1) / node);
    if (run.precision_auto) throw ConfigError("--precision auto: memfit plan plans one precision; name it");
    if (given.given("batch"))
        throw ConfigError("--batch: memfit plan takes --micro-batch (per data-parallel rank) and --global-batch");
    if (auto why = out_of_range(run)) throw ConfigError(*why);
    r.run = run;
    r.run.device.clear();
    // Unset: the micro-batch x accumulation x dp of each layout when a micro-batch is fixed,
    // else one sequence per device.
    if (!given.given("global-batch")) r.run.global_batch = given.given("micro-batch") || f.max_micro_batch ? 0 : r.gpus;
    // LoRA and distillation: the same flags and checks as `memfit train`.
    r.lora = make_lora_plan(r.cfg, lora_options(run, r.cfg, run.compute));
    r.distill = make_distill_plan(run, distill_options(run, r.cfg, run.compute));
    if (given.given("zero")) r.zero = run.layout.zero;
    if (given.given("tp")) r.tp = run.layout.tp;
    if (given.given("cp")) r.cp = run.layout.cp;
    if (given.given("ep")) r.ep = run.layout.ep;
    if (given.given("pp")) r.pp = run.layout.pp;
    if (given.given("micro-batch")) r.micro_batch = run.micro_batch;
    if (given.given("grad-accum")) r.grad_accum = run.grad_accum;
    if (given.given("offload")) r.offload = run.layout.offload, r.offload_acts = run.layout.offload_acts;
    if (given.given("schedule")) {
        r.schedule = run.layout.schedule;
        if (run.layout.schedule == PipeSchedule::interleaved) r.virtual_stages = run.layout.virtual_stages;
    }
    if (given.given("sp")) r.sp = run.layout.sp;   // --sp=false fixes it off
    if (given.given("recompute")) {
        run.recompute.uniform_mask("memfit plan");   // the planner models the uniform policies
        r.recompute = run.recompute.name();
    }
    if (given.given("attention") && run.attention != Attention::auto_) r.flash = run.attention == Attention::flash;
    r.top = size_t(f.top);
    r.explain = f.explain;
    r.include_plan_only = f.include_plan_only;
    r.tp_comm_overlap = f.tp_comm_overlap;
    return r;
}

// --emit-config / --emit-deepspeed: the best runnable row as a file train (or DeepSpeed) reads.
void emit_files(const PlanFlags & f, const PlanRequest & r, const SearchReport & rep) {
    if (f.emit_config.empty() && f.emit_deepspeed.empty()) return;
    const PlanResult * best = nullptr;
    for (const PlanResult & p : rep.best)
        if (p.runnable() && !best) best = &p;
    if (!best)
        throw Error("--emit-config / --emit-deepspeed: no listed configuration is one memfit train runs; nothing "
                    "written");
    if (!f.emit_config.empty()) {
        write_file_atomic(f.emit_config, train_flags(r, *best).dump(2) + "\n");
        std::fprintf(stderr, "memfit plan: wrote %s (memfit train --config %s)\n", f.emit_config.c_str(),
                     f.emit_config.c_str());
    }
    if (!f.emit_deepspeed.empty()) {
        std::vector<std::string> unexpressed;
        write_file_atomic(f.emit_deepspeed, deepspeed_config(*best, &unexpressed).dump(2) + "\n");
        std::fprintf(stderr, "memfit plan: wrote %s (DeepSpeed's config of #1)\n", f.emit_deepspeed.c_str());
        for (const std::string & u : unexpressed)
            std::fprintf(stderr, "memfit plan: note: %s: not in DeepSpeed's file: %s\n", f.emit_deepspeed.c_str(),
                         u.c_str());
    }
}

// The answer line of an inverse question, and the request and search to print below it.
struct Answer {
    std::string line;
    nlohmann::json json;
    PlanRequest request;
    SearchReport report;
};

Answer ask_inverse(const PlanFlags & f, const RunConfig & run, const RunFlags & given, const PlanRequest & r) {
    Answer a;
    if (f.max_seq || f.max_micro_batch) {
        const Largest l = f.max_seq ? largest_seq(r) : largest_micro_batch(r);
        const char * what = f.max_seq ? "longest sequence" : "largest micro-batch";
        if (l.value == 0)
            throw Error(fmt::format("{}: nothing fits on {} x {} even at {} {} (memfit plan without {} says what is "
                                    "closest)", what, r.gpus, r.hw.name, f.max_seq ? "seq" : "micro-batch",
                                    !f.max_seq && run.pref.dpo() ? 2 : 1,
                                    f.max_seq ? "--max-seq" : "--max-micro-batch"));
        a.line = fmt::format("{} that fits: {} ({}; {} searches)\n", what, l.value,
                             l.next ? fmt::format("{} does not", l.next)
                                    : f.max_seq ? fmt::format("the model's {} positions", r.cfg.max_seq)
                                                : fmt::format("the most tried, {}", kMaxMicroBatch),
                             l.searches);
        a.json = {{f.max_seq ? "max_seq" : "max_micro_batch", l.value}};
        a.request = l.request;
        a.report = l.report;
        return a;
    }
    const std::vector<std::string> models = model_family(f.max_model);
    const LargestModel m = largest_model(models, [&](const std::string & name) {
        RunConfig one = run;
        one.model = name;
        PlanRequest q = make_request(f, one, given);
        q.exact_sizing = r.exact_sizing;
        return q;
    });
    std::string tried;
    for (const auto & [name, why] : m.tried)
        if (!why.empty()) tried += wrap(fmt::format("  {}: {}", name, why), 6);
    if (m.model.empty())
        throw Error(fmt::format("largest model: none of {} fits on {} x {}\n{}", fmt::join(models, ", "), r.gpus,
                                r.hw.name, tried));
    a.line = fmt::format("largest model that fits: {}\n{}", m.model, tried);
    a.json = {{"max_model", m.model}};
    a.request = m.at.request;
    a.report = m.at.report;
    return a;
}

// --inference: the serving plan of one device (of --tp ranks), and the most requests that fit.
void run_inference_plan(const PlanFlags & f, const RunConfig & run, const RunFlags & given, const Backend & sizing) {
    for (const char * flag : {"micro-batch", "global-batch", "grad-accum", "zero", "pp", "offload", "recompute"})
        if (given.given(flag))
            throw ConfigError(fmt::format("--{}: a training flag; --inference plans serving (--tp, --context, "
                                          "--concurrency, --weights, --kv-block)", flag));
    if (run.precision_auto) throw ConfigError("--precision auto: memfit plan plans one precision; name it");
    InferenceRequest r;
    r.cfg = run_model(run);
    if (r.cfg.vocab_size == 0) r.cfg.vocab_size = 256;   // the small presets: a byte vocabulary
    r.cfg.validate();
    r.hw = find_hardware(default_hardware_catalog(f.calibration), f.hardware);
    r.tp = given.given("tp") ? run.layout.tp : 1;
    r.compute = run.compute;
    r.context = f.context > 0 ? f.context : std::min(run.seq, r.cfg.max_seq);
    r.concurrency = f.concurrency;
    r.kv_block = f.kv_block;
    r.kv_int8 = f.kv_dtype == "int8";
    r.batched_tokens = f.batched_tokens;
    const std::optional<GptqSpec> gptq = has_hf_weights(run.model) ? read_gptq_spec(run.model) : std::nullopt;
    const std::string w = f.weights.empty() ? (gptq ? "gptq" : precision_name(run.compute)) : f.weights;
    if (w == "int8") r.quant = QuantDesc{QuantFormat::int8};
    else if (w == "nf4") r.quant = QuantDesc{QuantFormat::nf4_dq};
    else if (w == "gptq") r.quant = gptq ? gptq_proto(gptq->options) : gptq_proto(GptqOptions{});
    else if (w == "fp32" || w == "bf16" || w == "fp16") r.compute = parse_precision(w);
    else throw ConfigError(fmt::format("--weights {}: expected bf16, fp16, fp32, int8, nf4 or gptq", w));
    if (gptq && w != "gptq") throw ConfigError(fmt::format("--weights {}: {} is a GPTQ folder", w, run.model));
    const InferencePlan p = plan_inference(r, sizing);
    if (f.json) std::printf("%s\n", inference_plan_json(r, p).dump(2).c_str());
    else std::printf("%s", format_inference_plan(r, p).c_str());
    if (!p.fits)
        throw Error(fmt::format("{} requests of {} positions do not fit on {}: {} planned, {} usable (at most {} fit)",
                                p.concurrency, r.context, r.hw.name, format_bytes(p.bytes.total()),
                                format_bytes(p.usable), p.max_concurrency));
}

void run_plan(const PlanFlags & f, const RunConfig & run, const RunFlags & given) {
    // The default file is optional (no calibration yet); one named on the command line is not.
    if (f.max_seq + f.max_micro_batch + !f.max_model.empty() + f.min_gpus > 1)
        throw ConfigError("--max-seq, --max-micro-batch, --max-model and --min-gpus each ask one question: give one");
    // A search records and drops many step programs of tens of MB: keep freed memory in the heap
    // rather than returning it to the system and faulting it in again (a third of the search's
    // time on large models).
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    // The engine's own scratch sizes: oneDNN's on the CPU, the CUDA backend's on a GPU.
    const std::unique_ptr<Backend> cpu = make_backend("cpu");
    const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
    if (f.inference) return run_inference_plan(f, run, given, f.hardware == "cpu" ? *cpu : *cuda);
    PlanRequest r = make_request(f, run, given);
    const Backend * sizing = r.hw.name == "cpu" ? cpu.get() : cuda.get();
    r.exact_sizing = sizing;
    SearchReport rep;
    std::string answer;
    nlohmann::json extra = nlohmann::json::object();
    if (f.min_gpus) {
        const int n = min_gpus(r, f.min_gpus_limit, &rep);
        if (n == 0)
            throw Error(fmt::format("no configuration of up to {} x {} fits {} at seq {} and global batch {}",
                                    f.min_gpus_limit, r.hw.name, r.cfg.name, r.run.seq, r.run.global_batch));
        r.gpus = n;
        r.nodes = (n + std::max(1, r.hw.per_node) - 1) / std::max(1, r.hw.per_node);
        answer = fmt::format("fewest devices that fit: {} x {}\n", n, r.hw.name);
        extra["min_gpus"] = n;
    } else if (f.max_seq || f.max_micro_batch || !f.max_model.empty()) {
        Answer a = ask_inverse(f, run, given, r);
        r = a.request;
        r.exact_sizing = sizing;
        rep = std::move(a.report);
        answer = a.line;
        extra = a.json;
    } else {
        rep = search_plans(r);
    }
    if (f.json) {
        nlohmann::json j = plan_json(r, rep);
        j.update(extra);
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("%s%s", answer.c_str(), format_plan(r, rep, f.explain, f.wide).c_str());
    }
    if (rep.best.empty())
        throw Error(fmt::format("nothing fits on {} x {}; see the closest above (--explain lists more)", r.gpus,
                                r.hw.name));
    emit_files(f, r, rep);
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
    p->add_option("--gpus", f.gpus, "devices in all (default: --nodes x devices per node, else 1); past one node, "
                                    "whole nodes")->check(kPositive);
    p->add_option("--nodes", f.nodes, "nodes (default: as many as --gpus needs)")->check(kPositive);
    p->add_option("--top", f.top, "configurations to list")->capture_default_str()->check(kPositive);
    p->add_flag("--explain", f.explain, "also list the fastest rejected configurations and what would make them fit");
    p->add_flag("--include-plan-only", f.include_plan_only,
                "also rank layouts memfit train does not run yet (parameter offload, ...: docs/parallel.md), each "
                "marked with the reason; default: counted, not listed");
    p->add_flag("--tp-comm-overlap", f.tp_comm_overlap,
                "time an engine that hides tensor-parallel collectives under the gemms (Megatron-Core's "
                "--tp-comm-overlap, with --sp); memfit train does not, so the default does not");
    p->add_flag("--wide", f.wide, "every column at full width and a bar of the bytes per row (over 120 columns)");
    p->add_flag("--json", f.json, "print the result as JSON (docs/plan.md)");
    p->add_flag("--min-gpus", f.min_gpus, "find the fewest devices of this kind that fit the run, and its best layout");
    p->add_flag("--max-seq", f.max_seq, "find the longest sequence (in steps of 128 tokens) that fits, and its layout");
    p->add_flag("--max-micro-batch", f.max_micro_batch,
                "find the largest micro-batch per data-parallel rank that fits (the global batch follows it)");
    p->add_option("--max-model", f.max_model,
                  "find the largest preset of a family (a name prefix: llama3, qwen2.5, gpt2, ...; presets: all) "
                  "that fits, and its layout")
        ->expected(0, 1)
        ->default_str("presets");
    p->add_option("--emit-config", f.emit_config,
                  "write the best row as memfit's config file (memfit train --config FILE runs it)")
        ->check(kPath);
    p->add_option("--emit-deepspeed", f.emit_deepspeed,
                  "write the best row as a DeepSpeed config (ds_config.json); what it cannot say is printed")
        ->check(kPath);
    p->add_flag("--inference", f.inference,
                "plan serving instead of training: weights, KV cache, activations of a paged decoder on one device "
                "(of --tp ranks), the most requests of --context positions that fit, decode tokens/s and prefill "
                "time (docs/inference.md)");
    p->add_option("--context", f.context, "with --inference: positions per request, prompt and generated tokens "
                  "(default: --seq)")->check(kPositive);
    p->add_option("--concurrency", f.concurrency, "with --inference: requests at once (default: the most that fit)")
        ->check(kPositive);
    p->add_option("--weights", f.weights, "with --inference: weight storage, bf16, fp16, fp32, int8, nf4 or gptq "
                  "(4-bit, groups of 128; a GPTQ folder's own) (default: --precision)");
    p->add_option("--kv-dtype", f.kv_dtype, "with --inference: the KV cache's storage, auto (the compute dtype) or "
                  "int8 (codes and a scale per position and KV head)")->capture_default_str()
        ->check(CLI::IsMember({"auto", "int8"}));
    p->add_option("--kv-block", f.kv_block, "with --inference: positions per KV cache block")->capture_default_str()
        ->check(CLI::Range(1, 4096));
    p->add_option("--max-num-batched-tokens", f.batched_tokens,
                  "with --inference: token rows one step runs at most (prefill chunks)")->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    CLI::Option * calibration =
        p->add_option("--calibration", f.calibration,
                      "the cpu entry's measurements (memfit bench --calibrate; \"\": none)")
            ->capture_default_str();
    CLI::Option * max_model = p->get_option("--max-model");
    p->callback([calibration, max_model] {
        if (calibration->count() > 0 && !f.calibration.empty() && !std::filesystem::is_regular_file(f.calibration))
            throw IoError(fmt::format("--calibration {}: no such file; write one with `memfit bench --calibrate`",
                                      f.calibration));
        if (max_model->count() > 0 && f.max_model.empty()) f.max_model = "presets";
        run_plan(f, run, given);
    });
}

}  // namespace memfit::cli
