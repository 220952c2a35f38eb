// Text generation from a trained model: temperature, top-k and top-p (nucleus) sampling with a
// seeded generator, over a Decoder's KV cache (infer/decoder.h): the prompt runs once, then each
// new token runs one token's forward. When the cache is full, the last half of the context is
// run again from position 0 and generation goes on from there.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "infer/decoder.h"

namespace memfit {

struct SampleOptions {
    float    temperature = 0.8f;  // 0: always the most likely token
    int      top_k = 0;           // keep the k most likely tokens (0: all)
    float    top_p = 1.0f;        // keep the smallest set whose probability reaches p (1: all)
    uint64_t seed = 1337;
    int      max_new_tokens = 200;
    std::vector<int32_t> stop;    // generation ends when one of these is chosen (it is not returned)
};

// The next token from one row of V logits.
int32_t sample_token(const float * logits, int V, const SampleOptions & o, std::mt19937_64 & rng);

// Continues `context` by max_new_tokens tokens, or until a stop token; on_token (if set) sees each
// returned token as it is chosen.
std::vector<int32_t> generate(Decoder & decoder, std::vector<int32_t> context, const SampleOptions & o,
                              const std::function<void(int32_t)> & on_token = {});

}  // namespace memfit
