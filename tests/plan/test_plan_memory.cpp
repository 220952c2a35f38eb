// The planner's memory model: the ZeRO paper's model-state figures, Korthikanti et al. 2022's
// activation bytes per layer (Table 2) under their assumptions, and, for configurations the
// engine runs, the plan equal to what the engine measures, byte for byte.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "core/error.h"
#include "model/config.h"
#include "plan/fit.h"
#include "plan/lora_plan.h"
#include "plan/memory_model.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "run/compat.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;

// Rajbhandari et al. 2020, figure 1: a 7.5B-parameter model on 64 GPUs, mixed-precision Adam.
TEST(PlanMemory, ZeroPaperModelStates) {
    const int64_t psi = 7'500'000'000;
    const double want[4] = {120.0, 31.4, 16.6, 1.9};   // GB per GPU for DP, ZeRO-1, -2, -3
    for (int zero = 0; zero <= 3; ++zero) {
        Candidate c;
        c.compute = DType::f16;
        c.layout.dp = 64;
        c.layout.zero = zero;
        const double gb = double(model_state_bytes(psi, c).total()) / 1e9;
        EXPECT_NEAR(gb, want[zero], 0.05) << "ZeRO-" << zero;
    }
    // Formulas behind them: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.
    Candidate c;
    c.compute = DType::bf16;
    c.layout.dp = 8;
    c.layout.zero = 2;
    EXPECT_EQ(model_state_bytes(800, c).total(), uint64_t(2 * 800 + 14 * 800 / 8));
}

// Korthikanti et al. 2022, Table 2, per layer: s sequence, b micro-batch, h hidden, a heads, t TP.
TEST(PlanMemory, KorthikantiActivationsPerLayer) {
    ModelConfig cfg = model_preset("gpt2-medium");   // h = 1024, a = 16
    const uint64_t s = 2048, b = 4, h = 1024, a = 16;
    const uint64_t sbh = s * b * h, as2b = a * s * s * b;
    auto got = [&](int t, bool sp, const char * policy) {
        return megatron_layer_activation_bytes(cfg, int(b), int(s), t, sp, policy);
    };
    EXPECT_EQ(got(1, false, "none"), 34 * sbh + 5 * as2b);                    // sbh(34 + 5as/h)
    for (uint64_t t : {2, 4, 8}) {
        SCOPED_TRACE(t);
        EXPECT_EQ(got(int(t), false, "none"), 10 * sbh + 24 * sbh / t + 5 * as2b / t);   // sbh(10 + 24/t + 5as/(ht))
        EXPECT_EQ(got(int(t), true, "none"), (34 * sbh + 5 * as2b) / t);                 // sbh/t (34 + 5as/h)
        EXPECT_EQ(got(int(t), false, "attention"), 10 * sbh + 24 * sbh / t);             // sbh(10 + 24/t)
        EXPECT_EQ(got(int(t), true, "attention"), 34 * sbh / t);                         // 34 sbh / t
    }
    EXPECT_EQ(got(1, false, "full"), 2 * sbh);                                           // 2sbh
}

