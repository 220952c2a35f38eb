// Helpers shared by the tests: a small model configuration, random batches, an OpenMP team size.
#pragma once

#include <omp.h>

#include <cstdint>
#include <random>
#include <vector>

#include "model/config.h"

namespace memfit::test {

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

// Uniform random tokens and targets; target 1 is ignored (-100).
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

}  // namespace memfit::test
