#include "plan/fit.h"

#include "model/gptq_folder.h"
#include "model/hf_weights.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "memory/budget.h"
#include "plan/time_model.h"
#include "run/compat.h"

namespace memfit {

namespace {

// A frozen storage named by a precision (bf16, fp16, fp32; `compute` is the run's own) keeps the
// weights in the compute dtype, so it must be the run's precision.
void check_frozen_precision(const char * flag, const std::string & value, const char * what, BaseWeights b,
                            const RunConfig & r, DType compute) {
    if (b != BaseWeights::compute || value == "compute" || r.precision_auto || parse_precision(value) == compute) return;
    throw ConfigError(fmt::format("{} {} keeps {} in the compute precision, which is {}; add --precision {} (or use "
                                  "int8 / nf4 / sparse24)",
                                  flag, value, what, precision_name(compute), value));
}

}  // namespace

LoraOptions lora_options(const RunConfig & r, const ModelConfig & cfg, DType compute) {
    const LoraConfig & s = r.lora;
    LoraOptions l;
    BaseWeights base = parse_base_weights(s.base_weights);
    if (const std::optional<GptqSpec> g = has_hf_weights(r.model) ? read_gptq_spec(r.model) : std::nullopt) {
        if (s.rank == 0)
            throw ConfigError(fmt::format("{} is a GPTQ folder: its projections are frozen {}-bit weights; train "
                                          "adapters on them with --lora-rank (e.g. --lora-rank 16; PEFT's LoRA on "
                                          "GPTQ)", r.model, g->options.bits));
        if (base != BaseWeights::compute && base != BaseWeights::gptq)
            throw ConfigError(fmt::format("--base-weights {}: {} is a GPTQ folder, and its packed projections are the "
                                          "base (drop --base-weights)", s.base_weights, r.model));
        if (r.layout.tp > 1 || r.layout.pp > 1)
            throw ConfigError(fmt::format("a GPTQ base with --tp {} / --pp {}: its packed projections are loaded "
                                          "whole; train it with data parallelism", r.layout.tp, r.layout.pp));
        base = BaseWeights::gptq;
        l.gptq_bits = g->options.bits;
        l.gptq_group = g->options.group;
    } else if (base == BaseWeights::gptq && has_hf_weights(r.model)) {
        throw ConfigError(fmt::format("--base-weights gptq: {} is not a GPTQ folder; make one with memfit quantize "
                                      "--method gptq --model {} --calibration DATA --out DIR", r.model, r.model));
    } else {
        l.gptq_bits = s.gptq_bits;
        l.gptq_group = s.gptq_group;
    }
    const bool nf4_teacher = parse_base_weights(r.distill.weights, "--teacher-weights") == BaseWeights::nf4;
    if (!s.nf4_double_quant && base != BaseWeights::nf4 && !nf4_teacher)
        throw ConfigError(fmt::format("--nf4-double-quant false: no nf4 weights to store (--base-weights {}, "
                                      "--teacher-weights {}); it applies with --base-weights nf4 or --teacher-weights nf4",
                                      s.base_weights, r.distill.weights));
    l.double_quant = s.nf4_double_quant;
    // The modules are checked with LoRA off too: a misspelt one is an error, not ignored.
    if (s.rank == 0 && !s.targets.empty()) parse_lora_targets(cfg, s.targets);
    if (s.variant != "lora" && s.variant != "dora")
        throw ConfigError(fmt::format("--lora-variant {}: expected lora or dora", s.variant));
    if (s.rank == 0) {
        if (s.variant == "dora" || s.rslora)
            throw ConfigError(fmt::format("{} shapes LoRA adapters: it needs --lora-rank (e.g. --lora-rank 8)",
                                          s.rslora ? "--use-rslora" : "--lora-variant dora"));
        if (base != BaseWeights::compute)
            throw ConfigError(fmt::format("--base-weights {} freezes and quantizes the base: it needs --lora-rank "
                                          "(e.g. --lora-rank 8)", s.base_weights));
        return l;
    }
    if (s.rank < 0 || s.rank > cfg.n_embd)
        throw ConfigError(fmt::format("--lora-rank {}: must be between 1 and the model width {}", s.rank,
                                      cfg.n_embd));
    if (!(s.alpha > 0) || !std::isfinite(s.alpha))
        throw ConfigError(fmt::format("--lora-alpha {}: must be positive", s.alpha));
    if (base != BaseWeights::gptq)
        check_frozen_precision("--base-weights", s.base_weights, "the frozen base", base, r, compute);
    l.rank = s.rank;
    l.alpha = s.alpha;
    // Fine-tuning a folder's weights adapts every projection (torchtune's and Unsloth's recipes);
    // a fresh model keeps the family's default (q,v | c_attn), as the LoRA paper.
    l.targets = parse_lora_targets(cfg, s.targets.empty() && has_hf_weights(r.model) ? "all" : s.targets);
    l.base = base;
    if (!(s.dropout >= 0 && s.dropout < 1))
        throw ConfigError(fmt::format("--lora-dropout {}: must be in [0, 1)", s.dropout));
    l.dropout = s.dropout;
    l.dora = s.variant == "dora";
    l.rslora = s.rslora;
    if (l.quantized()) make_quant_layout(cfg, l.quant());   // nf4 block alignment, gptq groups: a clear error now
    return l;
}

PreferenceOptions preference_options(const RunConfig & r) {
    const PreferenceConfig & s = r.pref, defaults;
    PreferenceOptions p;
    if (!s.dpo()) {
        if (s.beta != defaults.beta || s.loss != defaults.loss || s.label_smoothing != defaults.label_smoothing ||
            s.reference != defaults.reference || s.weights != defaults.weights)
            throw ConfigError("--dpo-beta, --dpo-loss, --dpo-label-smoothing, --reference and --reference-weights "
                              "set preference tuning: add --objective dpo (with `memfit prepare --format preference` "
                              "data)");
        return p;
    }
    if (!(s.beta > 0) || !std::isfinite(s.beta))
        throw ConfigError(fmt::format("--dpo-beta {}: must be a positive number (TRL's default 0.1)", s.beta));
    if (!(s.label_smoothing >= 0 && s.label_smoothing < 0.5f))
        throw ConfigError(fmt::format("--dpo-label-smoothing {}: must be from 0 to below 0.5 (the share of pairs "
                                      "assumed mislabelled)", s.label_smoothing));
    p.dpo = true;
    p.loss = parse_dpo_loss(s.loss);
    if (p.loss != DpoLoss::sigmoid && s.label_smoothing > 0)
        throw ConfigError(fmt::format("--dpo-label-smoothing {:g} smooths the sigmoid loss (cDPO); --dpo-loss {} has "
                                      "none: drop it or use --dpo-loss sigmoid", s.label_smoothing, s.loss));
    p.beta = s.beta;
    p.label_smoothing = s.label_smoothing;
    p.reference = s.reference == "auto" ? (r.lora.rank > 0 ? Reference::adapters_off : Reference::copy)
                                        : parse_reference(s.reference);
    p.weights = parse_reference_weights(s.weights);
    if (p.reference != Reference::copy && p.weights != ReferenceWeights::compute)
        throw ConfigError(fmt::format("--reference-weights {} stores a reference copy: it needs --reference copy "
                                      "(--reference {} keeps no weights)", s.weights, reference_name(p.reference)));
    return p;
}

DistillOptions distill_options(const RunConfig & r, const ModelConfig & cfg, DType compute) {
    const DistillConfig & s = r.distill;
    DistillOptions d;
    const BaseWeights weights = parse_base_weights(s.weights, "--teacher-weights");
    if (s.teacher.empty()) {
        if (s.weights != "compute")
            throw ConfigError(fmt::format("--teacher-weights {} stores a distillation teacher: it needs --teacher DIR",
                                          s.weights));
        const DistillConfig defaults;
        if (s.alpha != defaults.alpha || s.temperature != defaults.temperature)
            throw ConfigError(fmt::format("--distill-alpha {:g} / --distill-temperature {:g} weigh and soften a "
                                          "distillation teacher's targets: they need --teacher DIR", s.alpha,
                                          s.temperature));
        return d;
    }
    if (!(s.alpha >= 0 && s.alpha <= 1))
        throw ConfigError(fmt::format("--distill-alpha {}: must be from 0 to 1", s.alpha));
    if (!(s.temperature > 0) || !std::isfinite(s.temperature))
        throw ConfigError(fmt::format("--distill-temperature {}: must be a positive number", s.temperature));
    check_frozen_precision("--teacher-weights", s.weights, "the teacher", weights, r, compute);
    d.teacher = resolve_model(s.teacher);
    if (d.teacher->vocab_size == 0) d.teacher->vocab_size = cfg.vocab_size;   // a preset learns it from the data
    d.alpha = s.alpha;
    d.temperature = s.temperature;
    d.weights = weights;
    d.double_quant = r.lora.nf4_double_quant;
    check_teacher(*d.teacher, cfg, r.seq);
    if (d.quantized()) make_quant_layout(*d.teacher, d.format());   // nf4 block alignment: a clear error now
    return d;
}

int auto_chunk_rows(int64_t rows) {
    const int64_t share = (rows / kAutoChunkShare + 63) / 64 * 64;
    return int(std::min<int64_t>(rows, std::max<int64_t>(kAutoChunkMinRows, share)));
}

int auto_loss_chunk(const ModelConfig & cfg, const Backend & backend, EngineOptions eo) {
    const uint64_t whole = uint64_t(eo.B) * uint64_t(eo.T) * uint64_t(std::max(0, cfg.vocab_size)) * 4;
    if (whole < kAutoChunkMinBytes) return 0;   // too small to be worth a plan (a tensor rank's are smaller still)
    // A pipeline's head is on its last stage; the others have no logits to chunk.
    if (eo.pipeline_parallel > 1 && eo.pp_rank != eo.pipeline_parallel - 1) return 0;
    eo.loss_chunk = 0;
    eo.budget = 0;
    // Judged on the training step alone, and on a pipeline's step of one micro-batch: the same
    // choice whoever asks (the trainer with its evaluation program, the planner without) and
    // whatever the micro-batches in flight, so that memfit plan records the program train runs.
    eo.with_eval = false;
    if (eo.pipeline_parallel > 1) eo.grad_accum = 1;
    std::optional<StepPlans> planned;
    try {
        planned.emplace(cfg, backend, eo);
    } catch (const ConfigError &) {
        return 0;   // what cannot be planned is reported where the run is planned
    }
    const StepPlans & plans = *planned;
    // The student's logits, and a distillation teacher's beside them (chunked together).
    uint64_t student = 0, teacher = 0;
    for (const BufferDecl & b : plans.train->program().buffers()) {
        if (!b.name.ends_with("logits")) continue;
        uint64_t & l = b.name.starts_with("teacher.") ? teacher : student;
        l = std::max<uint64_t>(l, b.bytes);
    }
    const uint64_t logits = student + teacher;
    const int rows = auto_chunk_rows(int64_t(eo.B) * eo.T);
    if (logits < kAutoChunkMinBytes || 4 * logits < plans.reserved().total() || rows >= eo.B * eo.T) return 0;
    return rows;
}

EngineOptions engine_options(const RunConfig & r, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                             int pp_stage) {
    check_supported(r, cfg, nullptr);   // the backend's kernels: when the steps are planned (StepPlans)
    const Layout & L = r.layout;
    EngineOptions eo;
    // The gradients' group: every rank of a context group too; under expert parallelism the ranks
    // holding the same experts (model/expert_parallel.h).
    eo.data_parallel = std::max(1, L.dp * L.cp / std::max(1, L.ep));
    eo.expert_parallel = L.ep;
    eo.moe_capacity_factor = r.moe_capacity_factor;
    eo.moe_drop_probs = r.moe_token_drop_policy == "probs";
    eo.context_parallel = L.cp;
    eo.cp_ring = r.cp_comm_type == "p2p";
    eo.tensor_parallel = L.tp;
    eo.sequence_parallel = L.sp;
    eo.pipeline_parallel = L.pp;
    eo.pp_rank = pp_stage;
    eo.schedule = L.schedule;
    eo.virtual_stages = L.schedule == PipeSchedule::interleaved ? L.virtual_stages : 1;
    eo.zero = L.zero;
    eo.bucket_bytes = size_t(std::llround(r.bucket_mb * 1048576.0));
    eo.B = r.micro_batch;
    eo.T = r.seq / std::max(1, L.cp);   // a context-parallel rank's rows of each sequence
    eo.grad_accum = r.grad_accum;
    eo.loss_chunk = r.loss_chunk;
    eo.mlp_chunk = r.mlp_chunk;
    eo.documents = r.packing;
    eo.with_eval = with_eval;
    eo.budget = r.budget;
    // auto: flash where the backend's kernels take the model's head dimension.
    eo.flash_attention = r.attention == Attention::flash ||
                         (r.attention == Attention::auto_ && backend.runs_flash_attention(cfg.head_dim()));
    eo.compute = r.precision_auto ? DType::f32 : r.compute;
    eo.optimizer = r.optimizer;
    eo.optimizer_in_backward = r.optimizer_in_backward;
    eo.galore_rank = r.galore_rank;
    eo.adafactor_first_moment = r.adafactor_beta1 > 0;
    eo.offload = L.offload != Offload::none ? r.offload_fraction : 0.0;
    eo.offload_params = L.offload == Offload::optimizer_params;
    eo.offload_activations = L.offload_acts;
    eo.offload_activation_layers = r.offload_activation_layers;
    eo.sr_master = r.master_weights == MasterWeights::bf16_sr;
    eo.offload_dir = r.offload_dir;
    if (r.recompute.info().kind != RecomputePolicy::budget) eo.recompute = recompute_plan(r.recompute, cfg.n_layer);
    eo.lora = lora_options(r, cfg, eo.compute);
    eo.distill = distill_options(r, cfg, eo.compute);
    eo.pref = preference_options(r);
    eo.sparsity = r.sparsity;
    eo.loss_scaling.dynamic = r.loss_scale == 0;
    eo.loss_scaling.scale = r.loss_scale > 0 ? r.loss_scale : r.initial_loss_scale;
    eo.loss_scaling.growth_interval = r.loss_scale_window;
    eo.loss_scaling.min_scale = r.min_loss_scale;
    eo.seed = r.seed;
    if (r.loss_chunk < 0) eo.loss_chunk = auto_loss_chunk(cfg, backend, eo);
    return eo;
}

namespace {

std::string describe(const EngineOptions & eo) {
    return fmt::format("micro-batch {} x {} accumulated, {}, {} attention, recompute {}, loss chunk {}", eo.B,
                       eo.grad_accum, precision_name(eo.compute), eo.flash_attention ? "flash" : "naive",
                       eo.recompute.name, eo.loss_chunk == 0 ? std::string("off") : std::to_string(eo.loss_chunk));
}

// `--recompute budget`: the kept bytes the budget leaves over full recomputation, solved
// exactly per layer and unit (model/recompute.h) and confirmed by the planner. The kept-bytes
// model is additive and the placed plan is not quite (full recomputation's own transients, for
// one), so the room is corrected by the planner's over- or undershoot and the solve repeats; the
// least-FLOP plan that fits wins. nullopt: even full recomputation does not fit.
std::optional<RecomputePlan> fit_recompute(EngineOptions eo, const ModelConfig & cfg, const Backend & backend,
                                           uint64_t budget, CategoryBytes * smallest) {
    eo.budget = 0;
    eo.recompute = parse_recompute("none", cfg.n_layer);
    if (StepPlans(cfg, backend, eo).reserved().total() <= budget) return eo.recompute;
    eo.recompute = parse_recompute("full", cfg.n_layer);
    const CategoryBytes r0 = StepPlans(cfg, backend, eo).reserved();
    if (smallest) *smallest = r0;
    if (r0.total() > budget) return std::nullopt;
    RecomputePlan best = eo.recompute;
    double best_flops = 1e300;
    uint64_t room = budget - r0.total();
    for (int i = 0; i < 8; ++i) {
        eo.recompute = recompute_for_budget(cfg, eo.B, eo.T, eo.flash_attention, eo.compute, room);
        const StepPlans plans(cfg, backend, eo);
        const uint64_t need = plans.reserved().total();
        if (need <= budget) {
            const double flops = plans.train->program().phase_flops(Phase::recompute);
            if (flops < best_flops) best = eo.recompute, best_flops = flops;
        }
        if (need == budget) break;
        const uint64_t next = need < budget ? room + (budget - need) : room - std::min(room, need - budget);
        if (next == room) break;
        room = next;
    }
    return best;
}

ResolvedRun fit_auto(const RunConfig & s, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                     int pp_stage) {
    const uint64_t budget = s.budget;
    const int G = s.micro_batch * s.grad_accum;   // this rank's sequences per step, as asked
    std::vector<DType> precisions = {DType::f32, DType::bf16};
    if (!s.precision_auto) precisions = {s.compute};
    TimeModel model;
    // 16-bit gemms at the rate this backend runs them (measured once on a CPU).
    if (std::any_of(precisions.begin(), precisions.end(), [](DType t) { return t != DType::f32; }))
        model.lowp_gemm = backend.lowp_gemm_speed();
    struct Found { EngineOptions eo; double seconds = 0; uint64_t bytes = 0; };
    std::optional<Found> best, second;
    std::optional<std::pair<EngineOptions, CategoryBytes>> smallest;
    int tried = 0, fitting = 0;
    auto consider = [&](const EngineOptions & eo, const StepPlans & plans) {
        ++tried;
        const CategoryBytes need = plans.reserved();
        if (!smallest || need.total() < smallest->second.total()) smallest = {eo, need};
        if (need.total() > budget) return;
        ++fitting;
        const Found f{eo, model.step_seconds(plans, eo.grad_accum), need.total()};
        auto better = [](const Found & a, const Found & b) {
            return a.seconds < b.seconds || (a.seconds == b.seconds && a.bytes < b.bytes);
        };
        if (!best || better(f, *best)) {
            second = best;
            best = f;
        } else if (!second || better(f, *second)) {
            second = f;
        }
    };
    for (int b = 1; b <= G; ++b) {
        if (G % b) continue;
        for (DType p : precisions)
            for (bool flash : {true, false})
                for (int chunk : {0, std::max(1, b * s.seq / 8)}) {
                    if (chunk > 0 && b * s.seq < 16) continue;
                    RunConfig c = s;
                    c.micro_batch = b;
                    c.grad_accum = G / b;
                    c.compute = p;
                    c.precision_auto = false;
                    c.fit_auto = false;
                    c.attention = flash ? Attention::flash : Attention::naive;
                    c.loss_chunk = chunk;
                    if (unsupported(c, cfg, &backend)) continue;
                    EngineOptions eo = engine_options(c, cfg, backend, with_eval, pp_stage);
                    bool none_fits = false;
                    for (const std::string & rc : searched_recompute_policies()) {
                        eo.recompute = parse_recompute(rc, cfg.n_layer);
                        const StepPlans plans(cfg, backend, eo);
                        if (rc == "none") none_fits = plans.reserved().total() <= budget;
                        consider(eo, plans);
                    }
                    if (none_fits) continue;   // the budget solver would keep everything
                    if (auto rc = fit_recompute(eo, cfg, backend, budget, nullptr)) {
                        eo.recompute = *rc;
                        consider(eo, StepPlans(cfg, backend, eo));
                    }
                }
    }
    if (!best) {
        try {
            check_budget(smallest->second, budget,
                         fmt::format("even the smallest configuration ({}) does not fit; lower --seq, pick a smaller "
                                     "--model or raise --memory-budget",
                                     describe(smallest->first)));
        } catch (const OutOfMemory & e) {
            throw PlanRefused(e.what(), smallest->first);
        }
        MF_ASSERT(false);
    }
    ResolvedRun r;
    r.eo = best->eo;
    r.eo.budget = budget;
    const double tokens = double(G) * s.seq;
    r.notes.push_back(fmt::format("--fit auto chose {}: predicted {:.0f} tokens/s, plan {} of the {} budget",
                                  describe(best->eo), tokens / best->seconds, format_bytes(best->bytes),
                                  format_bytes(budget)));
    r.notes.push_back(fmt::format(
        "  why: the fastest predicted of {} configurations that fit ({} tried, global batch {} kept){}", fitting, tried,
        G,
        second ? fmt::format("; next: {} at {:.0f} tokens/s, {}", describe(second->eo), tokens / second->seconds,
                             format_bytes(second->bytes))
               : ""));
    return r;
}

}  // namespace

ResolvedRun resolve_run(const RunConfig & s, const ModelConfig & cfg, const Backend & backend, bool with_eval,
                        int pp_stage) {
    const uint64_t budget = s.budget;
    if (s.fit_auto) {
        check_supported(s, cfg, &backend);
        if (budget == 0) throw ConfigError("--fit auto needs a memory budget");
        return fit_auto(s, cfg, backend, with_eval, pp_stage);
    }
    ResolvedRun r;
    r.eo = engine_options(s, cfg, backend, with_eval, pp_stage);
    if (s.loss_chunk < 0 && r.eo.loss_chunk > 0)
        r.notes.push_back(fmt::format("loss chunk: auto chose {} tokens per chunk: the {} of fp32 logits of {} x {} tokens "
                                      "would be a quarter or more of the step's memory (--loss-chunk 0: unchunked)",
                                      r.eo.loss_chunk,
                                      format_bytes(uint64_t(r.eo.B) * uint64_t(r.eo.T) * uint64_t(cfg.vocab_size) * 4),
                                      r.eo.B, r.eo.T));
    if (s.attention == Attention::auto_ && !r.eo.flash_attention)
        r.notes.push_back(fmt::format("attention: naive ({})", backend.flash_attention_refusal(cfg.head_dim())));
    if (s.recompute.info().kind == RecomputePolicy::budget) {
        if (budget == 0) throw ConfigError("--recompute budget needs a memory budget");
        CategoryBytes smallest;
        const auto rc = fit_recompute(r.eo, cfg, backend, budget, &smallest);
        if (!rc) {
            EngineOptions full = r.eo;
            full.recompute = parse_recompute("full", cfg.n_layer);
            try {
                check_budget(smallest, budget,
                             "even full recomputation does not fit; lower --batch or --seq, or use --fit auto");
            } catch (const OutOfMemory & e) {
                throw PlanRefused(e.what(), full);
            }
        }
        r.eo.recompute = *rc;
        const double all = layer_keep_cost(cfg, r.eo.B, r.eo.T, r.eo.flash_attention, r.eo.compute, kKeepAll).bytes;
        double kept = 0, flops = 0;
        for (int layer = 0; layer < cfg.n_layer; ++layer) {   // rc->kept: every unit where keep is empty
            const KeepSet k = layer_keep_cost(cfg, r.eo.B, r.eo.T, r.eo.flash_attention, r.eo.compute, rc->kept(layer));
            kept += double(k.bytes);
            flops += k.flops;
        }
        r.notes.push_back(fmt::format(
            "--recompute budget: keeps {} of the {} activations the layers save ({:.0f}%), recomputing {:.3g} GFLOP "
            "per micro-step to fit {}",
            format_bytes(uint64_t(kept)), format_bytes(uint64_t(all * cfg.n_layer)),
            100.0 * kept / (all * cfg.n_layer), flops / 1e9, format_bytes(budget)));
    }
    return r;
}

}  // namespace memfit
