#include "backend/cpu/bf16_path.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include "backend/cpu/matmul_probe.h"
#include "core/atomic_file.h"
#include "core/json_read.h"

namespace memfit::cpu {

namespace {

constexpr int kRepeats = 3;   // per shape and path, after a warm-up: ~1 s in all on 2 cores

std::string cpu_model_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.starts_with("model name")) {
            const size_t colon = line.find(':');
            return colon == std::string::npos ? line : line.substr(std::min(line.size(), colon + 2));
        }
    return "unknown cpu";
}

// An exclusive lock on PATH.lock for as long as it lives (none where the file cannot be made).
class FileLock {
public:
    explicit FileLock(const std::string & path) : fd_(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
        if (fd_ >= 0) ::flock(fd_, LOCK_EX);
    }
    ~FileLock() {
        if (fd_ >= 0) ::close(fd_);   // releases the lock
    }
    FileLock(const FileLock &) = delete;
    FileLock & operator=(const FileLock &) = delete;

private:
    int fd_;
};

// The cache file's JSON when it is this machine's (its key), else nullopt.
std::optional<nlohmann::json> read_own_file(const std::string & path, const std::string & key) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    std::optional<nlohmann::json> j = try_parse_json(ss.str());
    if (!j || !j->is_object() || j->value("key", std::string()) != key) return std::nullopt;
    return j;
}

GemmRates measure() {
    GemmRates r;
    r.fp32 = measure_matmul_peak_gflops(kRepeats);
    r.native = measure_onednn_bf16_gflops(kRepeats);
    r.convert = measure_bf16_convert_gflops(kRepeats);
    return r;
}

}  // namespace

double GemmRates::bf16() const { return std::max(native, convert); }

double GemmRates::bf16_over_fp32() const { return fp32 > 0 && bf16() > 0 ? bf16() / fp32 : 0.9; }

bool prefer_native_bf16(const GemmRates & r) { return r.native > 0 && r.native >= 1.05 * r.convert; }

std::string gemm_rates_key() {
    const dnnl_version_t * v = dnnl_version();
    return cpu_model_name() + " | oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch);
}

std::string gemm_rates_cache_path() {
    namespace fs = std::filesystem;
    fs::path dir;
    if (const char * d = std::getenv("MEMFIT_CACHE_DIR"); d && *d) dir = d;
    else if (const char * x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = fs::path(x) / "memfit";
    else if (const char * h = std::getenv("HOME"); h && *h) dir = fs::path(h) / ".cache" / "memfit";
    else dir = fs::path("/tmp") / ("memfit-" + std::to_string(getuid()));
    return (dir / "gemm-rates.json").string();
}

std::optional<GemmRates> read_gemm_rates(const std::string & path, const std::string & key) {
    const std::optional<nlohmann::json> j = read_own_file(path, key);
    if (!j) return std::nullopt;
    GemmRates r;
    for (auto [field, out] : {std::pair{"fp32_gflops", &r.fp32}, {"native_bf16_gflops", &r.native},
                              {"convert_bf16_gflops", &r.convert}}) {
        if (!j->contains(field) || !(*j)[field].is_number()) return std::nullopt;
        *out = (*j)[field].get<double>();
        if (!(*out >= 0)) return std::nullopt;
    }
    if (!(r.fp32 > 0) || !(r.convert > 0)) return std::nullopt;
    return r;
}

void write_gemm_rates(const std::string & path, const std::string & key, const GemmRates & r) {
    const nlohmann::json j = {{"format", "memfit-gemm-rates"},
                              {"key", key},
                              {"threads", omp_get_max_threads()},
                              {"fp32_gflops", r.fp32},
                              {"native_bf16_gflops", r.native},
                              {"convert_bf16_gflops", r.convert},
                              {"bf16_path", prefer_native_bf16(r) ? "native" : "convert"}};
    write_file_atomic(path, j.dump(2) + "\n");
}

const GemmRates & machine_gemm_rates() {
    static GemmRates rates;
    static std::once_flag once;
    std::call_once(once, [] {
        const std::string path = gemm_rates_cache_path(), key = gemm_rates_key();
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
        const FileLock lock(path);   // another process measuring: wait for its file
        if (const std::optional<GemmRates> cached = read_gemm_rates(path, key)) {
            rates = *cached;
            return;
        }
        rates = measure();
        try {
            write_gemm_rates(path, key, rates);
        } catch (const std::exception &) {
            // An unwritable cache: this process keeps its measurement; the next one measures again.
        }
    });
    return rates;
}

int64_t choose_row_tile(const std::vector<std::pair<int64_t, double>> & timed) {
    if (timed.empty()) return 0;
    std::pair<int64_t, double> best = timed.front();
    for (const auto & t : timed)
        if (t.second < best.second) best = t;
    return best.first != timed.front().first && 1.1 * best.second <= timed.front().second ? best.first : 0;
}

int64_t machine_row_tile(const std::string & shape, const std::function<int64_t()> & measure) {
    if (const char * v = std::getenv("MEMFIT_CPU_ROW_TILE"); v && *v) return std::max<int64_t>(0, std::atoll(v));
    static std::mutex mu;
    static std::map<std::string, int64_t> known;
    machine_gemm_rates();   // the file's rates first: its lock is taken there, never inside ours
    const std::lock_guard<std::mutex> guard(mu);
    if (const auto it = known.find(shape); it != known.end()) return it->second;
    const std::string path = gemm_rates_cache_path(), key = gemm_rates_key();
    const FileLock lock(path);   // another process measuring this shape: wait for its answer
    std::optional<nlohmann::json> j = read_own_file(path, key);
    nlohmann::json tiles = j && j->contains("row_tiles") && j->at("row_tiles").is_object() ? j->at("row_tiles")
                                                                                         : nlohmann::json::object();
    if (const auto it = tiles.find(shape); it != tiles.end() && it->is_number_integer() && it->get<int64_t>() >= 0)
        return known[shape] = it->get<int64_t>();
    const int64_t rows = measure();
    if (j) {
        tiles[shape] = rows;
        (*j)["row_tiles"] = std::move(tiles);
        try {
            write_file_atomic(path, j->dump(2) + "\n");
        } catch (const std::exception &) {
            // Unwritable: this process keeps its answer; the next one measures again.
        }
    }
    return known[shape] = rows;
}

bool native_bf16_chosen() {
    if (const char * v = std::getenv("MEMFIT_CPU_NATIVE_BF16"); v && *v) return std::string(v) != "0";
    return prefer_native_bf16(machine_gemm_rates());
}

}  // namespace memfit::cpu
