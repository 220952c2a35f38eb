// The hardware catalog (data/hardware.json) and `memfit bench --calibrate`: the shipped entries
// load with sane numbers, a malformed catalog fails naming the entry and the field, and the
// calibration file overlays the `cpu` entry.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "plan/hardware.h"
#include "app/calibrate.h"

namespace fs = std::filesystem;
using memfit::Hardware;

namespace {

fs::path scratch_dir() {
    const fs::path d = fs::temp_directory_path() / ("memfit_hw_test." + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
}

void write(const fs::path & p, const std::string & text) {
    std::ofstream out(p);
    out << text;
}

std::vector<Hardware> shipped() { return memfit::load_hardware_catalog(std::string(MEMFIT_DATA_DIR) + "/hardware.json"); }

// A valid one-entry catalog, as JSON, to break one field at a time.
nlohmann::json good_catalog() {
    return {{"version", 1},
            {"notes", {"test"}},
            {"devices",
             {{{"name", "gpu-x"}, {"description", "a test GPU"}, {"source", "Test Datasheet (2024)"},
               {"memory_gib", 80}, {"reserved_gib", 1}, {"bf16_tflops", 989}, {"fp16_tflops", 989},
               {"fp32_tflops", 67}, {"mem_bw_gbs", 3350}, {"per_node", 8}, {"intra_bw_gbs", 450},
               {"intra_latency_us", 5}, {"inter_bw_gbs", 50}, {"inter_latency_us", 10}, {"host_bw_gbs", 64},
               {"host_memory_gib", 2048}}}}};
}

// Loads `text` as a catalog and returns the ConfigError's message ("" if it loaded).
std::string load_error(const std::string & text) {
    const fs::path p = scratch_dir() / "catalog.json";
    write(p, text);
    try {
        memfit::load_hardware_catalog(p.string());
    } catch (const memfit::ConfigError & e) {
        return e.what();
    }
    return "";
}

void expect_names(const std::string & msg, const std::string & entry, const std::string & field) {
    EXPECT_NE(msg.find(entry), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + field + "'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

int run_memfit(const std::string & args, std::string * out) {
    const fs::path dir = scratch_dir();
    const std::string cmd = std::string(MEMFIT_BINARY) + " " + args + " >" + (dir / "stdout.txt").string() + " 2>" +
                            (dir / "stderr.txt").string();
    const int status = std::system(cmd.c_str());
    std::ifstream o(dir / "stdout.txt"), e(dir / "stderr.txt");
    *out = std::string(std::istreambuf_iterator<char>(o), {}) + std::string(std::istreambuf_iterator<char>(e), {});
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST(Hardware, ShippedCatalogHasEveryEntryWithSaneNumbers) {
    const std::vector<Hardware> cat = shipped();
    for (const char * name : {"a100-40g", "a100-80g", "h100-80g", "h100-pcie", "h200", "b200", "l40s", "rtx4090",
                              "rtx3090", "a10g", "l4", "v100", "mi300x", "cpu"})
        EXPECT_NO_THROW(memfit::find_hardware(cat, name)) << name;
    const std::regex cited(R"(\((19|20)\d\d\))");
    for (const Hardware & h : cat) {
        SCOPED_TRACE(h.name);
        EXPECT_FALSE(h.description.empty());
        if (h.name != "cpu") {
            EXPECT_TRUE(std::regex_search(h.source, cited)) << h.source;
        }
        EXPECT_GT(h.usable, 0u);
        EXPECT_LT(h.usable, h.memory);
        EXPECT_GT(h.memory - h.usable, 512 * memfit::MiB);   // the runtime reserve is not forgotten
        for (double x : {h.fp16_flops, h.fp32_flops, h.mem_bw, h.intra_bw, h.intra_latency, h.inter_bw,
                         h.inter_latency, h.host_bw})
            EXPECT_GT(x, 0);
        if (h.name != "v100") {
            EXPECT_GT(h.bf16_flops, 0);   // Volta has no bf16 (null in the catalog)
        }
        EXPECT_GT(h.host_memory, 0u);
        EXPECT_GE(h.per_node, 1);
        EXPECT_LT(h.intra_latency, 1e-3);   // microseconds, not seconds
        EXPECT_LT(h.inter_latency, 1e-3);
        if (h.name == "cpu") continue;
        EXPECT_GT(h.fp16_flops, h.fp32_flops);           // tensor cores beat plain fp32
        EXPECT_LT(h.fp16_flops, 2.5e15);                  // no sparsity figures
        if (h.bf16_flops > 0) {
            EXPECT_GT(h.bf16_flops, h.fp32_flops);
        }
        EXPECT_LT(h.bf16_flops, 2.5e15);
        EXPECT_GT(h.mem_bw, 2.5e11);
        EXPECT_LT(h.mem_bw, 1e13);
        EXPECT_GE(h.intra_bw, h.inter_bw);
        EXPECT_GE(h.memory, 24 * memfit::GiB);
        EXPECT_GE(h.host_memory, h.memory);
    }
}

TEST(Hardware, ShippedValuesMatchTheDatasheets) {
    const std::vector<Hardware> cat = shipped();
    const Hardware & h100 = memfit::find_hardware(cat, "h100-80g");
    EXPECT_GT(h100.bf16_flops, 900e12);
    EXPECT_LT(h100.bf16_flops, 1000e12);
    EXPECT_DOUBLE_EQ(h100.fp32_flops, 67e12);
    EXPECT_DOUBLE_EQ(h100.mem_bw, 3.35e12);
    EXPECT_EQ(h100.memory, 80 * memfit::GiB);
    EXPECT_EQ(h100.usable, 79 * memfit::GiB);
    EXPECT_DOUBLE_EQ(h100.intra_bw, 450e9);
    EXPECT_DOUBLE_EQ(h100.inter_bw, 50e9);
    EXPECT_DOUBLE_EQ(h100.intra_latency, 5e-6);
    EXPECT_EQ(h100.per_node, 8);

    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a100-40g").bf16_flops, 312e12);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a100-40g").fp32_flops, 19.5e12);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a100-40g").mem_bw, 1.555e12);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a100-80g").mem_bw, 2.039e12);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a100-80g").intra_bw, 300e9);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a100-80g").inter_bw, 25e9);
    const Hardware & h200 = memfit::find_hardware(cat, "h200");
    EXPECT_EQ(h200.memory, 141 * memfit::GiB);
    EXPECT_DOUBLE_EQ(h200.mem_bw, 4.8e12);
    EXPECT_DOUBLE_EQ(h200.bf16_flops, h100.bf16_flops);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "b200").bf16_flops, 2.25e15);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "b200").mem_bw, 8e12);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "b200").intra_bw, 900e9);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "l40s").bf16_flops, 362e12);   // 733 is the sparse figure
    const Hardware & rtx = memfit::find_hardware(cat, "rtx4090");
    EXPECT_DOUBLE_EQ(rtx.bf16_flops, 165.2e12);   // fp32 accumulation (330.3 is fp16 accumulation)
    EXPECT_DOUBLE_EQ(rtx.fp32_flops, 82.6e12);
    EXPECT_EQ(rtx.memory, 24 * memfit::GiB);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "rtx3090").bf16_flops, 71e12);   // fp32 accumulation (142: fp16)
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "rtx3090").mem_bw, 936e9);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "a10g").mem_bw, 600e9);
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "l4").bf16_flops, 121e12);   // 242 is the sparse figure
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "l4").mem_bw, 300e9);
    const Hardware & v100 = memfit::find_hardware(cat, "v100");
    EXPECT_EQ(v100.bf16_flops, 0.0);
    EXPECT_DOUBLE_EQ(v100.fp16_flops, 125e12);
    EXPECT_DOUBLE_EQ(v100.mem_bw, 900e9);
    EXPECT_EQ(v100.memory, 32 * memfit::GiB);
    for (const char * name : {"rtx3090", "a10g", "l4", "v100"})
        EXPECT_EQ(memfit::find_hardware(cat, name).efficiencies_from, "h100-80g") << name;   // no published run
    const Hardware & mi = memfit::find_hardware(cat, "mi300x");
    EXPECT_DOUBLE_EQ(mi.bf16_flops, 1307.4e12);
    EXPECT_DOUBLE_EQ(mi.fp32_flops, 163.4e12);
    EXPECT_EQ(mi.memory, 192 * memfit::GiB);
    EXPECT_DOUBLE_EQ(mi.mem_bw, 5.3e12);
    EXPECT_EQ(mi.flops(memfit::DType::bf16), mi.bf16_flops);
    EXPECT_EQ(mi.flops(memfit::DType::f32), mi.fp32_flops);
}

