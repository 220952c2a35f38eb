// Gemms whose A, B or C are stored in bf16/f16, on a CPU without native low-precision matmul
// kernels: tiles of M and N (never of K) are converted to fp32 in the workspace, multiplied by
// the fp32 oneDNN matmul, and rounded into C. See gemm_mixed.cpp for the plan and its cost model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/dnnl_gemm.h"

namespace memfit::cpu {

// How big the fp32 tiles may be: the tiles of A, B, C and bias together stay within
// budget_bytes where tiles of min_tile rows/columns allow it (else the smallest such tiles).
struct GemmTileLimits {
    size_t  budget_bytes = size_t{32} << 20;
    int64_t min_tile = 256;
};

// The tiling of one mixed-precision gemm and the layout of its workspace (byte offsets, each
// region 64-byte aligned): [A tile][B tile][bias tile][C tile][oneDNN scratchpad].
struct GemmTilePlan {
    bool    m_outer = true;        // loop over M tiles outside (A tile converted once per tile)
    int64_t mt = 0, nt = 0;        // tile sizes (the last tile of each dimension may be smaller)
    int64_t m_tiles = 0, n_tiles = 0;
    bool    conv_a = false, conv_b = false, conv_bias = false, conv_c = false;
    size_t  off_a = 0, off_b = 0, off_bias = 0, off_c = 0, off_scratch = 0;
    size_t  scratch_bytes = 0;     // the largest oneDNN scratchpad of the tile shapes
    size_t  bytes = 0;             // total workspace
};

class MixedGemm {
public:
    explicit MixedGemm(DnnlGemm & gemm, GemmTileLimits limits = {});
    ~MixedGemm();
    MixedGemm(const MixedGemm &) = delete;
    MixedGemm & operator=(const MixedGemm &) = delete;

    // The plan for `d` (not all f32), computed once and cached.
    const GemmTilePlan & plan(const GemmDesc & d);
    // With the plan's tiles mt x nt (f = 4 bytes, each term rounded up to 64 bytes):
    //   f*mt*K [A not f32] + f*K*nt [B not f32] + f*nt [bias, B not f32] + f*mt*nt [C not f32]
    //   + the largest oneDNN scratchpad of the (up to four) tile shapes.
    size_t workspace_bytes(const GemmDesc & d) { return plan(d).bytes; }
    // C (+)= op(A) op(B) (+ bias) with the dtypes of d (bias has d.b's dtype); workspace holds
    // workspace_bytes(d) bytes.
    void run(const GemmDesc & d, void * c, const void * a, const void * b, const void * bias, void * workspace);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace memfit::cpu
