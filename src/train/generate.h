// Text generation from a trained model: temperature, top-k and top-p (nucleus) sampling with a
// seeded generator. Each new token runs a fresh forward over the last T tokens of the context
// (no KV cache yet: the cost is T times a cached decoder's).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "train/engine.h"

namespace memfit {

struct SampleOptions {
    float    temperature = 0.8f;  // 0: always the most likely token
    int      top_k = 0;           // keep the k most likely tokens (0: all)
    float    top_p = 1.0f;        // keep the smallest set whose probability reaches p (1: all)
    uint64_t seed = 1337;
    int      max_new_tokens = 200;
};

// The next token from one row of V logits.
int32_t sample_token(const float * logits, int V, const SampleOptions & o, std::mt19937_64 & rng);

// Continues `context` by max_new_tokens tokens; on_token (if set) sees each as it is chosen.
std::vector<int32_t> generate(Engine & engine, std::vector<int32_t> context, const SampleOptions & o,
                              const std::function<void(int32_t)> & on_token = {});

}  // namespace memfit