TEST(Hardware, FindUnknownListsTheKnownNames) {
    const std::vector<Hardware> cat = shipped();
    try {
        memfit::find_hardware(cat, "h100-80gb");
        FAIL() << "no error";
    } catch (const memfit::ConfigError & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("'h100-80gb'"), std::string::npos) << msg;
        for (const Hardware & h : cat) EXPECT_NE(msg.find(h.name), std::string::npos) << h.name << ": " << msg;
    }
}

TEST(Hardware, ValidCatalogLoadsWithUnitsConverted) {
    const fs::path p = scratch_dir() / "ok.json";
    write(p, good_catalog().dump());
    const std::vector<Hardware> cat = memfit::load_hardware_catalog(p.string());
    ASSERT_EQ(cat.size(), 1u);
    EXPECT_EQ(cat[0].memory, 80 * memfit::GiB);
    EXPECT_EQ(cat[0].usable, 79 * memfit::GiB);
    EXPECT_DOUBLE_EQ(cat[0].bf16_flops, 989e12);
    EXPECT_DOUBLE_EQ(cat[0].host_bw, 64e9);
    EXPECT_DOUBLE_EQ(cat[0].inter_latency, 10e-6);
    EXPECT_EQ(cat[0].host_memory, 2048 * memfit::GiB);
    // The time model's efficiencies are optional: the defaults (H100's fit) when absent.
    EXPECT_EQ(cat[0].matmul_eff, memfit::kDefaultMatmulEfficiency);
    EXPECT_EQ(cat[0].attention_eff, memfit::kDefaultAttentionEfficiency);
    EXPECT_EQ(cat[0].bandwidth_eff, memfit::kDefaultBandwidthEfficiency);
    nlohmann::json j = good_catalog();
    j["devices"][0]["matmul_efficiency"] = 0.6;
    j["devices"][0]["attention_efficiency"] = 0.25;
    j["devices"][0]["bandwidth_efficiency"] = 1;
    write(p, j.dump());
    const Hardware h = memfit::load_hardware_catalog(p.string())[0];
    EXPECT_EQ(h.matmul_eff, 0.6);
    EXPECT_EQ(h.attention_eff, 0.25);
    EXPECT_EQ(h.bandwidth_eff, 1.0);
}

