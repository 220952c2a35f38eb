// The run configuration (src/run/): the batch arithmetic, the one compatibility function that
// the engine, the planner and the trainer ask, and the recompute policies' table.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "core/error.h"
#include "plan/memory_model.h"
#include "plan/search.h"
#include "run/compat.h"
#include "run/run_config.h"
#include "train/engine.h"
#include "train/schedule.h"
#include "test_util.h"

namespace memfit {
namespace {

RunConfig batch(int micro, int accum, int global, int legacy = 0) {
    RunConfig r;
    r.micro_batch = micro;
    r.grad_accum = accum;
    r.global_batch = global;
    r.batch = legacy;
    return r;
}

std::string error_of(RunConfig r, int dp) {
    try {
        resolve_batch(r, dp);
    } catch (const ConfigError & e) {
        return e.what();
    }
    return "";
}

TEST(RunConfig, AnyTwoOfMicroBatchAccumulationAndGlobalBatchGiveTheThird) {
    struct Case { RunConfig in; int dp, micro, accum, global; };
    const Case cases[] = {
        {batch(4, 2, 0), 2, 4, 2, 16},   // micro x accum x dp
        {batch(4, 0, 16), 2, 4, 2, 16},  // accumulation follows
        {batch(0, 2, 16), 2, 4, 2, 16},  // micro-batch follows
        {batch(0, 0, 16), 4, 4, 1, 16},  // DeepSpeed's rule: no accumulation unless asked
        {batch(0, 0, 0), 3, 8, 1, 24},   // the defaults, per rank
        {batch(0, 3, 0, 8), 2, 4, 3, 24},   // --batch: over all ranks
        {batch(2, 3, 12), 2, 2, 3, 12},  // all three, consistent
    };
    for (const Case & c : cases) {
        RunConfig r = c.in;
        resolve_batch(r, c.dp);
        EXPECT_EQ(r.micro_batch, c.micro);
        EXPECT_EQ(r.grad_accum, c.accum);
        EXPECT_EQ(r.global_batch, c.global);
        EXPECT_EQ(r.batch, c.micro * c.dp);
    }
    EXPECT_NE(error_of(batch(4, 2, 10), 1).find("--micro-batch 4 x --grad-accum 2 x 1 = 8, not --global-batch 10"),
              std::string::npos);
    EXPECT_NE(error_of(batch(3, 0, 16), 2).find("--global-batch 16 does not divide into micro-batches of 3 on 2 ranks"),
              std::string::npos);
    EXPECT_NE(error_of(batch(0, 3, 16), 1).find("does not divide by 3 accumulation steps"), std::string::npos);
    EXPECT_NE(error_of(batch(0, 0, 0, 3), 2).find("--batch 3 is not divisible by the 2 data-parallel ranks"),
              std::string::npos);
    EXPECT_NE(error_of(batch(3, 0, 0, 8), 2).find("disagree"), std::string::npos);
    EXPECT_NE(error_of(batch(-1, 0, 0), 1).find("--micro-batch -1"), std::string::npos);
    EXPECT_NE(error_of(batch(1 << 20, 1 << 12, 0), 8).find("a global batch of"), std::string::npos);
}

// Each rule of what combines, from the one function; the engine and the planner give the same
// reason because they ask it.
TEST(RunConfig, OneFunctionSaysWhatCombines) {
    const ModelConfig cfg = test::small_config(96, 64, 4, 4);
    auto run = [](auto edit) {
        RunConfig r;
        r.micro_batch = 2;
        r.grad_accum = 4;
        r.seq = 16;
        edit(r);
        return r;
    };
    struct Case { RunConfig r; const char * says; };
    const Case cases[] = {
        {run([](RunConfig & r) { r.layout.zero = 4; }), "--zero 4: expected 0"},
        {run([](RunConfig & r) { r.layout.tp = 0; }), "--tp 0"},
        {run([](RunConfig & r) { r.layout.pp = 5000; }), "--pp 5000"},
        {run([](RunConfig & r) { r.bucket_mb = -1; }), "--bucket-mb -1"},
        {run([](RunConfig & r) { r.layout.offload = Offload::optimizer_params; }), "--offload optimizer+params with --zero 0"},
        {run([](RunConfig & r) { r.layout.offload = Offload::optimizer_params, r.layout.zero = 3, r.offload_fraction = 0.5; }),
         "--offload-fraction 0.5 with --offload optimizer+params"},
        {run([](RunConfig & r) { r.layout.offload = Offload::optimizer_params, r.layout.zero = 3, r.lora.rank = 8; }),
         "--offload optimizer+params with LoRA"},
        {run([](RunConfig & r) { r.layout.offload = Offload::optimizer_params, r.layout.zero = 3, r.layout.pp = 2; }),
         "--offload optimizer+params with --pp 2"},
        {run([](RunConfig & r) { r.offload_dir = "/tmp"; }), "add --offload optimizer"},
        {run([](RunConfig & r) { r.layout.offload = Offload::optimizer, r.offload_fraction = 0; }), "--offload-fraction 0"},
        {run([](RunConfig & r) { r.precision_auto = true; }), "--precision auto needs --fit auto"},
        {run([](RunConfig & r) { r.fit_auto = true, r.layout.tp = 2; }), "--fit auto searches one rank's"},
        {run([](RunConfig & r) { r.layout.zero = 3, r.recompute = "every:2"; }), "--zero 3 gathers each layer's"},
        {run([](RunConfig & r) { r.layout.tp = 3; }), "--tp 3"},
        {run([](RunConfig & r) { r.layout.sp = true; }), "--sp splits the sequence"},
        {run([](RunConfig & r) { r.layout.tp = 2, r.layout.sp = true, r.micro_batch = 1, r.seq = 7; }), "7 tokens"},
        {run([](RunConfig & r) { r.layout.pp = 2, r.grad_accum = 3, r.layout.schedule = PipeSchedule::interleaved,
                                 r.layout.virtual_stages = 2; }), "must be a multiple of --pp 2"},
        {run([](RunConfig & r) { r.layout.pp = 5; }), "--pp 5"},
    };
    for (const Case & c : cases) {
        const auto why = unsupported(c.r, cfg, nullptr);
        ASSERT_TRUE(why) << c.says;
        EXPECT_NE(why->find(c.says), std::string::npos) << *why;
    }
    EXPECT_FALSE(unsupported(run([](RunConfig &) {}), cfg, nullptr));
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.tp = 2, r.layout.pp = 2, r.layout.zero = 1; }), cfg,
                             nullptr));
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.device = "cuda", r.layout.tp = 2, r.layout.pp = 2; }), cfg,
                             nullptr));
    // FSDP x TP (torchtitan's 2D) and FSDP-QLoRA.
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.tp = 2, r.layout.sp = true, r.layout.zero = 3; }), cfg,
                             nullptr));
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.tp = 2, r.layout.zero = 2; }), cfg, nullptr));
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.zero = 3, r.lora.rank = 8; }), cfg, nullptr));
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.pp = 2, r.layout.zero = 3; }), cfg, nullptr));
    // LoRA with tensor parallelism, but not on a KV head several tensor ranks hold.
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.tp = 2, r.lora.rank = 4; }), cfg, nullptr));
    EXPECT_FALSE(unsupported(run([](RunConfig & r) { r.layout.pp = 2, r.lora.rank = 4; }), cfg, nullptr));
    const ModelConfig gqa = test::small_family(true, 96, 64, 2, 4, 128);   // 2 KV heads
    RunConfig kv = run([](RunConfig & r) { r.layout.tp = 4, r.lora.rank = 4; });
    EXPECT_NE(unsupported(kv, gqa, nullptr).value_or("").find("--tp 4 with LoRA on k or v"), std::string::npos);
    kv.lora.targets = "q,o,gate,up,down";
    EXPECT_FALSE(unsupported(kv, gqa, nullptr));
    // Where the offloaded states go: files on the CPU backend, pinned host memory on a GPU.
    const auto gpu = make_cuda_sizing_backend();
    CpuBackend host;
    const RunConfig off = run([](RunConfig & r) { r.layout.offload = Offload::optimizer; });
    RunConfig off_dir = off;
    off_dir.offload_dir = "/tmp";
    EXPECT_FALSE(unsupported(off, cfg, nullptr));
    EXPECT_FALSE(unsupported(off, cfg, gpu.get()));
    EXPECT_FALSE(unsupported(off_dir, cfg, &host));
    EXPECT_NE(unsupported(off, cfg, &host).value_or("").find("add --offload-dir DIR"), std::string::npos);
    EXPECT_NE(unsupported(off_dir, cfg, gpu.get()).value_or("").find("drop --offload-dir"), std::string::npos);
    // The kernels: flash attention the CUDA kernels cannot run (head dimension 16).
    const auto flash = unsupported(run([](RunConfig & r) { r.attention = Attention::flash; }), cfg, gpu.get());
    ASSERT_TRUE(flash);
    EXPECT_NE(flash->find("not 16; use --attention naive"), std::string::npos) << *flash;

    // The engine asks it: the step refuses ZeRO-3 with segment recomputation in the same words.
    CpuBackend cpu;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.data_parallel = 2, eo.zero = 3;
    eo.recompute = parse_recompute("every:2", cfg.n_layer);
    try {
        StepPlans plans(cfg, cpu, eo);
        ADD_FAILURE() << "ZeRO-3 with every:2 was planned";
    } catch (const ConfigError & e) {
        EXPECT_EQ(std::string(e.what()), *unsupported(run([](RunConfig & r) {
            r.layout.zero = 3, r.layout.dp = 2, r.recompute = "every:2";
        }), cfg, nullptr));
    }
    // The planner asks it: what the engine does not run is planned analytically only.
    Candidate c;
    c.layout.dp = 2;
    c.layout.offload = Offload::optimizer;
    EXPECT_THROW(exact_memory(cfg, test::h100_like(), c, 16, cpu), ConfigError);
    EXPECT_NO_THROW(predict_memory(cfg, test::h100_like(), c, 16));
}

