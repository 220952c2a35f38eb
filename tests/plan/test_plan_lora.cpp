// memfit plan with LoRA / QLoRA: on one `cpu` device the plan is the engine's own program (per
// category, byte for byte, for dense, bf16, int8, nf4 and sparse24 bases); the analytic model puts
// llama2-7b's full fine-tune off an 80 GB GPU and LoRA / QLoRA on it, in the expected order;
// the search keeps the user's LoRA choice; bad flags are clear errors.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "core/error.h"
#include "model/lora.h"
#include "plan/lora_plan.h"
#include "plan/plan_report.h"
#include "plan/search.h"
#include "train/engine.h"
#include "plan/fit.h"
#include "test_util.h"

using namespace memfit;

namespace {

ModelConfig tiny(bool llama, int V, int C, int L) {
    ModelConfig c = test::small_config(V, C, L, 4, 64);
    if (llama) {
        c.family = "llama";
        c.n_kv_head = 2;
        c.ffn = 2 * C;
        c.tied_head = false;
    }
    c.validate();
    return c;
}

Hardware cpu_like() {
    Hardware h = test::h100_like();
    h.name = "cpu";
    h.usable = h.memory;
    h.per_node = 1;
    return h;
}

PlanRequest one_device(const ModelConfig & cfg, const Hardware & hw, int B, int T, int accum, DType dt) {
    PlanRequest r;
    r.cfg = cfg;
    r.hw = hw;
    r.gpus = 1;
    r.run.seq = T;
    r.run.global_batch = B * accum;
    r.micro_batch = B;
    r.run.compute = dt;
    return r;
}

uint64_t model_states(const CategoryBytes & b) {
    return b[Category::parameters] + b[Category::master_weights] + b[Category::optimizer_states] +
           b[Category::gradients];
}

}  // namespace

