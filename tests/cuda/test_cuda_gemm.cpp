// The CUDA backend's gemm (gemm.cpp: cuBLASLt, gemm_simple.cu: the plain kernel) against the CPU
// backend: every transpose combination, accumulation, the bias epilogue, the operand dtypes
// cuBLASLt takes (f32; bf16 and f16 with their own or an f32 output), an fp32 operand beside a
// 16-bit one (rounded to 16 bits block by block, several blocks here: against the CPU on the
// rounded operand), an odd shape and an aligned one, and a bias at an odd address (plain kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
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
                           {DType::f32, DType::bf16, DType::f32},   // mixes: A or B narrowed
                           {DType::f32, DType::bf16, DType::bf16},  {DType::bf16, DType::f32, DType::f32}};
    const int64_t cap = cuda_gemm_narrow_cap();
    set_cuda_gemm_narrow_cap(2048);   // blocks of 16 or 32 rows: every shape below takes several
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
                    // The narrowed operand holds values its 16-bit dtype holds: both backends see the same.
                    const CudaGemmNarrowing nw = cuda_gemm_narrowing(d);
                    const auto operand = [&](DType dt, int64_t rows, int64_t cols, bool narrowed) {
                        if (!narrowed) return chk.rand(dt, {rows, cols});
                        std::mt19937 rng(unsigned(rows * 131 + cols));
                        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                        std::vector<float> v(size_t(rows * cols));
                        for (float & x : v) x = nw.to == DType::bf16 ? bf16_to_f32(f32_to_bf16(u(rng))) : f16_to_f32(f32_to_f16(u(rng)));
                        return chk.values(DType::f32, {rows, cols}, v);
                    };
                    const bool na = nw.applies && nw.a_is_f32, nb = nw.applies && !nw.a_is_f32;
                    const int a = d.trans_a ? operand(d.a, d.K, d.M, na) : operand(d.a, d.M, d.K, na);
                    const int b = d.trans_b ? operand(d.b, d.N, d.K, nb) : operand(d.b, d.K, d.N, nb);
                    if (nw.applies) {
                        EXPECT_GT(na ? d.M : d.N, nw.block) << "one block only";
                    }
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
    set_cuda_gemm_narrow_cap(cap);
}

}  // namespace
}  // namespace memfit::test
