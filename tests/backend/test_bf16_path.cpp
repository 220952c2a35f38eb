// The bf16 gemm path chosen by measurement (backend/cpu/bf16_path.h): the decision from measured
// rates, the per-machine cache file, and a run that follows the file rather than the CPU's flags.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/bf16_path.h"
#include "backend/cpu/dnnl_gemm.h"
#include "cli/cli_util.h"
#include "core/dtype.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

TEST(Bf16Path, TheFasterPathWinsAsMeasured) {
    // An AMD Zen 4/5 (native twice the convert path), an Intel Xeon without AMX (native 159
    // GFLOP/s against fp32's 298: converted tiles at about 0.9 of fp32 win), an AVX2 CPU (no
    // native matmul), and a near tie (kept on the convert path).
    EXPECT_TRUE(cpu::prefer_native_bf16({212, 426, 204}));
    EXPECT_FALSE(cpu::prefer_native_bf16({298, 159, 268}));
    EXPECT_FALSE(cpu::prefer_native_bf16({150, 0, 135}));
    EXPECT_FALSE(cpu::prefer_native_bf16({200, 205, 200}));
    EXPECT_TRUE(cpu::prefer_native_bf16({200, 211, 200}));
    // The time model's factor is the faster path's rate over fp32's.
    EXPECT_DOUBLE_EQ((cpu::GemmRates{212, 424, 204}.bf16_over_fp32()), 2.0);
    EXPECT_DOUBLE_EQ((cpu::GemmRates{300, 150, 270}.bf16_over_fp32()), 0.9);
}

TEST(Bf16Path, TheCacheFileIsKeyedToTheMachine) {
    const fs::path dir = cli_test::scratch("bf16_cache");
    fs::create_directories(dir);
    const std::string path = (dir / "gemm-rates.json").string();
    EXPECT_FALSE(cpu::read_gemm_rates(path, "any").has_value());   // absent
    cpu::write_gemm_rates(path, "cpu A | oneDNN 2.6.3", {298, 159, 268});
    const auto r = cpu::read_gemm_rates(path, "cpu A | oneDNN 2.6.3");
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->fp32, 298);
    EXPECT_EQ(r->native, 159);
    EXPECT_EQ(r->convert, 268);
    EXPECT_FALSE(cpu::read_gemm_rates(path, "cpu B | oneDNN 2.6.3").has_value());   // another machine
    std::ofstream(path) << "{\"key\": \"cpu A | oneDNN 2.6.3\", \"fp32_gflops\": -1";   // cut short
    EXPECT_FALSE(cpu::read_gemm_rates(path, "cpu A | oneDNN 2.6.3").has_value());
    std::ofstream(path) << R"({"key": "cpu A | oneDNN 2.6.3", "fp32_gflops": 298, "native_bf16_gflops": 159})";
    EXPECT_FALSE(cpu::read_gemm_rates(path, "cpu A | oneDNN 2.6.3").has_value());   // a field missing
}

// A bf16 run takes the path the machine's file names, in either direction, and keeps the file
// (no second measurement). Where oneDNN has no native bf16 matmul (an AVX2 CPU) it converts
// whatever the file says.
TEST(Bf16Path, ARunFollowsTheMachinesFile) {
    GemmDesc d;
    d.M = 256, d.N = 256, d.K = 256, d.a = d.b = d.c = DType::bf16;
    setenv("MEMFIT_CPU_NATIVE_BF16", "1", 1);
    cpu::DnnlGemm probe;
    unsetenv("MEMFIT_CPU_NATIVE_BF16");
    const bool has_native = probe.native(d);
    const fs::path dir = cli_test::scratch("bf16_follow");
    fs::create_directories(dir);
    const std::string path = (dir / "gemm-rates.json").string();
    setenv("MEMFIT_CACHE_DIR", dir.c_str(), 1);
    for (const bool native_faster : {false, true}) {
        const cpu::GemmRates rates = native_faster ? cpu::GemmRates{200, 400, 180} : cpu::GemmRates{300, 150, 270};
        cpu::write_gemm_rates(path, cpu::gemm_rates_key(), rates);
        const auto r = cli_test::run_memfit("bench --model nano --precision bf16 --steps 1 --seq 32 --micro-batch 2");
        ASSERT_EQ(r.code, 0) << r.err;
        const std::string want = native_faster && has_native ? "native" : "convert";
        EXPECT_NE(r.out.find("\"bf16_path\":\"" + want + "\""), std::string::npos) << r.out;
        const auto kept = cpu::read_gemm_rates(path, cpu::gemm_rates_key());
        ASSERT_TRUE(kept.has_value());
        EXPECT_EQ(kept->native, rates.native);   // read, not measured again
    }
    unsetenv("MEMFIT_CACHE_DIR");
}