// For what the engine runs, the plan is the engine's program: planned == measured per category.
TEST(PlanMemory, ExactForTheEngineGrid) {
    CpuBackend backend;
    Hardware cpu = memfit::test::h100_like();
    cpu.name = "cpu";
    cpu.usable = cpu.memory;
    struct Case {
        const char * model; int B, T; const char * rc; bool flash; DType dt; int accum; int loss_chunk = 0, mlp_chunk = 0;
        bool in_bwd = false;
    };
    for (const Case & k : {Case{"nano", 2, 64, "none", true, DType::f32, 1}, Case{"nano", 4, 32, "full", false, DType::f32, 2},
                           Case{"llama-nano", 2, 64, "selective", true, DType::bf16, 1},
                           Case{"llama-nano", 1, 128, "none", false, DType::f32, 3},
                           Case{"micro", 2, 64, "selective", true, DType::f16, 1},
                           Case{"llama-nano", 2, 64, "full", true, DType::f32, 1, 32, 24},   // TiledMLP
                           Case{"nano", 2, 64, "none", false, DType::bf16, 2, 0, 40},
                           Case{"llama-nano", 2, 64, "none", true, DType::bf16, 1, 0, 0, true}}) {   // fused step
        SCOPED_TRACE(std::string(k.model) + " " + k.rc);
        ModelConfig cfg = model_preset(k.model);
        cfg.vocab_size = 256;
        Candidate c;
        c.micro_batch = k.B;
        c.grad_accum = k.accum;
        c.recompute = k.rc;
        c.set_flash(k.flash);
        c.compute = k.dt;
        c.loss_chunk = k.loss_chunk;
        c.mlp_chunk = k.mlp_chunk;
        c.optimizer_in_backward = k.in_bwd;
        const DeviceMemory plan = exact_memory(cfg, cpu, c, k.T, backend);
        EXPECT_TRUE(plan.exact);
        EngineOptions eo;
        eo.B = k.B;
        eo.T = k.T;
        eo.grad_accum = k.accum;
        eo.with_eval = false;
        eo.flash_attention = k.flash;
        eo.compute = k.dt;
        eo.recompute = parse_recompute(k.rc, cfg.n_layer);
        eo.loss_chunk = k.loss_chunk;
        eo.mlp_chunk = k.mlp_chunk;
        eo.optimizer_in_backward = k.in_bwd;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(size_t(k.B * k.T * k.accum)), tg(in.size());
        memfit::test::random_batch(in, tg, cfg.vocab_size, 1);
        e.train_step(in.data(), tg.data(), OptimHyper{});
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            if (Category(cat) == Category::runtime) continue;
            EXPECT_EQ(plan.device.v[cat], e.ledger().live_peak().v[cat]) << kCategoryNames[cat];
        }
        // The analytic model, used by the search, is close to the exact one on one device.
        const DeviceMemory approx = predict_memory(cfg, cpu, c, k.T);
        const double ratio = double(approx.total()) / double(plan.total());
        EXPECT_GT(ratio, 0.8);
        EXPECT_LT(ratio, 1.5);
        // The fused step's gradients: the embedding's, the head's and one layer's, to the byte.
        if (k.in_bwd) {
            EXPECT_EQ(approx.device[Category::gradients], plan.device[Category::gradients]);
        }
    }
}

// Gemma 3's step (four norms a block, the output norms' inputs kept under every policy, a window
// below T on its sliding layers) and GPT-NeoX's (parallel residuals, biases everywhere): planned
// equal to what the engine measures, category by category, and the analytic model within the
// search's bounds of it.
TEST(PlanMemory, Gemma3AndGptNeoxExactAndAnalyticClose) {
    CpuBackend backend;
    Hardware cpu = memfit::test::h100_like();
    cpu.name = "cpu";
    cpu.usable = cpu.memory;
    const ModelConfig gemma = parse_hf_config(
        {{"model_type", "gemma3_text"}, {"vocab_size", 256}, {"hidden_size", 64}, {"intermediate_size", 160},
         {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 32},
         {"sliding_window", 32}, {"sliding_window_pattern", 2}, {"query_pre_attn_scalar", 24},
         {"max_position_embeddings", 128}},
        "gemma3");
    const ModelConfig neox = parse_hf_config(
        {{"model_type", "gpt_neox"}, {"vocab_size", 256}, {"hidden_size", 64}, {"intermediate_size", 256},
         {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"max_position_embeddings", 128}},
        "neox");
    auto check = [&](const ModelConfig & cfg, const char * rc, bool flash) {
        SCOPED_TRACE(cfg.model_type + " " + rc + (flash ? " flash" : " naive"));
        const int B = 2, T = 64;
        Candidate c;
        c.micro_batch = B;
        c.recompute = rc;
        c.set_flash(flash);
        c.compute = DType::bf16;
        const DeviceMemory plan = exact_memory(cfg, cpu, c, T, backend);
        EXPECT_TRUE(plan.exact);
        EngineOptions eo;
        eo.B = B;
        eo.T = T;
        eo.with_eval = false;
        eo.flash_attention = flash;
        eo.compute = DType::bf16;
        eo.recompute = parse_recompute(rc, cfg.n_layer);
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(size_t(B * T)), tg(in.size());
        memfit::test::random_batch(in, tg, cfg.vocab_size, 1);
        e.train_step(in.data(), tg.data(), OptimHyper{});
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            if (Category(cat) == Category::runtime) continue;
            EXPECT_EQ(plan.device.v[cat], e.ledger().live_peak().v[cat]) << kCategoryNames[cat];
        }
        const double ratio = double(predict_memory(cfg, cpu, c, T).total()) / double(plan.total());
        EXPECT_GT(ratio, 0.8);
        EXPECT_LT(ratio, 1.5);
    };
    for (const ModelConfig & cfg : {gemma, neox})
        for (const char * rc : {"none", "full", "selective"})
            for (bool flash : {false, true}) check(cfg, rc, flash);
}