TEST(Hardware, MalformedCatalogNamesTheEntryAndField) {
    {   // a missing field
        nlohmann::json j = good_catalog();
        j["devices"][0].erase("mem_bw_gbs");
        expect_names(load_error(j.dump()), "gpu-x", "mem_bw_gbs");
    }
    {   // negative
        nlohmann::json j = good_catalog();
        j["devices"][0]["intra_bw_gbs"] = -450;
        const std::string msg = load_error(j.dump());
        expect_names(msg, "gpu-x", "intra_bw_gbs");
        EXPECT_NE(msg.find("-450"), std::string::npos) << msg;
    }
    {   // zero
        nlohmann::json j = good_catalog();
        j["devices"][0]["fp32_tflops"] = 0;
        expect_names(load_error(j.dump()), "gpu-x", "fp32_tflops");
    }
    {   // a string where a number belongs
        nlohmann::json j = good_catalog();
        j["devices"][0]["memory_gib"] = "80GB";
        expect_names(load_error(j.dump()), "gpu-x", "memory_gib");
    }
    {   // an unknown key (a typo)
        nlohmann::json j = good_catalog();
        j["devices"][0]["bf16_tflop"] = 989;
        const std::string msg = load_error(j.dump());
        expect_names(msg, "gpu-x", "bf16_tflop");
        EXPECT_NE(msg.find("unknown"), std::string::npos) << msg;
    }
    for (const char * f : {"matmul_efficiency", "attention_efficiency", "bandwidth_efficiency"})
        for (const nlohmann::json & bad : {nlohmann::json(0), nlohmann::json(1.5), nlohmann::json("0.5")}) {
            // an efficiency outside (0, 1]
            nlohmann::json j = good_catalog();
            j["devices"][0][f] = bad;
            const std::string msg = load_error(j.dump());
            expect_names(msg, "gpu-x", f);
            EXPECT_NE(msg.find("fraction"), std::string::npos) << msg;
        }
    {   // per_node must be a whole number
        nlohmann::json j = good_catalog();
        j["devices"][0]["per_node"] = 7.5;
        expect_names(load_error(j.dump()), "gpu-x", "per_node");
    }
    {   // the reserve must leave some memory
        nlohmann::json j = good_catalog();
        j["devices"][0]["reserved_gib"] = 80;
        expect_names(load_error(j.dump()), "gpu-x", "reserved_gib");
    }
    {   // no name: the entry is named by its position
        nlohmann::json j = good_catalog();
        j["devices"][0].erase("name");
        expect_names(load_error(j.dump()), "entry #1", "name");
    }
    {   // a duplicate name
        nlohmann::json j = good_catalog();
        j["devices"].push_back(j["devices"][0]);
        expect_names(load_error(j.dump()), "entry #2", "name");
    }
    {   // an unknown top-level key
        nlohmann::json j = good_catalog();
        j["device"] = j["devices"];
        const std::string msg = load_error(j.dump());
        EXPECT_NE(msg.find("'device'"), std::string::npos) << msg;
    }
    {   // bad JSON
        std::string text = good_catalog().dump();
        text.pop_back();
        const std::string msg = load_error(text);
        EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
        EXPECT_NE(msg.find("catalog.json"), std::string::npos) << msg;
    }
    EXPECT_EQ(load_error(good_catalog().dump()), "");
    EXPECT_THROW(memfit::load_hardware_catalog((scratch_dir() / "missing.json").string()), memfit::IoError);
}