TEST(Bf16Path, RowTilesWinOnlyWhenClearlyFaster) {
    // (rows per call, seconds), one call first: the LM head's forward on the AMX Xeon (64-row
    // calls 2.4x faster), a tile 5% faster (kept as one call), one call fastest, no candidates.
    EXPECT_EQ(cpu::choose_row_tile({{0, 0.064}, {256, 0.062}, {128, 0.059}, {64, 0.026}}), 64);
    EXPECT_EQ(cpu::choose_row_tile({{0, 0.100}, {128, 0.095}}), 0);
    EXPECT_EQ(cpu::choose_row_tile({{0, 0.020}, {256, 0.030}, {64, 0.050}}), 0);
    EXPECT_EQ(cpu::choose_row_tile({{0, 0.020}}), 0);
    EXPECT_EQ(cpu::choose_row_tile({}), 0);
}

// A shape's row tile is measured once and kept in the machine's file beside its rates: the
// same process asks again without measuring, and a file that already names a shape is followed.
TEST(Bf16Path, RowTilesAreMeasuredOncePerShapeAndKept) {
    const fs::path dir = cli_test::scratch("bf16_row_tiles");
    fs::create_directories(dir);
    const std::string path = (dir / "gemm-rates.json").string();
    setenv("MEMFIT_CACHE_DIR", dir.c_str(), 1);
    unsetenv("MEMFIT_CPU_ROW_TILE");
    cpu::write_gemm_rates(path, cpu::gemm_rates_key(), {300, 600, 270});
    int measured = 0;
    const auto measure = [&] { return ++measured, int64_t{64}; };
    EXPECT_EQ(cpu::machine_row_tile("512x384x50257 test", measure), 64);
    EXPECT_EQ(cpu::machine_row_tile("512x384x50257 test", measure), 64);
    EXPECT_EQ(measured, 1);
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j.at("row_tiles").at("512x384x50257 test"), 64);
    EXPECT_EQ(j.at("native_bf16_gflops"), 600);   // the rates kept beside it
    // Another process's answer in the file is taken as it is.
    nlohmann::json k = j;
    k["row_tiles"]["2048x384x50257 test"] = 128;
    std::ofstream(path) << k.dump();
    EXPECT_EQ(cpu::machine_row_tile("2048x384x50257 test", [&] { return ++measured, int64_t{0}; }), 128);
    EXPECT_EQ(measured, 1);
    setenv("MEMFIT_CPU_ROW_TILE", "0", 1);   // the override answers without the file
    EXPECT_EQ(cpu::machine_row_tile("512x384x50257 test", measure), 0);
    unsetenv("MEMFIT_CPU_ROW_TILE");
    unsetenv("MEMFIT_CACHE_DIR");
}

// A native gemm as wide as an LM head's forward (bf16 x and weights [N, K], fp32 logits) gives the
// same bits in 64-row calls as in one, in the workspace it plans either way.
TEST(Bf16Path, RowTiledNativeGemmGivesOneCallsBits) {
    GemmDesc d;
    d.M = 320, d.N = 16411, d.K = 96, d.trans_b = true;
    d.a = d.b = DType::bf16, d.c = DType::f32;
    setenv("MEMFIT_CPU_NATIVE_BF16", "1", 1);
    setenv("MEMFIT_CPU_ROW_TILE", "0", 1);   // this test shape is never timed into the machine's file
    cpu::DnnlGemm gemm;
    unsetenv("MEMFIT_CPU_NATIVE_BF16");
    if (!gemm.native(d)) GTEST_SKIP() << "no optimized native bf16 matmul on this CPU (the convert path has no row tiles)";
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<uint16_t> a(size_t(d.M * d.K)), b(size_t(d.N * d.K));
    for (auto & x : a) x = f32_to_bf16(nd(rng));
    for (auto & x : b) x = f32_to_bf16(0.05f * nd(rng));
    std::vector<std::vector<float>> out;
    for (const char * tile : {"0", "64"}) {
        setenv("MEMFIT_CPU_ROW_TILE", tile, 1);
        std::vector<std::byte> ws(gemm.native_workspace_bytes(d) + 1);
        std::vector<float> c(size_t(d.M * d.N), -1.0f);
        gemm.run_native(d, c.data(), a.data(), b.data(), nullptr, ws.empty() ? nullptr : ws.data());
        out.push_back(std::move(c));
    }
    unsetenv("MEMFIT_CPU_ROW_TILE");
    EXPECT_EQ(out[0], out[1]);
    float ref = 0;   // one element against a plain dot product of the bf16 values
    for (int64_t k = 0; k < d.K; ++k) ref += bf16_to_f32(a[size_t(5 * d.K + k)]) * bf16_to_f32(b[size_t(7000 * d.K + k)]);
    EXPECT_NEAR(out[1][size_t(5 * d.N + 7000)], ref, 1e-3f * (1.0f + std::abs(ref)));
}

}  // namespace
}  // namespace memfit