// Long sequences: --loss-chunk keeps one chunk's fp32 logits, --mlp-chunk (TiledMLP) one chunk's
// MLP intermediates and their gradients instead of the whole micro-batch's (Llama 3.1 8B at 128K).
TEST(PlanMemory, LossAndMlpChunksShrinkLongSequences) {
    const ModelConfig cfg = model_preset("llama3.1-8b");
    const Hardware hw = memfit::test::h100_like();
    const uint64_t rows = 131072, chunk = 4096, s = 2;
    Candidate c;
    c.recompute = "full";
    c.loss_chunk = 0;   // not auto: the logits whole
    const uint64_t base = predict_memory(cfg, hw, c, int(rows)).device[Category::activations];
    c.loss_chunk = int(chunk);
    const uint64_t loss = predict_memory(cfg, hw, c, int(rows)).device[Category::activations];
    EXPECT_EQ(base - loss, (rows - chunk) * uint64_t(cfg.vocab_size) * 4);
    c.mlp_chunk = int(chunk);
    const uint64_t tiled = predict_memory(cfg, hw, c, int(rows)).device[Category::activations];
    // One layer's backward held fc, activation and their gradients for every row (2 rows (F + A),
    // half of them recomputed); tiled, for one chunk's rows.
    EXPECT_EQ(loss - tiled, 2 * (rows - chunk) * uint64_t(cfg.fc_dim() + cfg.ffn_dim()) * s);
    // The time model pays the tiles' recomputation only where full recomputation did not already.
    c.recompute = "none";
    const double kept = predict_step_time(cfg, hw, c, int(rows), 1).recompute;
    c.mlp_chunk = 0;
    EXPECT_GT(kept, predict_step_time(cfg, hw, c, int(rows), 1).recompute);
}

TEST(PlanMemory, LayoutsDivideWhatTheyShouldAndOffloadMovesToTheHost) {
    const ModelConfig cfg = model_preset("llama2-7b");
    const Hardware hw = memfit::test::h100_like();
    Candidate base;
    base.micro_batch = 1;
    const DeviceMemory one = predict_memory(cfg, hw, base, 4096);
    Candidate tp = base;
    tp.layout.tp = 8;
    const DeviceMemory t8 = predict_memory(cfg, hw, tp, 4096);
    EXPECT_NEAR(double(t8.device[Category::parameters]) / double(one.device[Category::parameters]), 1.0 / 8, 0.01);
    EXPECT_LT(t8.device[Category::activations], one.device[Category::activations]);
    tp.layout.sp = true;
    EXPECT_LT(predict_memory(cfg, hw, tp, 4096).device[Category::activations], t8.device[Category::activations]);
    Candidate z3 = base;
    z3.layout.dp = 8;
    z3.layout.zero = 3;
    const DeviceMemory d = predict_memory(cfg, hw, z3, 4096);
    EXPECT_NEAR(double(d.device[Category::optimizer_states]) / double(one.device[Category::optimizer_states]), 1.0 / 8,
                0.001);
    EXPECT_GT(d.device[Category::communication], 0u);   // gathered layers, buckets
    Candidate off = base;
    off.layout.offload = Offload::optimizer;
    const DeviceMemory o = predict_memory(cfg, hw, off, 4096);   // memfit's: states staged through the device
    EXPECT_EQ(o.device[Category::master_weights], 0u);
    EXPECT_LT(o.device[Category::optimizer_states], one.device[Category::optimizer_states] / 100);
    EXPECT_EQ(o.device[Category::gradients], one.device[Category::gradients]);
    EXPECT_EQ(o.host, one.device[Category::optimizer_states] + one.device[Category::master_weights]);
    off.layout.offload = Offload::optimizer_params;   // the weights' ZeRO-3 shard too; the gradients stay
    off.layout.zero = 3;
    const DeviceMemory op = predict_memory(cfg, hw, off, 4096);
    Candidate z1 = base;
    z1.layout.zero = 3;
    const DeviceMemory z = predict_memory(cfg, hw, z1, 4096);
    EXPECT_EQ(op.device[Category::parameters], 0u);
    EXPECT_EQ(op.device[Category::master_weights], 0u);
    EXPECT_LT(op.device[Category::optimizer_states], one.device[Category::optimizer_states] / 100);
    EXPECT_EQ(op.device[Category::gradients], z.device[Category::gradients]);
    EXPECT_EQ(op.host, z.device[Category::parameters] + z.device[Category::master_weights] +
                           z.device[Category::optimizer_states]);
    // Pipeline: GPipe keeps all m micro-batches in flight on the first stage, 1F1B at most pp.
    Candidate pp = base;
    pp.layout.pp = 4;
    pp.grad_accum = 16;
    pp.layout.schedule = PipeSchedule::gpipe;
    const uint64_t gpipe = predict_memory(cfg, hw, pp, 4096).device[Category::activations];
    pp.layout.schedule = PipeSchedule::one_f_one_b;
    const uint64_t f1b = predict_memory(cfg, hw, pp, 4096).device[Category::activations];
    EXPECT_GT(gpipe, 3 * f1b);
}