TEST(Hardware, CpuEntryIsThisMachineAndTakesTheCalibration) {
    const fs::path dir = scratch_dir();
    const std::vector<Hardware> plain = memfit::default_hardware_catalog((dir / "none.json").string());
    const Hardware & cpu0 = memfit::find_hardware(plain, "cpu");
    EXPECT_DOUBLE_EQ(cpu0.fp32_flops, 100e9);   // the documented defaults
    EXPECT_DOUBLE_EQ(cpu0.bf16_flops, 100e9);
    EXPECT_DOUBLE_EQ(cpu0.mem_bw, 10e9);
    EXPECT_GT(cpu0.memory, 256 * memfit::MiB);   // MemTotal, not the file's placeholder
    EXPECT_EQ(cpu0.memory - cpu0.usable, 2 * memfit::GiB);
    EXPECT_EQ(cpu0.host_memory, cpu0.memory);

    const fs::path cal = dir / "c.json";
    write(cal, R"({"format": "memfit-calibration", "version": 1, "fp32_gflops": 123.5, "mem_bw_gbs": 17.25,
                  "threads": 3, "cpu": "Test CPU", "created": "2025-01-01T00:00:00Z", "extra": true})");
    const std::vector<Hardware> cat = memfit::default_hardware_catalog(cal.string());
    const Hardware & cpu = memfit::find_hardware(cat, "cpu");
    EXPECT_DOUBLE_EQ(cpu.fp32_flops, 123.5e9);
    EXPECT_DOUBLE_EQ(cpu.bf16_flops, 123.5e9);
    EXPECT_DOUBLE_EQ(cpu.fp16_flops, 123.5e9);
    EXPECT_DOUBLE_EQ(cpu.mem_bw, 17.25e9);
    EXPECT_DOUBLE_EQ(cpu.host_bw, 17.25e9);
    EXPECT_NE(cpu.description.find("Test CPU"), std::string::npos) << cpu.description;
    EXPECT_NE(cpu.source.find(cal.string()), std::string::npos) << cpu.source;
    EXPECT_EQ(cpu.memory, cpu0.memory);
    // A file with memfit's 16-bit storage rate gives it to bf16 and fp16; the efficiencies stay.
    write(cal, R"({"fp32_gflops": 123.5, "bf16_gflops": 99.0, "mem_bw_gbs": 17.25})");
    const Hardware & cpu16 = memfit::find_hardware(memfit::default_hardware_catalog(cal.string()), "cpu");
    EXPECT_DOUBLE_EQ(cpu16.fp32_flops, 123.5e9);
    EXPECT_DOUBLE_EQ(cpu16.bf16_flops, 99e9);
    EXPECT_DOUBLE_EQ(cpu16.fp16_flops, 99e9);
    EXPECT_EQ(cpu16.matmul_eff, cpu0.matmul_eff);
    // The other entries are untouched.
    EXPECT_DOUBLE_EQ(memfit::find_hardware(cat, "h100-80g").bf16_flops,
                     memfit::find_hardware(plain, "h100-80g").bf16_flops);

    write(cal, R"({"fp32_gflops": 123.5, "mem_bw_gbs": -1})");
    try {
        memfit::default_hardware_catalog(cal.string());
        FAIL() << "no error";
    } catch (const memfit::FormatError & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("mem_bw_gbs"), std::string::npos) << msg;
        EXPECT_NE(msg.find(cal.string()), std::string::npos) << msg;
        EXPECT_NE(msg.find("--calibrate"), std::string::npos) << msg;
    }
    write(cal, "{not json");
    EXPECT_THROW(memfit::default_hardware_catalog(cal.string()), memfit::FormatError);
    EXPECT_NO_THROW(memfit::default_hardware_catalog(""));   // "" skips the calibration
}