TEST(RunConfig, RecomputePoliciesComeFromOneTable) {
    std::vector<std::string> names;
    for (const RecomputePolicy & p : recompute_policies()) {
        const std::string spelled = p.kind == RecomputePolicy::segments ? std::string(p.name) + ":2" : p.name;
        const Recompute r(spelled);
        EXPECT_EQ(r.name(), spelled);
        EXPECT_EQ(&r.info(), &p);
        EXPECT_NE(recompute_help().find(p.help), std::string::npos) << p.name;
        if (p.searched) names.push_back(p.name);
    }
    EXPECT_EQ(names, searched_recompute_policies());
    EXPECT_EQ(searched_recompute_policies(), (std::vector<std::string>{"none", "full", "selective"}));
    EXPECT_EQ(Recompute("selective").uniform_mask("test"), kKeepSelective);
    EXPECT_THROW(Recompute("sqrt").uniform_mask("test"), ConfigError);
    try {
        Recompute("every:0");
        ADD_FAILURE();
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("expected none, full, every:K (K >= 1), sqrt, selective, budget"),
                  std::string::npos) << e.what();
    }
    EXPECT_THROW(Recompute("every:"), ConfigError);
    EXPECT_THROW(Recompute("none:3"), ConfigError);
}

TEST(RunConfig, ConfigJsonNamesEveryFieldByItsFlag) {
    RunConfig r;
    r.micro_batch = 3;
    r.layout.schedule = PipeSchedule::interleaved;
    r.layout.virtual_stages = 2;
    r.layout.offload = Offload::optimizer_params;
    r.recompute = "every:3";
    r.budget = 1 << 20;
    const nlohmann::json j = run_config_json(r);
    EXPECT_EQ(j["micro-batch"], 3);
    EXPECT_FALSE(j.contains("grad-accum"));   // unset: left to resolve_batch
    EXPECT_EQ(j["schedule"], "interleaved:2");
    EXPECT_EQ(j["offload"], "optimizer+params");
    EXPECT_EQ(j["recompute"], "every:3");
    EXPECT_EQ(j["memory-budget"], "1048576");
    EXPECT_EQ(j["precision"], "fp32");
    for (const char * n : {"fp32", "bf16", "fp16"}) EXPECT_EQ(precision_name(parse_precision(n)), n);
    for (const char * n : {"adamw", "adamw-bf16", "sgd", "adamw-8bit"}) EXPECT_STREQ(optimizer_name(parse_optimizer(n)), n);
    EXPECT_EQ(parse_optimizer("adamw8bit"), Optimizer::adamw_8bit);   // the spelling, bitsandbytes' too
    // bitsandbytes' paged optimizers: refused with the planned remedy named.
    try {
        parse_optimizer("paged_adamw_8bit");
        ADD_FAILURE() << "no error";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("--offload optimizer [--offload-fraction F]"), std::string::npos) << e.what();
    }
    for (const char * n : {"auto", "flash", "naive"}) EXPECT_STREQ(attention_name(parse_attention(n)), n);
    EXPECT_THROW(parse_offload("nvme"), ConfigError);
}