// A pipeline's exact plan past a few micro-batches is extrapolated from two recordings
// (exact_memory, pipeline_samples): equal, stage by stage and category by category, to the
// recording of every micro-batch, for each schedule, over models, layouts and techniques.
TEST(PlanMemory, PipelineExtrapolationEqualsTheFullRecording) {
    CpuBackend backend;
    Hardware cpu = memfit::test::h100_like();
    cpu.name = "cpu";
    struct Case { const char * model; int tp, pp, dp, zero; bool sp; const char * sched; int V; const char * rc; DType dt; };
    const Case cases[] = {
        {"nano", 1, 2, 1, 0, false, "1f1b", 1, "none", DType::f32},
        {"nano", 1, 3, 2, 1, false, "1f1b", 1, "selective", DType::bf16},
        {"llama-nano", 2, 2, 1, 0, true, "1f1b", 1, "full", DType::bf16},
        {"micro", 1, 4, 1, 1, false, "1f1b", 1, "none", DType::bf16},
        {"nano", 1, 2, 2, 0, false, "gpipe", 1, "none", DType::bf16},
        {"llama-nano", 1, 4, 1, 1, false, "gpipe", 1, "selective", DType::f32},
        {"nano", 1, 2, 1, 0, false, "interleaved", 2, "none", DType::f32},
        {"llama-nano", 2, 2, 2, 1, true, "interleaved", 2, "selective", DType::bf16},
        {"micro", 1, 2, 1, 0, false, "interleaved", 3, "full", DType::f16},
        {"llama-nano", 1, 3, 1, 0, false, "interleaved", 2, "none", DType::bf16},
    };
    for (const Case & k : cases) {
        ModelConfig cfg = model_preset(k.model);
        cfg.vocab_size = 256;
        cfg.n_layer = 6;
        Candidate c;
        c.layout.tp = k.tp, c.layout.pp = k.pp, c.layout.dp = k.dp, c.layout.zero = k.zero, c.layout.sp = k.sp;
        c.layout.schedule = std::string(k.sched) == "gpipe" ? PipeSchedule::gpipe
                            : std::string(k.sched) == "1f1b" ? PipeSchedule::one_f_one_b : PipeSchedule::interleaved;
        c.layout.virtual_stages = k.V;
        c.micro_batch = 2;
        c.recompute = k.rc;
        c.compute = k.dt;
        const PipelineSamples at = pipeline_samples(c.layout, 0);   // stage 0 samples the most
        for (int m = 1; m <= at.from + 6 * at.step; ++m) {
            if (c.layout.schedule == PipeSchedule::interleaved && m % k.pp) continue;
            SCOPED_TRACE(fmt::format("{} tp {} pp {} dp {} ZeRO-{} sp {} {}:{} {} m {}", k.model, k.tp, k.pp, k.dp, k.zero,
                                     k.sp, k.sched, k.V, k.rc, m));
            c.grad_accum = m;
            const DeviceMemory full = exact_memory(cfg, cpu, c, 32, backend, /*extrapolate=*/false);
            const DeviceMemory fast = exact_memory(cfg, cpu, c, 32, backend);
            ASSERT_EQ(full.stages.size(), size_t(k.pp));
            ASSERT_EQ(fast.stages.size(), size_t(k.pp));
            for (int st = 0; st < k.pp; ++st)
                for (size_t cat = 0; cat < kCategoryCount; ++cat)
                    EXPECT_EQ(fast.stages[size_t(st)].v[cat], full.stages[size_t(st)].v[cat])
                        << "stage " << st << " " << kCategoryNames[cat];
            EXPECT_EQ(fast.total(), full.total());
            EXPECT_EQ(fast.loaded, full.loaded);
        }
    }
}

