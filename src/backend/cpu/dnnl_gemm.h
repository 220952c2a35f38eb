// oneDNN (v2 API, Debian 12's 2.6) matmul behind GemmDesc: primitives created once per shape and
// cached; user-managed scratchpad so the planner can count it as workspace; weights are used in
// place through strided memory descriptors (no per-call reorder).
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace memfit::cpu {

// One fp32 matmul with explicit element strides: C[M,N] (+)= A[M,K] B[K,N] (+ bias[N]) with
// A(m,k) = a[m*a_sm + k*a_sk], B(k,n) = b[k*b_sk + n*b_sn], C(m,n) = c[m*ldc + n].
struct MatmulShape {
    int64_t M = 0, N = 0, K = 0;
    int64_t a_sm = 0, a_sk = 0, b_sk = 0, b_sn = 0, ldc = 0;
    bool accumulate = false, bias = false;
    bool operator==(const MatmulShape &) const = default;
};

// The shape of an all-f32 GemmDesc over the caller's row-major buffers.
MatmulShape matmul_shape(const GemmDesc & d);

class DnnlGemm {
public:
    DnnlGemm();
    ~DnnlGemm();
    DnnlGemm(const DnnlGemm &) = delete;
    DnnlGemm & operator=(const DnnlGemm &) = delete;

    // Scratchpad bytes the primitive for `d` (all f32) needs (creates and caches it).
    size_t workspace_bytes(const GemmDesc & d);
    // C (+)= op(A) op(B) (+ bias), all f32. workspace must hold workspace_bytes(d) bytes (may be
    // null if 0).
    void run(const GemmDesc & d, float * c, const float * a, const float * b, const float * bias,
             void * workspace);

    // The same for an explicit shape (the tiles of the mixed-precision gemm).
    size_t scratch_bytes(const MatmulShape & s);
    void run(const MatmulShape & s, float * c, const float * a, const float * b, const float * bias,
             void * scratch);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};


}  // namespace memfit::cpu
