// `memfit bench`: time N training steps of one configuration and report one JSON line.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "train/techniques.h"

namespace memfit {

// Model, shape and memory techniques come from RunShape (train/techniques.h).
struct BenchOptions : RunShape {
    BenchOptions() { model = "gpt2-6l"; seq = 256; }
    int steps = 8;          // timed steps
    int warmup = 2;         // untimed steps first
    bool probe = true;      // measure the matmul peak for MFU
    bool timeline = false;  // also time steps that record the op timeline (alternating) and report the overhead
};


nlohmann::json run_bench(const BenchOptions & opt);

}  // namespace memfit
