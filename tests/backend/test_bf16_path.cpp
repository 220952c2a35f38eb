// The bf16 gemm path chosen by measurement (backend/cpu/bf16_path.h): the decision from measured
// rates, the per-machine cache file, and a run that follows the file rather than the CPU's flags.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "backend/cpu/bf16_path.h"
#include "backend/cpu/dnnl_gemm.h"
#include "cli/cli_util.h"

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

}  // namespace
}  // namespace memfit