// (a) For runs the engine can do, the plan's bytes per category are what the engine measures.
TEST(PlanLora, ExactOnOneCpuDeviceForTheEngine) {
    CpuBackend backend;
    const Hardware hw = cpu_like();
    struct Case { bool llama; DType dt; BaseWeights base; const char * targets; const char * rc; bool flash; int accum; float dropout;
                  bool double_quant = true; bool dora = false; };
    for (const Case & k : {Case{true, DType::f32, BaseWeights::compute, "q,v", "none", true, 1, 0.0f},
                           Case{true, DType::bf16, BaseWeights::compute, "all", "selective", true, 1, 0.0f},
                           Case{true, DType::f32, BaseWeights::nf4, "all", "none", true, 1, 0.0f},
                           Case{true, DType::bf16, BaseWeights::nf4, "all", "none", true, 1, 0.0f, false},
                           Case{true, DType::bf16, BaseWeights::nf4, "all", "full", true, 2, 0.0f},
                           Case{true, DType::f32, BaseWeights::int8, "q,k,v,o", "none", false, 1, 0.0f},
                           Case{true, DType::bf16, BaseWeights::nf4, "all", "none", true, 1, 0.1f},
                           Case{false, DType::f32, BaseWeights::compute, "c_attn", "none", false, 1, 0.0f},
                           Case{false, DType::bf16, BaseWeights::int8, "all", "selective", true, 1, 0.05f},
                           Case{true, DType::bf16, BaseWeights::sparse24, "all", "none", true, 1, 0.0f},
                           Case{false, DType::f32, BaseWeights::sparse24, "c_attn", "none", false, 2, 0.0f},
                           Case{true, DType::bf16, BaseWeights::compute, "all", "selective", true, 2, 0.0f, true, true},
                           Case{false, DType::f32, BaseWeights::compute, "all", "none", false, 1, 0.0f, true, true},
                           Case{true, DType::bf16, BaseWeights::nf4, "all", "full", true, 1, 0.0f, true, true},
                           Case{true, DType::bf16, BaseWeights::gptq, "all", "none", true, 1, 0.0f},
                           Case{false, DType::f32, BaseWeights::gptq, "c_attn", "selective", false, 2, 0.0f}}) {
        const ModelConfig cfg = tiny(k.llama, 61, 64, 3);
        LoraOptions lora = test::lora_options(cfg, 4, k.base, k.targets);
        lora.gptq_group = 16;   // GPTQ: 4-bit groups of 16 (128 does not divide 64 inputs)
        lora.dropout = k.dropout;
        lora.double_quant = k.double_quant;
        lora.dora = k.dora;
        SCOPED_TRACE(fmt::format("{} {} {}{} {} {} {} accum {} dropout {}{}", k.llama ? "llama" : "gpt2", dtype_name(k.dt),
                                 base_weights_name(k.base), k.double_quant ? "" : " (no double quant)", k.targets, k.rc,
                                 k.flash ? "flash" : "naive", k.accum, k.dropout, k.dora ? " dora" : ""));
        const int B = 2, T = 16;
        PlanRequest r = one_device(cfg, hw, B, T, k.accum, k.dt);
        r.recompute = k.rc;
        r.flash = k.flash;
        r.lora = make_lora_plan(cfg, lora);
        r.exact_sizing = &backend;
        const SearchReport rep = search_plans(r);
        ASSERT_EQ(rep.best.size(), 1u);
        const DeviceMemory & plan = rep.best[0].mem;
        EXPECT_TRUE(plan.exact);
        ASSERT_TRUE(rep.best[0].c.lora_plan);

        EngineOptions eo;
        eo.B = B;
        eo.T = T;
        eo.grad_accum = k.accum;
        eo.with_eval = false;
        eo.flash_attention = k.flash;
        eo.compute = k.dt;
        eo.recompute = parse_recompute(k.rc, cfg.n_layer);
        eo.lora = lora;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        std::vector<int32_t> in(size_t(B * T * k.accum)), tg(in.size());
        for (int s = 0; s < 2; ++s) {
            test::random_batch(in, tg, cfg.vocab_size, uint64_t(s));
            e.train_step(in.data(), tg.data(), OptimHyper{});
        }
        const CategoryBytes live = e.ledger().live_peak(), rsv = e.ledger().reserved_peak();
        for (size_t cat = 0; cat < kCategoryCount; ++cat) {
            if (Category(cat) == Category::runtime) continue;
            EXPECT_EQ(plan.device.v[cat], live.v[cat]) << kCategoryNames[cat];
            EXPECT_EQ(e.planned_reserved().v[cat], rsv.v[cat]) << kCategoryNames[cat];
        }
        EXPECT_EQ(plan.device[Category::runtime], hw.memory - hw.usable);
        // No gradients, master copy or moments for the base: only for the adapters.
        const uint64_t A = lora_param_count(cfg, lora);
        EXPECT_EQ(plan.device[Category::optimizer_states], 8 * A);
        EXPECT_EQ(plan.device[Category::master_weights], k.dt == DType::f32 ? 0 : 4 * A);
        EXPECT_EQ(plan.device[Category::gradients], A * (k.accum > 1 ? 4 : dtype_size(k.dt)));

        // The analytic model (the search's) agrees on the model states to the alignment padding,
        // and on the total within the tolerance the full-run model has on one device.
        Candidate c = rep.best[0].c;
        const DeviceMemory approx = predict_memory(cfg, hw, c, T);
        EXPECT_EQ(approx.device[Category::master_weights], plan.device[Category::master_weights]);
        EXPECT_EQ(approx.device[Category::optimizer_states], plan.device[Category::optimizer_states]);
        EXPECT_EQ(approx.device[Category::gradients], plan.device[Category::gradients]);
        EXPECT_NEAR(double(approx.device[Category::parameters]), double(plan.device[Category::parameters]), 192.0);
        EXPECT_NEAR(double(approx.frozen), double(plan.frozen), 128.0);
        // (Without the CPU backend's gemm workspace, which the analytic model leaves to the
        // exact plan on the `cpu` hardware: at these sizes it is as large as the activations.)
        auto no_ws = [](const DeviceMemory & d) {
            return d.total() - d.device[Category::runtime] - d.device[Category::workspace];
        };
        const double ratio = double(no_ws(approx)) / double(no_ws(plan));
        EXPECT_GT(ratio, 0.8);
        EXPECT_LT(ratio, 1.5);
        const double acts = double(approx.device[Category::activations]) / double(plan.device[Category::activations]);
        EXPECT_GT(acts, 0.8);
        EXPECT_LT(acts, 1.7);
    }
}

