// `memfit bench`: time N training steps of one configuration and report one JSON line.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "run/run_config.h"

namespace memfit {

// What runs is the RunConfig (run/run_config.h), in one process.
struct BenchOptions : RunConfig {
    BenchOptions() { model = "gpt2-6l"; seq = 256; }
    int steps = 8;          // timed steps
    int warmup = 2;         // untimed steps first
    bool probe = true;      // measure the matmul peak for MFU
    bool timeline = false;  // also time steps that record the op timeline (alternating): its overhead, per-op times
};


nlohmann::json run_bench(const BenchOptions & opt);

}  // namespace memfit
