// `memfit bench`: time N training steps of one configuration and report one JSON line.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

struct BenchOptions {
    std::string model = "gpt2-6l";
    int batch = 8, seq = 256;
    int steps = 8;          // timed steps
    int warmup = 2;         // untimed steps first
    int threads = 0;
    uint64_t seed = 1337;
    std::string memory_budget;
    bool probe = true;      // measure the matmul peak for MFU
    int loss_chunk = 0;     // tokens per LM-head + loss chunk (0: all at once)
    int grad_accum = 1;     // micro-batches per optimizer step
    float clip = 0;         // global gradient-norm clipping (0: off)
    std::string attention = "naive";  // naive | flash
    std::string recompute = "none";   // none | full | every:K | sqrt
    bool timeline = false;  // also time steps that record the op timeline (alternating) and report the overhead
};

// Model FLOPs per token: 6N + 12*L*H*Q*T (N excludes the position embeddings, which do no
// matmul work; H*Q = C).
double model_flops_per_token(int64_t params_no_wpe, int L, int C, int T);

nlohmann::json run_bench(const BenchOptions & opt);

}  // namespace memfit