TEST(Hardware, DefaultCalibrationPathsAgree) {
    EXPECT_EQ(memfit::CalibrateOptions{}.path, std::string(memfit::kDefaultCalibrationPath));
}

TEST(Hardware, StreamBandwidthProbeIsPositive) {
    const double bw = memfit::measure_stream_bandwidth(24 * memfit::MiB, 3);
    EXPECT_GT(bw, 1e8);    // 100 MB/s: anything slower is a broken probe
    EXPECT_LT(bw, 1e13);
    EXPECT_THROW(memfit::measure_stream_bandwidth(1000, 1), memfit::ConfigError);
    EXPECT_GT(memfit::measure_offload_bandwidth(::testing::TempDir(), 8 * memfit::MiB, 2), 1e7);
    EXPECT_THROW(memfit::measure_offload_bandwidth("/nonexistent/dir", memfit::MiB, 1), memfit::IoError);
}

// `memfit bench --timeline`: the step broken down by op, the LM head's gemms apart, shares of the
// ops' time summing to one and within the timed step; a bf16 step's MFU against the bf16 peak.
TEST(Hardware, BenchTimelineBreaksTheStepDownByOp) {
    std::string out;
    ASSERT_EQ(run_memfit("bench --model nano --batch 2 --seq 32 --steps 2 --warmup 1 --threads 1 --timeline "
                         "--precision bf16", &out), 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out.substr(0, out.find('\n')));
    // The faster of oneDNN's native bf16 matmul and the bf16-storage gemm as the engine runs it.
    const double bf16_peak = std::max(j.at("matmul_bf16_onednn_gflops").get<double>(),
                                      j.at("matmul_bf16_storage_gflops").get<double>());
    const std::string path = j.at("bf16_path").get<std::string>();
    EXPECT_TRUE(path == "native" || path == "convert") << path;
    EXPECT_GT(bf16_peak, 0) << j.dump();
    EXPECT_DOUBLE_EQ(j.at("mfu_peak_gflops").get<double>(), bf16_peak);
    EXPECT_NEAR(j.at("mfu").get<double>(), j.at("achieved_gflops").get<double>() / bf16_peak, 1e-12);
    std::map<std::string, nlohmann::json> ops;
    double share = 0, ms = 0;
    for (const auto & o : j.at("op_classes")) {
        ops[o.at("op").get<std::string>()] = o;
        share += o.at("share").get<double>();
        ms += o.at("ms").get<double>();
        EXPECT_GE(o.at("gflops").get<double>(), 0.0) << o.dump();
    }
    EXPECT_NEAR(share, 1.0, 1e-9);
    EXPECT_LE(ms, j.at("ms_per_step_with_timeline").get<double>() * 1.05);   // rounding of the median
    for (const char * name : {"matmul_fwd", "matmul_bwd", "matmul_fwd (lm head)", "matmul_bwd (lm head)", "xent_fwd_bwd",
                              "adamw"})
        ASSERT_TRUE(ops.count(name)) << name << " missing: " << j.dump();
    EXPECT_EQ(ops["matmul_fwd"].at("calls").get<int>() % 4, 0);   // qkv, proj, fc, fc_proj per block
    EXPECT_GT(ops["matmul_fwd"].at("gflops").get<double>(), 0.0);
}

