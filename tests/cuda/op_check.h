// Consistency tests of the CUDA backend against the CPU backend: an op runs on both, on the
// same inputs, and its outputs are compared. Tests need a GPU; without one they skip and say why.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace memfit::test {

// The process's CUDA backend (device 0), or null when there is none (`why` says why).
CudaBackend * gpu(std::string * why = nullptr);

// The environment variable `name` where set, else `built_in` (a path compiled in on the build
// machine, which a GPU machine running a carried build does not have: scripts/gpu-check.sh sets
// MEMFIT_DATA_DIR and MEMFIT_TEST_DATA to its own tree).
std::string env_or(const char * name, const char * built_in);

// Bounds on rel_err(): fp32 results differ by summation order only; bf16/f16 stores round once
// more or less where the order differs.
constexpr double kTolF32 = 1e-5, kTolBf16 = 2e-2, kTolF16 = 4e-3;
inline double tol(DType t) { return t == DType::bf16 ? kTolBf16 : t == DType::f16 ? kTolF16 : kTolF32; }

// Attention's bounds: low-precision backward, the log-sum-exp, fp16 outputs; and the relative
// difference they bound, max |a - b| / max |a| (1 when that is 0; +inf on a non-finite value).
constexpr double kTolLowBwd = 3e-2, kTolLse = 1e-4, kTolF16Out = 1e-2;
inline double out_tol(DType dt) { return dt == DType::f16 ? kTolF16Out : tol(dt); }
inline double bwd_tol(DType dt) { return dt == DType::f32 ? tol(dt) : std::max(kTolLowBwd, tol(dt)); }
inline double rel(const std::vector<float> & a, const std::vector<float> & b) {
    double ref = 0, diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        ref = std::max(ref, double(std::fabs(a[i])));
        diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    }
    return diff / (ref > 0 ? ref : 1.0);
}

// Tensors are made first (host contents), then run() executes the op on the CPU backend over
// host copies and on the CUDA backend over device copies of every tensor, in order of creation.
class OpCheck {
public:
    OpCheck() = default;
    OpCheck(const OpCheck &) = delete;
    OpCheck & operator=(const OpCheck &) = delete;
    ~OpCheck();

    // f32/bf16/f16 values uniform in [lo, hi) (rounded to dt), from a stream fixed per tensor.
    int rand(DType dt, std::initializer_list<int64_t> dims, float lo = -1.0f, float hi = 1.0f);
    // The given values (rounded to dt); i32 tensors take integral values.
    int values(DType dt, std::initializer_list<int64_t> dims, const std::vector<float> & v);
    // i32 integers uniform in [lo, hi).
    int ints(std::initializer_list<int64_t> dims, int lo, int hi);
    // f32 zeros (an output written with `=` may start anywhere; one accumulated starts here).
    int zeros(DType dt, std::initializer_list<int64_t> dims);

    // t[i] is tensor i of this check (resolved to the backend's memory).
    void run(const std::function<void(Backend &, const std::vector<Tensor> &)> & op);

    // After run(): tensor i as fp32 (i32 converted), from each backend.
    std::vector<float> cpu(int i) const;
    std::vector<float> gpu(int i) const;
    // max |gpu - cpu| over tensor i, divided by max |cpu| (1 if that is 0); +inf on a NaN/inf in
    // one result that the other has not.
    double rel_err(int i) const;

private:
    struct Buf {
        Tensor host, dev;   // data: host memory / device memory
        std::vector<uint8_t> bytes, cpu_after, gpu_after;
    };
    std::vector<Buf> bufs_;
    int add(DType dt, std::initializer_list<int64_t> dims, std::vector<uint8_t> bytes);
};

// Elements of tensor i where the two backends' values differ (as floats; NaN never equal).
inline int64_t mismatches(const OpCheck & chk, int i) {
    const std::vector<float> a = chk.cpu(i), b = chk.gpu(i);
    int64_t n = 0;
    for (size_t k = 0; k < a.size(); ++k) n += !(a[k] == b[k]);
    return n;
}

}  // namespace memfit::test

// First statement of every GPU test: skips it, with the reason, when there is no device.
#define MF_REQUIRE_GPU()                                                        \
    do {                                                                        \
        std::string mf_why_;                                                    \
        if (!::memfit::test::gpu(&mf_why_)) GTEST_SKIP() << "no CUDA device: " << mf_why_; \
    } while (0)
