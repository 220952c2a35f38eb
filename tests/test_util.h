// Helpers shared by the tests: a small model configuration, random batches, an OpenMP team size.
#pragma once

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/lora.h"
#include "plan/plan_types.h"
#include "run/compat.h"

namespace memfit::test {

// A folder of this test process's own (tests run in parallel processes), created: the system's
// temporary folder / "memfit_<name>.<pid>".
inline std::string process_dir(const std::string & name) {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("memfit_" + name + "." + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d.string();
}

// The largest difference of a from b over b's largest magnitude (n values each).
inline double max_rel(const float * a, const float * b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(b[i])));
    }
    return num / den;
}

inline ModelConfig small_config(int vocab, int C, int L, int NH, int ctx = 64) {
    ModelConfig c;
    c.name = "test";
    c.vocab_size = vocab;
    c.n_embd = C;
    c.n_layer = L;
    c.n_head = NH;
    c.max_seq = ctx;
    return c;
}

// small_config as GPT-2 (llama false) or as a LLaMA: grouped-query attention with half the heads'
// keys and values, a SwiGLU of width ffn, an untied head. Validated.
inline ModelConfig small_family(bool llama, int vocab, int C, int L, int NH, int ffn, int ctx = 64) {
    ModelConfig c = small_config(vocab, C, L, NH, ctx);
    if (llama) {
        c.family = "llama";
        c.n_kv_head = NH / 2;
        c.ffn = ffn;
        c.tied_head = false;
    }
    c.validate();
    return c;
}

// An H100-SXM-like device (the datasheet's rates, one 400 Gb/s NIC per GPU), written here so
// that planner tests do not depend on the catalog file.
inline Hardware h100_like() {
    Hardware h;
    h.name = "h100-like";
    h.memory = 80ull << 30;
    h.usable = 79ull << 30;
    h.bf16_flops = h.fp16_flops = 989e12;
    h.fp32_flops = 67e12;
    h.mem_bw = 3.35e12;
    h.per_node = 8;
    h.intra_bw = 450e9;
    h.intra_latency = 3e-6;
    h.inter_bw = 50e9;
    h.inter_latency = 10e-6;
    h.host_bw = 50e9;
    h.host_memory = 2ull << 40;
    return h;
}

// LoRA of the given rank on `targets` (parse_lora_targets names), alpha = 2 * rank.
inline LoraOptions lora_options(const ModelConfig & cfg, int rank, BaseWeights base = BaseWeights::compute,
                                const std::string & targets = "all") {
    LoraOptions l;
    l.rank = rank;
    l.alpha = 2.0f * float(rank);
    l.targets = parse_lora_targets(cfg, targets);
    l.base = base;
    return l;
}

// A file's bytes ("" when it cannot be read: the test's checks then fail on its contents).
inline std::string read_text(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// n draws of N(0, scale^2).
// A Tensor over a host vector's elements [at, at + n) (n = -1: to the end), as dtype dt.
template <class T> Tensor host_view(std::vector<T> & v, DType dt, size_t at = 0, int64_t n = -1) {
    Tensor t(-1, dt, {n < 0 ? int64_t(v.size() - at) : n});
    t.data = reinterpret_cast<uint8_t *>(v.data()) + at * dtype_size(dt);
    return t;
}

inline std::vector<float> randn(size_t n, std::mt19937 & rng, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float & x : v) x = dist(rng);
    return v;
}

// Uniform random tokens and targets; target 1 is ignored (-100).
// Data rank r's rows of every micro-batch: k micro-batches of G sequences of T tokens, rows
// r*B .. r*B+B-1 of each, laid end to end.
inline std::vector<int32_t> rank_rows(const std::vector<int32_t> & v, int k, int G, int T, int r, int B) {
    std::vector<int32_t> out;
    for (int m = 0; m < k; ++m)
        for (int b = r * B; b < (r + 1) * B; ++b)
            for (int t = 0; t < T; ++t) out.push_back(v[size_t((m * G + b) * T + t)]);
    return out;
}

inline void random_batch(std::vector<int32_t> & in, std::vector<int32_t> & tg, int V, uint64_t seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int> d(0, V - 1);
    for (auto & x : in) x = d(rng);
    for (auto & x : tg) x = d(rng);
    tg[1] = -100;   // an ignored position
}

// Sets the OpenMP team size for the enclosed code.
class ThreadScope {
public:
    explicit ThreadScope(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
    ~ThreadScope() { omp_set_num_threads(saved_); }
    ThreadScope(const ThreadScope &) = delete;
    ThreadScope & operator=(const ThreadScope &) = delete;

private:
    int saved_;
};

// check_supported()'s one line for `r` (empty when the run is supported).
inline std::string refusal(const RunConfig & r, const ModelConfig & cfg) {
    try {
        check_supported(r, cfg, nullptr);
    } catch (const ConfigError & e) {
        return e.what();
    }
    return std::string();
}

}  // namespace memfit::test