// --loss-chunk auto (the default): gpt2-6l at 8 x 256 tokens would keep 411 MB of fp32 logits,
// about a third of its step: chunked by 512 tokens, the note says so, and the analytic model
// agrees; a byte vocabulary's logits are left whole; 0 keeps them whole; bad values are one line.
TEST(PlanMemory, AutoLossChunkWhenTheLogitsDominate) {
    EXPECT_EQ(parse_loss_chunk("auto"), -1);
    EXPECT_EQ(parse_loss_chunk("0"), 0);
    EXPECT_EQ(parse_loss_chunk("384"), 384);
    for (const char * bad : {"", "-3", "12x", "many"}) EXPECT_THROW(parse_loss_chunk(bad), ConfigError) << bad;
    EXPECT_EQ(auto_chunk_rows(2048), 512);
    EXPECT_EQ(auto_chunk_rows(65536), 8192);
    EXPECT_EQ(auto_chunk_rows(300), 300);

    CpuBackend backend;
    const ModelConfig cfg = model_preset("gpt2-6l");
    RunConfig r;
    r.micro_batch = 8;
    r.grad_accum = 1;
    r.seq = 256;
    ASSERT_EQ(r.loss_chunk, -1);
    const ResolvedRun chosen = resolve_run(r, cfg, backend, false);
    EXPECT_EQ(chosen.eo.loss_chunk, 512);
    ASSERT_FALSE(chosen.notes.empty());
    EXPECT_NE(chosen.notes[0].find("auto chose 512 tokens"), std::string::npos) << chosen.notes[0];
    r.loss_chunk = 0;
    const EngineOptions whole = engine_options(r, cfg, backend, false);
    EXPECT_EQ(whole.loss_chunk, 0);
    EXPECT_LT(StepPlans(cfg, backend, chosen.eo).reserved().total(),
              StepPlans(cfg, backend, whole).reserved().total() - 300'000'000);

    ModelConfig micro = model_preset("micro");
    micro.vocab_size = 256;
    r.loss_chunk = -1;
    EXPECT_EQ(engine_options(r, micro, backend, false).loss_chunk, 0);

    Hardware cpu = memfit::test::h100_like();
    cpu.name = "cpu";
    Candidate c;
    c.micro_batch = 8;
    c.compute = DType::f32;
    c.recompute = "none";
    c.loss_chunk = -1;
    const uint64_t auto_act = predict_memory(cfg, cpu, c, 256).device[Category::activations];
    c.loss_chunk = 0;
    EXPECT_EQ(predict_memory(cfg, cpu, c, 256).device[Category::activations] - auto_act,
              uint64_t(2048 - 512) * 50257 * 4);
}

namespace {

// A sweep of what the search plans on a GPU kind (the CUDA sizing backend's exact programs):
// presets, sequences, micro-batches, recomputation, ZeRO stages over data parallelism, tensor
// and pipeline parallelism, optimizers, bf16 master weights with stochastic rounding, QLoRA.
template <class F>
void sweep_recordable(F && each) {
    for (const char * preset : {"gpt2", "llama3.2-1b", "qwen2.5-0.5b"})
        for (int seq : {512, 2048})
            for (int mb : {1, 4})
                for (const char * rc : {"none", "selective", "full"})
                    for (auto [dp, zero] : {std::pair{1, 0}, {4, 1}, {4, 3}})
                        for (auto [tp, pp] : {std::pair{1, 1}, {2, 1}, {1, 2}})
                            for (int variant = 0; variant < 3; ++variant) {   // adamw, 8-bit + bf16-sr, QLoRA
                                if (pp > 1 && zero > 1) continue;
                                ModelConfig cfg = model_preset(preset);
                                cfg.max_seq = std::max(cfg.max_seq, seq);
                                Candidate c;
                                c.layout.dp = dp;
                                c.layout.tp = tp;
                                c.layout.pp = pp;
                                c.layout.zero = zero;
                                c.micro_batch = mb;
                                c.grad_accum = pp > 1 ? 4 : 2;
                                c.recompute = rc;
                                if (variant == 1) {
                                    c.optimizer = Optimizer::adamw_8bit;
                                    c.master_weights = MasterWeights::bf16_sr;
                                }
                                if (variant == 2) {
                                    if (zero == 3) continue;   // a packed base is not sharded
                                    c.lora.rank = 16;
                                    c.lora.base_weights = "nf4";
                                    c.lora_plan = make_lora_plan(cfg, memfit::test::lora_options(cfg, 16, BaseWeights::nf4));
                                }
                                each(cfg, c, seq, fmt::format("{} seq {} mb {} {} dp {} zero {} tp {} pp {} variant {}",
                                                              preset, seq, mb, rc, dp, zero, tp, pp, variant));
                            }
}

}  // namespace