TEST(Hardware, BenchCalibrateWritesTheFileThePlannerReads) {
    const fs::path dir = scratch_dir() / "calib";
    fs::remove_all(dir);
    const fs::path file = dir / "c.json";   // the folder does not exist yet
    std::string out;
    const int code = run_memfit("bench --calibrate --calibration " + file.string() + " --threads 1", &out);
    ASSERT_EQ(code, 0) << out;
    ASSERT_TRUE(fs::exists(file)) << out;
    std::ifstream in(file);
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_GT(j.at("fp32_gflops").get<double>(), 0) << j.dump();
    EXPECT_GT(j.at("mem_bw_gbs").get<double>(), 0) << j.dump();
    EXPECT_EQ(j.at("threads").get<int>(), 1);
    EXPECT_LT(j.at("seconds").get<double>(), 30.0);
    const nlohmann::json line = nlohmann::json::parse(out.substr(0, out.find('\n')));
    EXPECT_EQ(line.at("path").get<std::string>(), file.string());

    const Hardware & cpu = memfit::find_hardware(memfit::default_hardware_catalog(file.string()), "cpu");
    EXPECT_DOUBLE_EQ(cpu.fp32_flops, j["fp32_gflops"].get<double>() * 1e9);
    EXPECT_DOUBLE_EQ(cpu.bf16_flops, j["bf16_gflops"].get<double>() * 1e9);
    EXPECT_GT(cpu.bf16_flops, 0.0);
    EXPECT_DOUBLE_EQ(cpu.mem_bw, j["mem_bw_gbs"].get<double>() * 1e9);
    // The offload files' round trip (under the calibration's folder): the cpu entry's host link.
    EXPECT_GT(j.at("offload_gbs").get<double>(), 0.01) << j.dump();
    EXPECT_DOUBLE_EQ(cpu.host_bw, j["offload_gbs"].get<double>() * 1e9);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1) << "the probe's file was left";

    // --offload-dir names the folder the round trip is measured in.
    const fs::path there = dir / "states";
    fs::create_directories(there);
    ASSERT_EQ(run_memfit("bench --calibrate --calibration " + file.string() + " --threads 1 --offload-dir " +
                         there.string(), &out), 0) << out;
    EXPECT_NE(nlohmann::json::parse(std::ifstream(file))["offload"].get<std::string>().find(there.string()),
              std::string::npos);
    EXPECT_TRUE(fs::is_empty(there));

    // --calibration without --calibrate is refused.
    EXPECT_NE(run_memfit("bench --calibration " + file.string(), &out), 0) << out;
}