// (b) The analytic model on llama2-7b and an 80 GB GPU, batch 1, seq 512, bf16.
TEST(PlanLora, Llama7bOnAn80GBGpu) {
    const ModelConfig cfg = model_preset("llama2-7b");
    const Hardware hw = test::h100_like();
    auto request = [&](int rank, BaseWeights base) {
        PlanRequest r = one_device(cfg, hw, 1, 512, 1, DType::bf16);
        r.micro_batch.reset();
        r.offload = Offload::none;   // everything on the GPU
        if (rank > 0) r.lora = make_lora_plan(cfg, test::lora_options(cfg, rank, base, ""));
        return r;
    };
    const PlanRequest full = request(0, BaseWeights::compute), lora = request(16, BaseWeights::compute),
                      qlora = request(16, BaseWeights::nf4);
    const SearchReport rf = search_plans(full), rl = search_plans(lora), rq = search_plans(qlora);
    EXPECT_TRUE(rf.best.empty()) << "16 bytes per parameter of 6.7B do not fit 80 GB";
    ASSERT_FALSE(rf.rejected.empty());
    PlanRequest offloaded = full;   // ZeRO-Offload: master weights, moments and gradients in host memory
    offloaded.offload.reset();
    EXPECT_FALSE(search_plans(offloaded).best.empty());
    ASSERT_FALSE(rl.best.empty());
    ASSERT_FALSE(rq.best.empty());

    Candidate c;
    c.micro_batch = 1;
    c.recompute = "none";
    const DeviceMemory mf = predict_memory(cfg, hw, c, 512);
    c.lora_plan = lora.lora;
    const DeviceMemory ml = predict_memory(cfg, hw, c, 512);
    c.lora_plan = qlora.lora;
    const DeviceMemory mq = predict_memory(cfg, hw, c, 512);
    const double P = double(cfg.num_params());
    EXPECT_NEAR(double(model_states(mf.device)) / P, 16.0, 0.01);
    EXPECT_GT(double(model_states(mf.device)), 100e9);
    EXPECT_LT(model_states(mq.device), model_states(ml.device));
    EXPECT_LT(model_states(ml.device), model_states(mf.device));
    EXPECT_LT(model_states(ml.device), uint64_t(2.02 * P));   // the bf16 base plus a little
    // LoRA changes activations too: no projection inputs kept for weight gradients.
    EXPECT_LT(ml.device[Category::activations], mf.device[Category::activations]);

    // The frozen base: nf4 (double-quantized) is 0.5 + 1/64 + ~1/16384 bytes per projection
    // weight, 0.258 of bf16's 2; with the embeddings and head that stay bf16, 0.28-0.30 of the
    // bf16 base as a whole.
    const LoraPlan & q = *qlora.lora;
    const double proj_ratio = double(q.packed_per_layer) / (2.0 * double(q.projection_params));
    EXPECT_NEAR(proj_ratio, (0.5 + 1.0 / 64) / 2, 0.001);
    const double base_ratio = double(mq.frozen) / double(ml.frozen);
    EXPECT_GT(base_ratio, 0.28);
    EXPECT_LT(base_ratio, 0.30);
    EXPECT_NEAR(double(ml.frozen), 2.0 * P, 1e3);

    // Time: the base's weight gradients are gone (about a third of the matmul work) and the
    // optimizer touches only the adapters; dequantizing a packed base costs memory traffic.
    const StepTime tf = predict_step_time(cfg, hw, rf.rejected.front().c, 512, 1);
    Candidate cf = rf.rejected.front().c;
    Candidate cl = cf, cq = cf;
    cl.lora_plan = lora.lora;
    cq.lora_plan = qlora.lora;
    const StepTime tl = predict_step_time(cfg, hw, cl, 512, 1), tq = predict_step_time(cfg, hw, cq, 512, 1);
    EXPECT_GT(tl.compute / tf.compute, 0.62);
    EXPECT_LT(tl.compute / tf.compute, 0.75);
    EXPECT_LT(tl.memory_bound, tf.memory_bound);   // no 28 bytes per base parameter of AdamW
    EXPECT_GT(tq.memory_bound, tl.memory_bound);
    EXPECT_NEAR(tq.compute, tl.compute, 1e-9 * tl.compute);
    EXPECT_GT(tl.mfu, 0.0);
    EXPECT_LT(tl.mfu, 1.0);
}

