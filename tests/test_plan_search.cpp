// The configuration search: a ranked table for the example, fixed choices respected,
// rejected candidates explained, --min-gpus, the JSON, clear errors, and one-device plans on
// the `cpu` hardware carrying the engine's exact numbers.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "plan/plan_report.h"
#include "plan/search.h"
#include "test_util.h"

using namespace memfit;

namespace {


PlanRequest llama70b_on_64() {
    PlanRequest r;
    r.cfg = model_preset("llama2-70b");
    r.hw = memfit::test::h100_like();
    r.gpus = 64;
    r.nodes = 8;
    r.seq = 4096;
    r.global_batch = 1024;
    return r;
}

}  // namespace

TEST(PlanSearch, RanksFittingConfigurationsFastestFirst) {
    const PlanRequest r = llama70b_on_64();
    const SearchReport rep = search_plans(r);
    ASSERT_FALSE(rep.best.empty());
    EXPECT_GT(rep.evaluated, 1000u);
    for (size_t i = 0; i < rep.best.size(); ++i) {
        const PlanResult & p = rep.best[i];
        EXPECT_TRUE(p.fits);
        EXPECT_LE(p.mem.total(), r.hw.memory);
        EXPECT_EQ(p.c.layout.devices(), 64);
        EXPECT_EQ(p.c.layout.dp * p.c.micro_batch * p.c.accum, 1024);   // the global batch is kept
        EXPECT_GT(p.time.mfu, 0.0);
        EXPECT_LT(p.time.mfu, 1.0);
        if (i) {
            EXPECT_GE(rep.best[i - 1].time.tokens_per_s, p.time.tokens_per_s);
        }
    }
    // 70B parameters at 16 bytes each do not fit 8 devices' worth of memory without sharding
    // them further: every fitting layout splits the model or its states over >= 8 devices.
    for (const PlanResult & p : rep.best)
        EXPECT_TRUE(p.c.layout.tp * p.c.layout.pp >= 8 || p.c.layout.zero >= 1) << layout_name(p.c.layout);
    for (const PlanResult & p : rep.rejected) {
        EXPECT_FALSE(p.fits);
        EXPECT_NE(p.why.find("needs"), std::string::npos);
    }
    const std::string table = format_plan(r, rep, true);
    EXPECT_NE(table.find("rejected (fastest first)"), std::string::npos);
    const nlohmann::json j = plan_json(r, rep);
    EXPECT_EQ(j["best"].size(), rep.best.size());
    EXPECT_EQ(j["best"][0]["memory"]["total"].get<uint64_t>(), rep.best[0].mem.total());
    EXPECT_TRUE(j["best"][0]["layout"].contains("zero"));
}

TEST(PlanSearch, FixedChoicesAreRespected) {
    PlanRequest r = llama70b_on_64();
    r.tp = 8;
    r.pp = 2;
    r.recompute = "full";
    r.micro_batch = 2;
    const SearchReport rep = search_plans(r);
    ASSERT_FALSE(rep.best.empty());
    for (const PlanResult & p : rep.best) {
        EXPECT_EQ(p.c.layout.tp, 8);
        EXPECT_EQ(p.c.layout.pp, 2);
        EXPECT_EQ(p.c.layout.dp, 4);
        EXPECT_EQ(p.c.recompute, "full");
        EXPECT_EQ(p.c.micro_batch, 2);
    }
}

TEST(PlanSearch, MinGpusFindsTheFewestThatFit) {
    PlanRequest r = llama70b_on_64();
    r.global_batch = 64;
    SearchReport rep;
    const int n = min_gpus(r, 256, &rep);
    ASSERT_GT(n, 0);
    ASSERT_FALSE(rep.best.empty());
    EXPECT_EQ(rep.best.front().c.layout.devices(), n);
    // One node fewer does not fit.
    if (n > 8) {
        r.gpus = n - 8;
        r.nodes = r.gpus / 8;
        try {
            EXPECT_TRUE(search_plans(r).best.empty()) << n - 8 << " devices";
        } catch (const ConfigError &) {}
    }
}

TEST(PlanSearch, ClearErrors) {
    PlanRequest r = llama70b_on_64();
    r.global_batch = 3;   // 64 devices: every data-parallel size but 1 misses, and dp 1 cannot fit... still a layout
    r.tp = 8;
    r.pp = 1;             // dp = 8 does not divide 3
    EXPECT_THROW(search_plans(r), ConfigError);
    r = llama70b_on_64();
    r.seq = 8192;         // llama2-70b has 4096 positions
    EXPECT_THROW(search_plans(r), ConfigError);
}

TEST(PlanSearch, OneCpuDeviceCarriesTheEnginesExactNumbers) {
    CpuBackend backend;
    PlanRequest r;
    r.cfg = model_preset("llama-nano");
    r.cfg.vocab_size = 256;
    r.hw = memfit::test::h100_like();
    r.hw.name = "cpu";
    r.hw.usable = r.hw.memory;
    r.seq = 64;
    r.global_batch = 4;
    r.compute = DType::f32;
    r.exact_sizing = &backend;
    const SearchReport rep = search_plans(r);
    ASSERT_FALSE(rep.best.empty());
    for (const PlanResult & p : rep.best) {
        EXPECT_TRUE(p.mem.exact);
        const DeviceMemory e = exact_memory(r.cfg, r.hw, p.c, r.seq, backend);
        EXPECT_EQ(p.mem.total(), e.total());
    }
}
