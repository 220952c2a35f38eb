#include "app/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "backend/cpu/bf16_path.h"
#include "backend/cpu/matmul_probe.h"
#include "backend/make_backend.h"
#include "core/units.h"
#include "memory/budget.h"
#include "report/memory_report.h"
#include "memory/timeline.h"
#include "plan/fit.h"
#include "run/compat.h"
#include "train/engine.h"

namespace memfit {

namespace {

// --timeline: wall time and FLOPs of one op name, summed over the timeline steps.
struct OpClass { double ms = 0, flops = 0; int count = 0; };

// Per op name, per timeline step: wall ms, share of the step, GFLOP/s and MFU against the
// matmul peak; the costliest first.
nlohmann::json op_class_json(const std::map<std::string, OpClass> & by_op, double steps, double peak_gflops) {
    double total = 0;
    for (const auto & [name, c] : by_op) total += c.ms;
    std::vector<std::pair<std::string, OpClass>> v(by_op.begin(), by_op.end());
    std::sort(v.begin(), v.end(), [](const auto & a, const auto & b) { return a.second.ms > b.second.ms; });
    nlohmann::json out = nlohmann::json::array();
    for (const auto & [name, c] : v) {
        const double gflops = c.ms > 0 ? c.flops / (c.ms * 1e6) : 0.0;
        out.push_back({{"op", name}, {"calls", c.count / int(steps)}, {"ms", c.ms / steps},
                       {"share", total > 0 ? c.ms / total : 0.0}, {"gflops", gflops},
                       {"mfu", peak_gflops > 0 ? gflops / peak_gflops : 0.0}});
    }
    return out;
}

}  // namespace


nlohmann::json run_bench(const BenchOptions & opt) {
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
    if (opt.steps < 1) throw ConfigError("--steps must be at least 1");
    ModelConfig cfg = run_model(opt);   // with the run's model changes (--share-layers, --attention-window)
    if (cfg.vocab_size == 0) cfg.vocab_size = 256;   // small presets: byte vocabulary
    cfg.validate();
    const std::unique_ptr<Backend> owned = make_backend(opt.device);
    Backend & backend = *owned;
    // On the CPU, the matmul peak is probed before and after the timed steps and the higher kept:
    // a shared machine's momentary load lowers a probe, and a low peak would inflate the MFU. A
    // GPU's peak is not probed (mfu 0): scripts/gpu-check.sh rates it against the datasheet.
    const bool probe = opt.probe && backend.host_memory();
    double peak = probe ? cpu::measure_matmul_peak_gflops() : 0.0;
    RunConfig run = opt;
    resolve_batch(run, 1);
    run.budget = opt.budget ? opt.budget : default_budget(backend);
    const EngineOptions eo = resolve_run(run, cfg, backend, false).eo;
    Engine engine(cfg, backend, eo);
    engine.init_params(opt.seed);
    const size_t BT = size_t(eo.B) * size_t(opt.seq) * size_t(eo.grad_accum);   // tokens per step
    std::mt19937_64 rng(opt.seed);
    std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
    std::vector<int32_t> in(BT), tg(BT);
    std::vector<double> ms, ms_timeline;
    OptimHyper h;
    h.clip = opt.clip;
    Timeline tl;
    std::map<std::string, OpClass> by_op;   // --timeline
    const Program & prog = engine.step().program();
    auto timed_step = [&] {
        for (size_t k = 0; k < BT; ++k) { in[k] = tok(rng); tg[k] = tok(rng); }
        const auto t0 = std::chrono::steady_clock::now();
        engine.train_step(in.data(), tg.data(), h);
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    for (int i = 0; i < opt.warmup + opt.steps; ++i) {
        const double dt = timed_step();
        if (i >= opt.warmup) ms.push_back(dt);
        if (opt.timeline && i >= opt.warmup) {   // interleaved, so drift hits both alike
            engine.set_timeline(&tl);
            ms_timeline.push_back(timed_step());
            engine.set_timeline(nullptr);
            for (const TimelineEvent & e : tl.events) {
                // The LM head's gemms apart from the blocks' (the head's are outside any layer).
                const std::string name = e.name;
                OpClass & c = by_op[name + (e.layer < 0 && name.starts_with("matmul") ? " (lm head)" : "")];
                c.ms += (e.end_us - e.begin_us) / 1e3;
                c.flops += prog.ops()[size_t(e.op)].flops;
                ++c.count;
            }
        }
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    if (probe) peak = std::max(peak, cpu::measure_matmul_peak_gflops());
    // The bf16 paths on the same shapes: oneDNN's own bf16 matmul (where the CPU has one) and the
    // bf16-storage gemm as the engine runs it (the faster path here: backend/cpu/bf16_path.h).
    const double bf16_onednn = probe && eo.compute != DType::f32 ? cpu::measure_onednn_bf16_gflops() : 0.0;
    const double bf16_storage = probe && eo.compute != DType::f32 ? cpu::measure_bf16_storage_gflops() : 0.0;
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double tps = double(BT) / (med / 1e3);
    const double fpt = train_flops_per_token(cfg, opt.seq);
    const double achieved = fpt * tps / 1e9;
    // MFU against the matmul peak of the step's precision: the faster of oneDNN's native bf16
    // matmul and the bf16-storage path; fp32 (and fp16) steps against the fp32 probe.
    const double bf16_peak = std::max(bf16_onednn, bf16_storage);
    const double mfu_peak = eo.compute == DType::bf16 && bf16_peak > 0 ? bf16_peak : peak;
    nlohmann::json j = {
        {"model", cfg.name}, {"device", opt.device}, {"params", cfg.num_params()}, {"batch", eo.B}, {"seq", opt.seq},
        {"threads", omp_get_max_threads()}, {"precision", precision_name(eo.compute)}, {"steps", opt.steps},
        {"loss_chunk", eo.loss_chunk}, {"attention", eo.flash_attention ? "flash" : "naive"},
        {"recompute", eo.recompute.name}, {"grad_accum", eo.grad_accum},
        {"ms_per_step", med}, {"ms_min", ms.front()}, {"ms_max", ms.back()}, {"tokens_per_s", tps},
        {"model_flops_per_token", fpt}, {"achieved_gflops", achieved}, {"matmul_peak_gflops", peak},
        {"mfu", mfu_peak > 0 ? achieved / mfu_peak : 0.0}, {"mfu_peak_gflops", mfu_peak},
        {"mfu_vs_fp32_peak", peak > 0 ? achieved / peak : 0.0},
        {"matmul_bf16_onednn_gflops", bf16_onednn}, {"matmul_bf16_storage_gflops", bf16_storage},
        {"bf16_path", !backend.host_memory() ? "device" : cpu::native_bf16_chosen() ? "native" : "convert"},
        {"planned_peak_bytes", engine.planned_peak_live().total()},
        {"planned_peak_by_category", category_json(engine.planned_peak_live())},
        {"planned_reserved_bytes", engine.planned_reserved().total()},
        {"measured_peak_bytes", engine.ledger().live_total_peak()},
        {"peak_rss_bytes", peak_rss_bytes()}};
    if (!backend.host_memory()) {   // the device's memory: the plan's regions + the runtime vs in use
        j["device_runtime_bytes"] = backend.runtime_bytes();
        j["device_used_bytes"] = backend.device_used_delta();
    }
    if (opt.timeline) {
        j["ms_per_step_with_timeline"] = median(ms_timeline);
        j["timeline_overhead"] = median(ms_timeline) / med - 1.0;
        j["op_classes"] = op_class_json(by_op, double(ms_timeline.size()), mfu_peak);
    }
    return j;
}

}  // namespace memfit