// (c) The search keeps the user's choice: LoRA stays on when asked for, never appears otherwise;
// a packed base shards under ZeRO-3 and leaves parameter offload out (and refuses it when fixed).
TEST(PlanLora, SearchKeepsTheUsersChoice) {
    PlanRequest r;
    r.cfg = model_preset("llama2-7b");
    r.hw = test::h100_like();
    r.gpus = 8;
    r.run.seq = 2048;
    r.run.global_batch = 64;
    r.top = 50;
    const SearchReport none = search_plans(r);
    ASSERT_FALSE(none.best.empty());
    for (const auto * v : {&none.best, &none.rejected})
        for (const PlanResult & p : *v) EXPECT_FALSE(p.c.lora_plan) << layout_name(p.c.layout);

    r.lora = make_lora_plan(r.cfg, test::lora_options(r.cfg, 16, BaseWeights::nf4));
    const SearchReport q = search_plans(r);
    ASSERT_FALSE(q.best.empty());
    for (const auto * v : {&q.best, &q.rejected})
        for (const PlanResult & p : *v) {
            EXPECT_EQ(p.c.lora_plan, r.lora) << layout_name(p.c.layout);
            EXPECT_NE(p.c.layout.offload, Offload::optimizer_params);
        }
    const std::string table = format_plan(r, q, true);
    EXPECT_NE(table.find("LoRA rank 16"), std::string::npos) << table;
    EXPECT_NE(table.find("base nf4"), std::string::npos) << table;
    const nlohmann::json j = plan_json(r, q);
    EXPECT_EQ(j["lora"]["rank"], 16);
    EXPECT_EQ(j["lora"]["base_weights"], "nf4");
    EXPECT_EQ(j["lora"]["trainable_params"].get<int64_t>(), r.lora->adapters);
    EXPECT_EQ(j["lora"]["targets"].size(), 7u);
    EXPECT_GT(j["best"][0]["memory"]["frozen"].get<uint64_t>(), 0u);
    EXPECT_TRUE(plan_json(PlanRequest{}, none)["lora"].is_null());
    EXPECT_EQ(j["lora"]["double_quant"], true);
    EXPECT_EQ(j["best"][0]["command"].get<std::string>().find("nf4-double-quant"), std::string::npos);

    // --nf4-double-quant false: fp32 absmaxes, 0.5 bits per packed parameter instead of 0.127, and the
    // emitted command keeps the choice.
    PlanRequest plain = r;
    LoraOptions po = test::lora_options(r.cfg, 16, BaseWeights::nf4);
    po.double_quant = false;
    plain.lora = make_lora_plan(r.cfg, po);
    plain.run.lora.nf4_double_quant = false;
    const SearchReport qp = search_plans(plain);
    ASSERT_FALSE(qp.best.empty());
    const nlohmann::json jp = plan_json(plain, qp);
    EXPECT_EQ(jp["lora"]["double_quant"], false);
    EXPECT_GT(plain.lora->packed_per_layer, r.lora->packed_per_layer);
    const double extra_bits = 8.0 * double(plain.lora->packed_per_layer - r.lora->packed_per_layer) /
                              double(r.lora->projection_params);
    EXPECT_NEAR(extra_bits, 0.5 - 0.127, 0.003);
    EXPECT_NE(jp["best"][0]["command"].get<std::string>().find(" --nf4-double-quant false"), std::string::npos)
        << jp["best"][0]["command"];

    // ZeRO-3 shards a packed base like any parameter (FSDP-QLoRA): each rank holds 1/dp of it.
    r.zero = 3;
    const SearchReport qz3 = search_plans(r);
    ASSERT_FALSE(qz3.best.empty());
    const PlanResult & qb = qz3.best.front();
    // The whole packed base: every layer's packed projections, the rest (embeddings, norms, head) in bf16.
    const LoraPlan & lq = *r.lora;
    const uint64_t whole_nf4 = lq.packed_per_layer * uint64_t(r.cfg.n_layer) +
                               2 * uint64_t(r.cfg.num_params() - lq.projection_params * r.cfg.n_layer);
    EXPECT_NEAR(double(qb.mem.frozen) * qb.c.layout.dp * qb.c.layout.tp * qb.c.layout.pp, double(whole_nf4),
                0.02 * double(whole_nf4));
    EXPECT_LT(double(whole_nf4), 0.3 * 2.0 * double(r.cfg.num_params()));
    r.zero.reset();
    r.offload = Offload::optimizer_params;
    EXPECT_THROW(search_plans(r), ConfigError);
    // A bf16 base shards under ZeRO-3 like parameters; the adapters' states shard with it.
    r.offload.reset();
    r.zero = 3;
    r.lora = make_lora_plan(r.cfg, test::lora_options(r.cfg, 16));
    const SearchReport z3 = search_plans(r);
    ASSERT_FALSE(z3.best.empty());
    const PlanResult & b = z3.best.front();
    EXPECT_NEAR(double(b.mem.frozen) * b.c.layout.dp * b.c.layout.tp * b.c.layout.pp, 2.0 * double(r.cfg.num_params()),
                0.02 * 2.0 * double(r.cfg.num_params()));
}

