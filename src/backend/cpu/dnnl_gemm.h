// oneDNN (v2 API, Debian 12's 2.6) matmul behind GemmDesc: primitives created once per shape and
// cached; user-managed scratchpad so the planner can count it as workspace; operands are read in
// place through strided memory descriptors, except a native bf16 gemm's B, packed into the
// workspace on each call where that copy is at most 8 MiB and A has 256 rows or more
// (dnnl_gemm.cpp).
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace memfit::cpu {

// One matmul with explicit element strides: C[M,N] (+)= A[M,K] B[K,N] (+ bias[N]) with
// A(m,k) = a[m*a_sm + k*a_sk], B(k,n) = b[k*b_sk + n*b_sn], C(m,n) = c[m*ldc + n]. All f32, or
// native bf16: A and B bf16, C bf16 or f32, bias bf16 (oneDNN accumulates in fp32 and rounds C
// once, after the sum post-op when accumulating).
struct MatmulShape {
    int64_t M = 0, N = 0, K = 0;
    int64_t a_sm = 0, a_sk = 0, b_sk = 0, b_sn = 0, ldc = 0;
    bool accumulate = false, bias = false;
    DType ab = DType::f32, c = DType::f32;   // A's and B's (and bias') dtype; C's
    bool operator==(const MatmulShape &) const = default;
};

// The shape of a GemmDesc over the caller's row-major buffers (all f32, or bf16 A and B).
MatmulShape matmul_shape(const GemmDesc & d);

// Whether a GemmDesc's dtypes are a native bf16 matmul's (A and B bf16, C bf16 or f32).
inline bool bf16_operands(const GemmDesc & d) {
    return d.a == DType::bf16 && d.b == DType::bf16 && (d.c == DType::bf16 || d.c == DType::f32);
}

class DnnlGemm {
public:
    DnnlGemm();
    ~DnnlGemm();
    DnnlGemm(const DnnlGemm &) = delete;
    DnnlGemm & operator=(const DnnlGemm &) = delete;

    // Scratchpad bytes the primitive for `d` (all f32) needs (creates and caches it).
    size_t workspace_bytes(const GemmDesc & d);
    // Native bf16 (bf16_operands(d)): whether oneDNN has an optimized (not reference) bf16 matmul
    // for d on this CPU, decided by creating it, and is this machine's faster bf16 path
    // (bf16_path.h: measured once per machine; MEMFIT_CPU_NATIVE_BF16=0 or 1 as this object is
    // made overrides it, so the tests reach either path on any CPU that has both). When true,
    // native_workspace_bytes and
    // run_native take d (in tiles of M where one call's scratchpad would be large, or where
    // this machine ran the shape faster so, timed once per shape: dnnl_gemm.cpp).
    bool native(const GemmDesc & d);
    size_t native_workspace_bytes(const GemmDesc & d);
    void run_native(const GemmDesc & d, void * c, const void * a, const void * b, const void * bias, void * workspace);
    // C (+)= op(A) op(B) (+ bias), all f32. workspace must hold workspace_bytes(d) bytes (may be
    // null if 0).
    void run(const GemmDesc & d, float * c, const float * a, const float * b, const float * bias,
             void * workspace);

    // The same for an explicit shape (the tiles of the mixed-precision gemm).
    size_t scratch_bytes(const MatmulShape & s);
    void run(const MatmulShape & s, float * c, const float * a, const float * b, const float * bias,
             void * scratch);
    // An explicit bf16 shape (s.ab bf16): whether it is native, as native(GemmDesc); and its run
    // (s native; the dtypes of s).
    bool native(const MatmulShape & s);
    void run_native(const MatmulShape & s, void * c, const void * a, const void * b, const void * bias,
                    void * scratch);

private:
    int64_t native_tile_rows(const MatmulShape & s);   // rows per call of a native GemmDesc
    int64_t tuned_rows(const MatmulShape & s);         // the machine's row tile for a large one
    int64_t measure_row_tile(const MatmulShape & s);
    void execute(const MatmulShape & s, void * c, const void * a, const void * b, const void * bias, void * scratch);
    struct Impl;
    std::unique_ptr<Impl> impl_;
};


}  // namespace memfit::cpu
