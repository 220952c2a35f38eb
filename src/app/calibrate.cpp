#include "app/calibrate.h"

#include "memory/offload_store.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/bf16_path.h"
#include "backend/cpu/matmul_probe.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "memory/budget.h"

namespace memfit {

namespace {

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (!line.starts_with("model name")) continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) break;
        const size_t start = line.find_first_not_of(" \t", colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
    }
    return "";
}

std::string utc_now() {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// Large enough that the caches hold a small part of it (4 x the L3 the C library reports, at least
// 384 MiB), small enough to stay quick (at most 1 GiB and a quarter of the available memory).
uint64_t default_stream_bytes() {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    uint64_t bytes = std::clamp<uint64_t>(l3 > 0 ? 4 * uint64_t(l3) : 0, 384 * MiB, GiB);
    if (const uint64_t avail = available_memory(); avail > 0) bytes = std::min(bytes, avail / 4);
    return std::max<uint64_t>(bytes, 3 * MiB);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

double measure_stream_bandwidth(uint64_t bytes, int repeats) {
    const int64_t n = int64_t(bytes / (3 * sizeof(double)));
    if (n < 1024) throw ConfigError(fmt::format("bandwidth probe: {} bytes is too small (need at least 72 KiB)", bytes));
    // Not value-initialised: the first touch happens below, in parallel, with the same static
    // partition as the timed loop (pages land near the threads that use them).
    std::unique_ptr<double[]> a(new double[size_t(n)]), b(new double[size_t(n)]), c(new double[size_t(n)]);
    double * pa = a.get();
    const double * pb = b.get();
    const double * pc = c.get();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        a[size_t(i)] = 0.0;
        b[size_t(i)] = 1.0;
        c[size_t(i)] = 2.0;
    }
    const double s = 0.5;
    auto triad = [&] {
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    triad();   // warm-up
    std::vector<double> secs;
    for (int r = 0; r < std::max(repeats, 1); ++r) secs.push_back(triad());
    MF_ASSERT(pa[n / 2] == 2.0);   // 1 + 0.5 * 2: the loop ran, and was not optimised away
    return 3.0 * sizeof(double) * double(n) / median(secs);
}

double measure_offload_bandwidth(const std::string & dir, uint64_t bytes, int repeats) {
    constexpr size_t kCopy = size_t(1) << 20;
    bytes = std::max<uint64_t>(kCopy, bytes / kCopy * kCopy);
    const std::unique_ptr<OffloadStore> store = make_file_store(dir, "calibrate");
    store->open(bytes);
    std::vector<char> mem(bytes, 1);   // host memory, as the staging buffers are on the CPU backend
    std::vector<double> secs;
    for (int r = 0; r < std::max(repeats, 1) + 1; ++r) {   // the first run is a warm-up
        const auto t0 = std::chrono::steady_clock::now();
        for (uint64_t at = 0; at < bytes; at += kCopy) store->write_start(0, at, mem.data() + at, kCopy);
        store->wait(0);
        for (uint64_t at = 0; at < bytes; at += kCopy) store->read_start(0, mem.data() + at, at, kCopy);
        store->wait(0);
        if (r > 0) secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return 2.0 * double(bytes) / median(secs);
}

nlohmann::json run_calibration(const CalibrateOptions & opt) {
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t stream_bytes = opt.stream_bytes > 0 ? opt.stream_bytes : default_stream_bytes();
    const double gflops = cpu::measure_matmul_peak_gflops(opt.matmul_repeats);
    const cpu::GemmRates & rates = cpu::machine_gemm_rates();   // which bf16 path the engine takes
    const double bf16_gflops = cpu::measure_bf16_storage_gflops(opt.matmul_repeats);
    const double bw = measure_stream_bandwidth(stream_bytes, opt.stream_repeats);
    std::filesystem::path dir = opt.offload_dir.empty() ? std::filesystem::path(opt.path).parent_path()
                                                        : std::filesystem::path(opt.offload_dir);
    if (dir.empty()) dir = std::filesystem::current_path();
    if (opt.offload_dir.empty()) {   // the calibration's folder, made now rather than at the write
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
    }
    const std::string offload_dir = dir.string();
    const double offload = measure_offload_bandwidth(offload_dir, opt.offload_bytes, 3);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!(gflops > 0) || !(bw > 0))
        throw Error(fmt::format("calibration measured nothing (matmul {} GFLOP/s, bandwidth {} B/s)", gflops, bw));

    nlohmann::json j = {
        {"format", "memfit-calibration"},
        {"version", 1},
        {"fp32_gflops", gflops},
        {"bf16_gflops", bf16_gflops},
        {"mem_bw_gbs", bw / 1e9},
        {"threads", omp_get_max_threads()},
        {"cpu", cpu_model()},
        {"created", utc_now()},
        {"matmul", fmt::format("oneDNN fp32 gemm on model-shaped gemms (M x K x N 2048x384x1536, 2048x1536x384, "
                               "2048x384x1152): the best shape's median of {} runs",
                               std::max(opt.matmul_repeats, 1))},
        {"bf16_matmul", fmt::format("memfit's bf16/fp16 storage gemms on the same shapes, on the path this machine "
                                    "takes ({}: the faster of oneDNN's native bf16 matmul, {:.0f} GFLOP/s, and 16-bit "
                                    "tiles converted to fp32, {:.0f} GFLOP/s, as measured once per machine and cached "
                                    "in {}): the rate --precision bf16 and fp16 run at",
                                    cpu::native_bf16_chosen() ? "native" : "convert", rates.native, rates.convert,
                                    cpu::gemm_rates_cache_path())},
        {"bandwidth", fmt::format("triad a = b + s*c over 3 arrays of doubles, {} in all; bytes counted: 2 reads + 1 "
                                  "write per element; median of {} runs",
                                  format_bytes(stream_bytes), std::max(opt.stream_repeats, 1))},
        {"stream_bytes", stream_bytes},
        {"offload_gbs", offload / 1e9},
        {"offload", fmt::format("--offload-dir {}: {} written and read back in 1 MiB copies by the offload store's I/O "
                                "thread (buffered, through the page cache), both directions counted; median of 3 runs",
                                offload_dir, format_bytes(opt.offload_bytes))},
        {"seconds", seconds},
    };
    const std::filesystem::path parent = std::filesystem::path(opt.path).parent_path();
    if (!parent.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec)
            throw IoError(fmt::format("{}: cannot create the folder ({}); hint: pass --calibration PATH",
                                      parent.string(), ec.message()));
    }
    write_file_atomic(opt.path, j.dump(2) + "\n");
    j["path"] = opt.path;
    return j;
}

}  // namespace memfit