TEST(RunConfig, LearningRateDecaysAndLossScaling) {
    LrSchedule s{1.0f, 2, 10, 0.1f, LrDecay::linear};
    EXPECT_FLOAT_EQ(s.at(1), 0.5f);
    EXPECT_FLOAT_EQ(s.at(6), 0.1f + 0.9f * 0.5f);
    EXPECT_FLOAT_EQ(s.at(10), 0.1f);
    s.decay = LrDecay::constant;
    EXPECT_FLOAT_EQ(s.at(6), 1.0f);
    EXPECT_FLOAT_EQ(s.at(10), 1.0f);
    s.decay = LrDecay::cosine;
    EXPECT_FLOAT_EQ(s.at(6), 0.1f + 0.9f * 0.5f);   // halfway: cos = 0

    LossScaler fixed;
    fixed.dynamic = false;
    fixed.scale = 128;
    EXPECT_FALSE(fixed.update(false));
    EXPECT_EQ(fixed.scale, 128);
    EXPECT_EQ(fixed.skipped, 1);
    for (int i = 0; i < 5000; ++i) fixed.update(true);
    EXPECT_EQ(fixed.scale, 128);
    LossScaler dyn;
    dyn.scale = 8;
    dyn.min_scale = 4;
    dyn.growth_interval = 3;
    dyn.update(false);
    dyn.update(false);
    EXPECT_EQ(dyn.scale, 4);   // not below min_scale
    for (int i = 0; i < 3; ++i) dyn.update(true);
    EXPECT_EQ(dyn.scale, 8);
}

}  // namespace
}  // namespace memfit
