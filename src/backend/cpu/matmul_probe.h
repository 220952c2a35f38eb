// Matmul rate probes for `memfit bench`: the same model-shaped gemms timed three ways, so the
// bench can say which bf16 path is faster on this CPU (medians of several repetitions, GFLOP/s,
// with the current OpenMP thread count).
#pragma once

namespace memfit::cpu {

// fp32 through oneDNN (DnnlGemm): the peak the bench's MFU divides by.
double measure_matmul_peak_gflops(int repeats = 5);
// oneDNN's own bf16 matmul (bf16 inputs, f32 output). 0 when oneDNN has no optimized bf16
// implementation for this CPU (its reference one is not timed).
double measure_onednn_bf16_gflops(int repeats = 5);
// memfit's bf16-storage gemm as the engine runs it (CpuBackend: the path bf16_path.h chose).
double measure_bf16_storage_gflops(int repeats = 5);
// The convert path alone: bf16 A, B and C converted through fp32 tiles (gemm_mixed.h).
double measure_bf16_convert_gflops(int repeats = 5);

}  // namespace memfit::cpu
