// The configuration search: a ranked table for the issue's example, fixed choices respected,
// rejected candidates explained, --min-gpus, the JSON, clear errors, and one-device plans on
// the `cpu` hardware carrying the engine's exact numbers.
#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "core/error.h"
#include "plan/hardware.h"
#include "plan/lora_plan.h"
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
    r.run.seq = 4096;
    r.run.global_batch = 1024;
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
        EXPECT_EQ(p.c.layout.dp * p.c.micro_batch * p.c.grad_accum, 1024);   // the global batch is kept
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
    r.run.global_batch = 64;
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
    r.run.global_batch = 3;   // 64 devices: every data-parallel size but 1 misses, and dp 1 cannot fit... still a layout
    r.tp = 8;
    r.pp = 1;             // dp = 8 does not divide 3
    EXPECT_THROW(search_plans(r), ConfigError);
    r = llama70b_on_64();
    r.run.seq = 8192;         // llama2-70b has 4096 positions
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
    r.run.seq = 64;
    r.run.global_batch = 4;
    r.run.compute = DType::f32;
    r.exact_sizing = &backend;
    const SearchReport rep = search_plans(r);
    ASSERT_FALSE(rep.best.empty());
    for (const PlanResult & p : rep.best) {
        EXPECT_TRUE(p.mem.exact);
        const DeviceMemory e = exact_memory(r.cfg, r.hw, p.c, r.run.seq, backend);
        EXPECT_EQ(p.mem.total(), e.total());
    }
}

// Every configuration the search lists as fitting fits by the bytes it carries and prints, over
// models, device kinds and layouts (searched and fixed): the exact plans are the engine's own
// program (recorded again here), and the table and the JSON show those same bytes.
TEST(PlanSearch, ListedConfigurationsFitByTheBytesTheyPrint) {
    const std::vector<Hardware> catalog = default_hardware_catalog("/nonexistent/calibration.json");
    const std::unique_ptr<Backend> cuda = make_cuda_sizing_backend();
    struct Case {
        const char * model, * hw;
        int gpus, seq, global_batch;
        size_t top;
        std::function<void(PlanRequest &)> fix;
    };
    const std::vector<Case> cases = {
        // With the layouts train does not run yet.
        {"llama2-70b", "h100-80g", 64, 4096, 1024, 50, [](PlanRequest & r) { r.include_plan_only = true; }},
        // Parameter offload with a pipeline: refused, so not recorded (the analytic model's numbers).
        {"llama2-70b", "h100-80g", 64, 4096, 1024, 10, [](PlanRequest & r) {
             r.include_plan_only = true, r.offload = Offload::optimizer_params, r.zero = 3, r.pp = 2;
         }},
        {"llama2-70b", "h100-80g", 1024, 4096, 1024, 5, {}},
        {"llama3-8b", "h100-80g", 8, 8192, 16, 5,
         [](PlanRequest & r) { r.zero = 3, r.micro_batch = 2, r.recompute = "selective", r.tp = 1, r.pp = 1; }},
        {"llama2-7b", "a100-40g", 16, 2048, 64, 10, {}},
        {"gpt2-xl", "rtx4090", 4, 1024, 32, 10, {}},
        {"llama2-13b", "mi300x", 8, 4096, 128, 10, [](PlanRequest & r) { r.zero = 1; }},
        // Interleaved on GPUs: memfit train refuses it, so only --include-plan-only lists it (marked).
        {"llama3-70b", "h200", 32, 8192, 256, 10,
         [](PlanRequest & r) { r.pp = 4, r.schedule = PipeSchedule::interleaved, r.include_plan_only = true; }},
        {"llama2-7b", "l40s", 16, 4096, 32, 10, [](PlanRequest & r) { r.tp = 2, r.sp = true; }},
        {"llama2-70b", "h100-80g", 1, 512, 1, 5,
         [](PlanRequest & r) { r.lora = make_lora_plan(r.cfg, memfit::test::lora_options(r.cfg, 16, BaseWeights::nf4, "q,v")); }},
    };
    size_t listed = 0, exact = 0;
    for (const Case & k : cases) {
        PlanRequest r;
        r.cfg = model_preset(k.model);
        r.hw = find_hardware(catalog, k.hw);
        r.gpus = k.gpus;
        r.nodes = (k.gpus + r.hw.per_node - 1) / r.hw.per_node;
        r.run.seq = k.seq;
        r.run.global_batch = k.global_batch;
        r.top = k.top;
        r.explain = true;
        r.exact_sizing = cuda.get();
        if (k.fix) k.fix(r);
        SCOPED_TRACE(fmt::format("{} on {} x {}, seq {}, global batch {}", k.model, k.gpus, k.hw, k.seq, k.global_batch));
        const SearchReport rep = search_plans(r);
        ASSERT_FALSE(rep.best.empty());
        for (const PlanResult & p : rep.best) {
            SCOPED_TRACE(layout_name(p.c.layout) + ", " + technique_name(p.c));
            ++listed;
            EXPECT_TRUE(p.fits);
            EXPECT_LE(p.mem.total(), r.hw.memory);
            EXPECT_LE(p.mem.host * uint64_t(std::min(r.gpus, r.hw.per_node)), r.hw.host_memory);
            if (p.mem.exact) {
                ++exact;
                const DeviceMemory again = exact_memory(r.cfg, r.hw, p.c, r.run.seq, *cuda);
                for (size_t c = 0; c < kCategoryCount; ++c) EXPECT_EQ(p.mem.device.v[c], again.device.v[c]) << c;
            }
        }
        for (const PlanResult & p : rep.rejected) EXPECT_FALSE(p.fits);
        // The table: each listed row's bytes per device at most the device's memory, no wrapped
        // headroom.
        const std::string table = format_plan(r, rep, true);
        EXPECT_EQ(table.find("EiB"), std::string::npos) << table;
        std::istringstream lines(table);
        std::string line;
        size_t rows = 0;
        const std::regex row(R"(^  \d+!? .* (\d+\.\d\d) (B|KiB|MiB|GiB|TiB) .*(exact|model)$)");
        std::smatch m;
        while (std::getline(lines, line)) {
            if (!std::regex_search(line, m, row)) continue;
            ++rows;
            const double unit = m[2] == "GiB" ? 0x1p30 : m[2] == "MiB" ? 0x1p20 : m[2] == "TiB" ? 0x1p40 : m[2] == "KiB" ? 1024 : 1;
            EXPECT_LE(std::stod(m[1]) * unit, double(r.hw.memory) + 0.005 * unit) << line;
        }
        EXPECT_EQ(rows, rep.best.size()) << table;
        const nlohmann::json j = plan_json(r, rep);
        for (const auto & b : j["best"]) {
            EXPECT_TRUE(b["fits"].get<bool>());
            EXPECT_LE(b["memory"]["total"].get<uint64_t>(), j["device_memory"].get<uint64_t>());
        }
    }
    // The grid exercises both kinds of numbers.
    EXPECT_GT(exact, 20u);
    EXPECT_GT(listed, exact);
}
