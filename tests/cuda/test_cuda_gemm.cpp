// The CUDA backend's gemm (gemm.cpp: cuBLASLt, gemm_simple.cu: the plain kernel) against the CPU
// backend: every transpose combination, accumulation, the bias epilogue, the operand dtypes
// cuBLASLt takes (f32; bf16 and f16 with their own or an f32 output) and mixes it does not (the
// plain kernel), an odd shape and an aligned one, and a bias at an odd address (plain kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "core/dtype.h"
#include "op_check.h"

namespace memfit::test {
namespace {

using Ts = std::vector<Tensor>;

struct Types { DType a, b, c; };

std::string describe(const GemmDesc & d, bool odd_bias) {
    return std::string(dtype_name(d.a)) + "x" + std::string(dtype_name(d.b)) + "->" + std::string(dtype_name(d.c)) +
           " M" + std::to_string(d.M) + " N" + std::to_string(d.N) + " K" + std::to_string(d.K) +
           (d.trans_a ? " Ta" : "") + (d.trans_b ? " Tb" : "") + (d.accumulate ? " +=" : "") + (d.bias ? " bias" : "") +
           (odd_bias ? " (odd address)" : "");
}

TEST(CudaGemm, MatchesCpu) {
    MF_REQUIRE_GPU();
    const Types types[] = {{DType::f32, DType::f32, DType::f32},    {DType::bf16, DType::bf16, DType::bf16},
                           {DType::bf16, DType::bf16, DType::f32},  {DType::f16, DType::f16, DType::f16},
                           {DType::f32, DType::bf16, DType::f32}};   // the last: the plain kernel
    const int64_t shapes[][3] = {{37, 45, 29}, {64, 128, 96}};
    CpuBackend cpu;
    for (const Types & ty : types)
        for (const auto & mnk : shapes)
            for (int tr = 0; tr < 4; ++tr)
                for (int mode = 0; mode < 4; ++mode) {   // plain, +=, bias, bias at an odd address
                    GemmDesc d;
                    d.M = mnk[0], d.N = mnk[1], d.K = mnk[2];
                    d.trans_a = tr & 1, d.trans_b = tr & 2;
                    d.accumulate = mode == 1;
                    d.bias = mode >= 2;
                    d.a = ty.a, d.b = ty.b, d.c = ty.c;
                    const bool odd_bias = mode == 3;
                    SCOPED_TRACE(describe(d, odd_bias));
                    OpCheck chk;
                    const int c = chk.rand(d.c, {d.M, d.N});
                    const int a = d.trans_a ? chk.rand(d.a, {d.K, d.M}) : chk.rand(d.a, {d.M, d.K});
                    const int b = d.trans_b ? chk.rand(d.b, {d.N, d.K}) : chk.rand(d.b, {d.K, d.N});
                    const int bias = chk.rand(d.b, {d.N + 1});
                    const size_t ws = std::max(cpu.gemm_workspace(d), cuda_gemm_workspace(d));
                    const int w = chk.zeros(DType::f32, {int64_t(std::max<size_t>(ws, 4) / 4)});
                    chk.run([&](Backend & be, const Ts & t) {
                        Tensor bv;
                        if (d.bias) {
                            bv = Tensor(-1, d.b, {d.N});
                            bv.data = static_cast<char *>(t[bias].data) + (odd_bias ? dtype_size(d.b) : 0);
                        }
                        be.gemm(d, t[c], t[a], t[b], bv, ws ? t[w] : Tensor{});
                    });
                    EXPECT_LT(chk.rel_err(c), tol(d.c));
                }
}

}  // namespace
}  // namespace memfit::test
