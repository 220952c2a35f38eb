// A 16-bit gradient sum's fp32 scratch: declared where the collectives need it (MPI, on the CPU
// backend, sums fp32 copies), not where they add bf16 natively (NCCL: the CUDA backend and its
// sizing backend, so a GPU plan drops it too). The programs differ by exactly those buffers.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_sizing.h"
#include "test_util.h"
#include "train/step.h"

namespace memfit {
namespace {

std::map<std::string, size_t> buffers(const TrainStep & s) {
    std::map<std::string, size_t> m;
    for (const BufferDecl & d : s.program().buffers())
        if (d.category != Category::workspace) m[d.name] = d.bytes;
    return m;
}

TEST(CommScratch, NativeSixteenBitSumsDeclareNoFp32Copies) {
    const ModelConfig cfg = test::small_family(true, 96, 128, 2, 4, 256, 64);
    CpuBackend cpu;
    const std::unique_ptr<Backend> gpu = make_cuda_sizing_backend();
    EXPECT_FALSE(cpu.native_16bit_sums());
    EXPECT_TRUE(gpu->native_16bit_sums());
    for (const int zero : {0, 2}) {
        for (const DType grad : {DType::bf16, DType::f32}) {
            SCOPED_TRACE("zero " + std::to_string(zero) + " gradients " + std::string(dtype_name(grad)));
            ModelOptions mo;
            mo.compute = DType::bf16, mo.grad = grad;
            const DataParallel dp{2, 0, zero, 64 << 10};
            StepParts parts;
            parts.reduce_grads = true;
            const TrainStep mpi(cfg, 2, 64, StepMode::train, &cpu, mo, parts, dp),
                nccl(cfg, 2, 64, StepMode::train, gpu.get(), mo, parts, dp);
            const auto a = buffers(mpi), b = buffers(nccl);
            size_t scratch = 0;
            for (const auto & [name, bytes] : a) {
                if (name.starts_with("communication.bucket")) {
                    scratch += bytes;
                    EXPECT_FALSE(b.contains(name)) << name;
                } else {
                    ASSERT_TRUE(b.contains(name)) << name;
                    EXPECT_EQ(b.at(name), bytes) << name;
                }
            }
            for (const auto & [name, bytes] : b) EXPECT_TRUE(a.contains(name)) << name;
            // bf16 buckets: one fp32 copy of every gradient element, bucket by bucket; f32: none.
            // ZeRO 2 keeps its buckets in the compute dtype (bf16) even when the shard is fp32.
            const bool bf16_buckets = grad == DType::bf16 || zero >= 2;
            EXPECT_EQ(scratch, bf16_buckets ? mpi.layout().total * 4 : 0u);
        }
    }
}

}  // namespace
}  // namespace memfit