// (d) The flags as `memfit train` checks them: one clear ConfigError each.
TEST(PlanLora, BadFlagsAreConfigErrors) {
    const ModelConfig cfg = model_preset("llama2-7b");
    auto options = [&](int rank, const std::string & base, const std::string & targets, const std::string & precision) {
        RunConfig s;
        s.compute = parse_precision(precision);
        s.lora.rank = rank;
        s.lora.base_weights = base;
        s.lora.targets = targets;
        return lora_options(s, cfg, parse_precision(precision));
    };
    EXPECT_THROW(options(0, "nf4", "", "bf16"), ConfigError);
    EXPECT_THROW(options(0, "int8", "", "bf16"), ConfigError);
    EXPECT_THROW(options(8, "nf4", "nonsense", "bf16"), ConfigError);
    EXPECT_THROW(options(8, "int4", "", "bf16"), ConfigError);
    EXPECT_THROW(options(8, "bf16", "", "fp32"), ConfigError);   // the dense base is the compute dtype
    EXPECT_THROW(options(5000, "nf4", "", "bf16"), ConfigError);
    EXPECT_FALSE(options(0, "compute", "", "bf16").enabled());
    EXPECT_TRUE(options(8, "nf4", "all", "bf16").quantized());
    EXPECT_EQ(options(8, "nf4", "all", "bf16").format(), QuantFormat::nf4_dq);   // QLoRA's default
    // --nf4-double-quant false: plain fp32 absmaxes; refused where nothing is nf4.
    auto plain = [&](const std::string & base, const std::string & teacher) {
        RunConfig s;
        s.compute = DType::bf16;
        s.lora.rank = 8;
        s.lora.base_weights = base;
        s.lora.nf4_double_quant = false;
        s.distill.weights = teacher;
        return lora_options(s, cfg, DType::bf16);
    };
    EXPECT_EQ(plain("nf4", "compute").format(), QuantFormat::nf4);
    EXPECT_EQ(plain("int8", "nf4").format(), QuantFormat::int8);   // the teacher's nf4 is what it applies to
    try {
        plain("int8", "compute");
        ADD_FAILURE() << "--nf4-double-quant false without nf4 accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("--base-weights nf4 or --teacher-weights nf4"), std::string::npos) << e.what();
    }

    // Through the command: one line on stderr, a non-zero exit.
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("memfit_plan_lora_test." + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    auto run = [&](const std::string & args) {
        const std::string err = (dir / "err.txt").string();
        const int status = std::system((std::string(MEMFIT_BINARY) + " plan --model llama2-7b --hardware h100-80g " +
                                        args + " >/dev/null 2>" + err).c_str());
        std::ifstream in(err);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : 128, text);
    };
    for (const auto & [args, needle] : {std::pair<std::string, std::string>{"--base-weights nf4", "--lora-rank"},
                                        {"--lora-rank 0 --base-weights nf4", "--lora-rank"},
                                        {"--lora-rank 8 --lora-targets nonsense", "--lora-targets"},
                                        {"--lora-rank 8 --base-weights nf4 --gpus 8 --offload optimizer+params", "packed base"}}) {
        SCOPED_TRACE(args);
        const auto [code, err] = run(args);
        EXPECT_NE(code, 0);
        EXPECT_LT(code, 128);
        EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
        EXPECT_NE(err.find(needle), std::string::npos) << err;
    }
    const auto [code, err] = run("--lora-rank 16 --base-weights nf4 --gpus 1 --seq 512 --global-batch 1");
    EXPECT_EQ(code, 0) << err;
    const auto [bad_code, bad_err] = run("--lora-rank 16 --base-weights int8 --nf4-double-quant false");
    EXPECT_NE(bad_code, 0);
    EXPECT_NE(bad_err.find("--nf4-double-quant false: no nf4 weights"), std::string::npos) << bad_err;
    std::filesystem::remove_all(dir);
}
