#include "plan/published_runs.h"

#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "plan/hardware.h"
#include "plan/time_model.h"

namespace memfit::test {

namespace {

nlohmann::json read_json(const char * file) {
    std::ifstream in(std::string(MEMFIT_TEST_DATA) + "/" + file);
    EXPECT_TRUE(in.good()) << file;
    return nlohmann::json::parse(in);
}

// A GPT-style model of the given shape: a GPT-2-family config (MPT's ALiBi and Megatron's
// learned positions add no FLOPs the model counts).
ModelConfig gpt_shape(int d, int layers, int heads, int vocab, int seq) {
    ModelConfig c = model_preset("gpt2");
    c.n_embd = d;
    c.n_layer = layers;
    c.n_head = heads;
    c.vocab_size = vocab;
    c.max_seq = seq;
    return c;
}

std::optional<int> opt_int(const nlohmann::json & l, const char * k) {
    if (!l.contains(k) || l.at(k).is_null()) return std::nullopt;
    return l.at(k).get<int>();
}

// Megatron's FLOPs per token: Narayanan et al.'s 96 l h^2 (1 + s/6h + V/16lh) with full
// recomputation (four passes), Megatron-Core's 72 l h^2 (1 + s/6h + V/12lh) without.
double megatron_flops_per_token(const ModelConfig & c, int seq, bool full_recompute) {
    const double l = c.n_layer, h = c.n_embd, s = seq, V = c.vocab_size;
    return full_recompute ? 96 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
                          : 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

}  // namespace

std::vector<PublishedRun> published_runs() {
    const nlohmann::json j = read_json("published_runs.json");
    std::vector<PublishedRun> runs;
    for (const nlohmann::json & r : j.at("runs")) {
        PublishedRun p;
        p.name = r.at("name");
        p.hw = r.at("hw");
        p.cfg = r.contains("preset") ? model_preset(r.at("preset").get<std::string>())
                                     : gpt_shape(r.at("d"), r.at("L"), r.at("H"), r.at("V"), r.at("seq"));
        p.cfg.max_seq = std::max(p.cfg.max_seq, r.at("seq").get<int>());
        p.gpus = r.at("gpus");
        p.seq = r.at("seq");
        p.mb = r.at("mb");
        p.ga = r.at("ga");
        p.zero = r.at("zero");
        p.recompute = r.at("recompute");
        p.tok_s_gpu = r.at("tok_s_gpu");
        runs.push_back(p);
    }
    return runs;
}

Candidate layout_of(const PublishedRun & r) {
    Candidate c;
    c.layout.dp = r.gpus;
    c.layout.zero = r.zero;
    c.micro_batch = r.mb;
    c.grad_accum = r.ga;
    c.recompute = r.recompute;
    c.compute = DType::bf16;
    c.set_flash(true);
    return c;
}

int nodes_of(const Hardware & hw, int gpus) { return (gpus + hw.per_node - 1) / hw.per_node; }

std::vector<Run3D> runs_3d() {
    const nlohmann::json all = read_json("published_runs_3d_calibration.json");
    std::vector<Run3D> out;
    for (const nlohmann::json & j : all.at("runs")) {
        Run3D r;
        r.j = j;
        r.name = j.at("name");
        r.hw = j.at("gpu");
        const nlohmann::json & m = j.at("model");
        r.seq = m.at("seq");
        r.cfg = gpt_shape(m.at("hidden"), m.at("layers"), m.at("heads"), m.at("vocab"), r.seq);
        r.gpus = j.at("layout").at("gpus");
        const bool full = j.at("layout").value("recompute", nlohmann::json()) == "full";
        r.tflops_per_gpu = j.at("published").at("tflops_per_gpu");
        r.tok_s_gpu = r.tflops_per_gpu * 1e12 / megatron_flops_per_token(r.cfg, r.seq, full);
        out.push_back(r);
    }
    return out;
}

std::optional<PlanResult> plan_run(const Run3D & r, const Hardware & hw) {
    const nlohmann::json & l = r.j.at("layout");
    std::vector<std::pair<int, int>> splits;   // (tp, pp); 0: searched
    if (auto prod = opt_int(l, "tp_times_pp")) {
        for (int tp : {1, 2, 4, 8})
            if (*prod % tp == 0) splits.push_back({tp, *prod / tp});
    } else {
        splits.push_back({opt_int(l, "tp").value_or(0), opt_int(l, "pp").value_or(0)});
    }
    // The sources that name their overlaps: Megatron-Core's TP communication overlap.
    const bool tp_overlap = l.value("note", std::string()).find("TP comm on") != std::string::npos;
    // A stated interleaved schedule is kept (its virtual stages searched) wherever there is a pipeline.
    const bool interleaved = l.contains("schedule") && l.at("schedule").is_string() &&
                             l.at("schedule").get<std::string>().rfind("interleaved", 0) == 0;
    std::optional<PlanResult> best;
    for (auto [tp, pp] : splits)
        for (int v : {1, 2, 3, 4, 6, 8}) {   // virtual stages: stated nowhere (1: no interleaving)
            if (v > 1 && pp == 1) continue;
            if (v == 1 && interleaved && pp > 1) continue;
            PlanRequest q;
            q.cfg = r.cfg;
            q.hw = hw;
            q.gpus = r.gpus;
            q.run.seq = r.seq;
            q.run.global_batch = l.at("global_batch");
            q.run.micro_batch = 0;
            q.run.grad_accum = 0;
            if (tp) q.tp = tp;
            if (pp) q.pp = pp;
            q.zero = opt_int(l, "zero");
            q.micro_batch = opt_int(l, "micro_batch");
            if (l.contains("recompute") && !l.at("recompute").is_null()) q.recompute = l.at("recompute").get<std::string>();
            if (l.contains("sequence_parallel") && !l.at("sequence_parallel").is_null())
                q.sp = l.at("sequence_parallel").get<bool>();
            q.offload = Offload::none;
            q.schedule = v == 1 ? PipeSchedule::one_f_one_b : PipeSchedule::interleaved;
            q.virtual_stages = v;
            q.tp_comm_overlap = tp_overlap;
            q.top = 1;
            q.hint = false;
            q.include_plan_only = true;
            SearchReport rep;
            try {
                rep = search_plans(q);
            } catch (const ConfigError &) {
                continue;   // a split the model cannot take (more stages than layers)
            }
            if (!rep.best.empty() && (!best || rep.best[0].time.tokens_per_s > best->time.tokens_per_s)) best = rep.best[0];
        }
    return best;
}

std::vector<RunRatio> calibration_ratios(const std::vector<Hardware> & catalog, const std::string & only) {
    std::vector<RunRatio> out;
    for (const PublishedRun & r : published_runs()) {
        if (!only.empty() && r.hw != only) continue;
        const Hardware & hw = find_hardware(catalog, r.hw);
        const StepTime t = predict_step_time(r.cfg, hw, layout_of(r), r.seq, nodes_of(hw, r.gpus));
        const double predicted = t.tokens_per_s / r.gpus;
        RunRatio x{r.name, r.hw, "", predicted / r.tok_s_gpu};
        x.row = fmt::format("| {} | {} {} | {} | {} x {} | {} | {:.0f} | {:.0f} | {:.2f} | {:.3f} |", r.name, r.gpus, r.hw,
                            r.seq, r.mb, r.ga, r.recompute, r.tok_s_gpu, predicted, x.ratio, t.mfu);
        out.push_back(x);
    }
    for (const Run3D & r : runs_3d()) {
        if (!only.empty() && r.hw != only) continue;
        const std::optional<PlanResult> p = plan_run(r, find_hardware(catalog, r.hw));
        const double predicted = p ? p->time.tokens_per_s / r.gpus : 0.0;
        RunRatio x{r.name, r.hw, "", predicted / r.tok_s_gpu};
        x.row = p ? fmt::format("| {} | {} | {:.0f} | {:.0f} | {}; {} | {:.0f} | {:.2f} |", r.name, r.gpus,
                                r.tflops_per_gpu, r.tok_s_gpu, layout_name(p->c.layout), technique_name(p->c), predicted,
                                x.ratio)
                  : fmt::format("| {} | {} | {:.0f} | {:.0f} | nothing fits | - | - |", r.name, r.gpus, r.tflops_per_gpu,
                                r.tok_s_gpu);
        out.push_back(x);
    }
    return out;
}

}  // namespace memfit::test
