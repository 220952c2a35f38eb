// oneDNN (v2 API, Debian 12's 2.6) matmul behind GemmDesc: primitives created once per shape and
// cached; user-managed scratchpad so the planner can count it as workspace; weights are used in
// place through strided memory descriptors (no per-call reorder).
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace memfit::cpu {

class DnnlGemm {
public:
    DnnlGemm();
    ~DnnlGemm();
    DnnlGemm(const DnnlGemm &) = delete;
    DnnlGemm & operator=(const DnnlGemm &) = delete;

    // Scratchpad bytes the primitive for `d` needs (creates and caches it).
    size_t workspace_bytes(const GemmDesc & d);
    // C (+)= op(A) op(B) (+ bias). workspace must hold workspace_bytes(d) bytes (may be null if 0).
    void run(const GemmDesc & d, float * c, const float * a, const float * b, const float * bias,
             void * workspace);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Measures this machine's fp32 matmul rate through oneDNN with the current OpenMP thread count:
// square-ish shapes typical of the models, median of several repetitions. GFLOP/s.
double measure_matmul_peak_gflops(int repeats = 5);

}  // namespace memfit::cpu