// The search's filter judges candidates by the analytic model before their programs are
// recorded; it lets one through up to kAnalyticSlack over the device. So that it never rejects
// what the engine's program fits, the analytic bytes stay under that factor of the program's on
// every configuration swept (they are also never below half of them: the filter is not blind).
TEST(PlanMemory, AnalyticModelIsWithinTheSlack) {
    auto sizing = make_cuda_sizing_backend();
    const Hardware hw = memfit::test::h100_like();
    double most = 0, least = 1e9;
    std::string at_most;
    size_t n = 0;
    sweep_recordable([&](const ModelConfig & cfg, const Candidate & c, int seq, const std::string & name) {
        if (unsupported(candidate_run(c, seq), cfg, sizing.get())) return;
        const double ratio = double(predict_memory(cfg, hw, c, seq).total()) /
                             double(exact_memory(cfg, hw, c, seq, *sizing).total());
        ++n;
        if (ratio > most) most = ratio, at_most = name;
        least = std::min(least, ratio);
        EXPECT_LT(ratio, kAnalyticSlack) << name;
        EXPECT_GT(ratio, 0.5) << name;
    });
    EXPECT_GT(n, 500u);
    std::printf("%zu configurations: analytic / exact %.3f-%.3f (most: %s)\n", n, least, most, at_most.c_str());
}

// End to end: a configuration on a device exactly as large as its program (runtime included) is
// found by the search with its choices fixed, whatever the analytic model says.
TEST(PlanMemory, SearchFindsWhatFitsByItsProgram) {
    auto sizing = make_cuda_sizing_backend();
    size_t n = 0, over = 0;
    sweep_recordable([&](const ModelConfig & cfg, const Candidate & c, int seq, const std::string & name) {
        if (seq != 2048 || c.micro_batch != 4 || c.layout.tp > 1) return;   // a slice of the sweep: searches cost more
        if (unsupported(candidate_run(c, seq), cfg, sizing.get())) return;
        Hardware hw = memfit::test::h100_like();
        const DeviceMemory exact = exact_memory(cfg, hw, c, seq, *sizing);
        hw.memory = exact.total();
        hw.usable = hw.memory - (memfit::test::h100_like().memory - memfit::test::h100_like().usable);
        if (double(predict_memory(cfg, hw, c, seq).total()) > double(hw.memory)) ++over;
        PlanRequest r;
        r.cfg = cfg;
        r.hw = hw;
        r.gpus = c.layout.devices();
        r.run = candidate_run(c, seq);
        r.run.global_batch = c.micro_batch * c.grad_accum * c.layout.dp;
        r.tp = c.layout.tp;
        r.pp = c.layout.pp;
        r.zero = c.layout.zero;
        r.micro_batch = c.micro_batch;
        r.recompute = c.recompute.name();
        r.flash = c.flash();
        r.sp = false;
        r.offload = Offload::none;
        r.offload_acts = false;
        r.schedule = PipeSchedule::one_f_one_b;
        r.lora = c.lora_plan;
        r.exact_sizing = sizing.get();
        r.hint = false;
        const SearchReport rep = search_plans(r);
        ASSERT_EQ(rep.best.size(), 1u) << name;
        EXPECT_EQ(rep.best[0].mem.total(), exact.total()) << name;
        ++n;
    });
    EXPECT_GT(n, 20u);
    EXPECT_GT(over, 0u);   // some of them the analytic model alone would have rejected
    std::printf("%zu searches, %zu of them over the device by the analytic model\n", n, over);
}
