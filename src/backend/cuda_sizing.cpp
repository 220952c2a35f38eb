#include "backend/cuda_sizing.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/null_backend.h"
#include "memory/arena.h"

namespace memfit {

namespace {
int64_t g_narrow_cap = int64_t(128) << 20;
}  // namespace

int64_t cuda_gemm_narrow_cap() { return g_narrow_cap; }
void set_cuda_gemm_narrow_cap(int64_t bytes) { g_narrow_cap = std::max<int64_t>(bytes, 64); }

CudaGemmNarrowing cuda_gemm_narrowing(const GemmDesc & d) {
    CudaGemmNarrowing n;
    const bool a32 = d.a == DType::f32, b32 = d.b == DType::f32;
    const DType other = a32 ? d.b : d.a;
    if (a32 == b32 || (other != DType::bf16 && other != DType::f16) || d.bias || d.K <= 0 || d.M <= 0 || d.N <= 0 ||
        (d.c != other && d.c != DType::f32))
        return n;
    n.applies = true;
    n.a_is_f32 = a32;
    n.to = other;
    // The block as stored: op(A)'s rows are A's rows ([M, K]) or columns ([K, M] when trans_a);
    // op(B)'s columns are B's columns ([K, N]) or rows ([N, K] when trans_b). Stored rows of K
    // elements are padded to 8 (16 bytes); a block of columns is stored [K, block].
    // A's stride is free (GemmDesc::lda): padded. B is read packed: its block's rows are K, or
    // the block's width, elements apart.
    const bool rows_of_k = a32 ? !d.trans_a : d.trans_b;
    const int64_t total = a32 ? d.M : d.N;
    const auto pad8 = [&](int64_t x) { return a32 ? (x + 7) / 8 * 8 : x; };
    const int64_t per = rows_of_k ? pad8(d.K) : d.K;   // elements per row (or column) of the block
    int64_t block = std::max<int64_t>(16, g_narrow_cap / (per * 2) / 16 * 16);
    if (block >= total) block = total;
    n.block = block;
    n.ld = rows_of_k ? per : pad8(block);
    n.bytes = align_up(size_t(rows_of_k ? block * per : d.K * n.ld) * 2, 256);
    return n;
}

size_t cuda_gemm_workspace(const GemmDesc & d) {
    // cuBLASLt may split K and reduce through the workspace: room for an fp32 C, at least 1 MiB
    // (its small-shape kernels) and at most the 32 MiB NVIDIA recommends for Hopper.
    const size_t c_f32 = size_t(d.M) * size_t(d.N) * sizeof(float);
    return cuda_gemm_narrowing(d).bytes + align_up(std::clamp(c_f32, size_t(1) << 20, size_t(32) << 20), 256);
}

size_t cuda_flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH) {
    // D = rowsum(dO * O) per query and head (fp32). The backward (kernels_flash.cu) computes dQ
    // and dK/dV in two passes without atomics, so it needs no fp32 dQ accumulator.
    (void) C;
    return size_t(B) * size_t(NH) * size_t(T) * sizeof(float);
}

int64_t cuda_qgemm_tile_rows(const QuantDesc & q) {
    // About 4 Mi elements (8 MiB in bf16: a few times the gemm's own working set, so the tiles'
    // gemms stay large), in whole multiples of 8 rows so that every tile of packed 4-bit or 2:4
    // weights starts on a code word; the whole matrix when it is smaller.
    constexpr int64_t kTileElems = int64_t(1) << 22;
    const int64_t rows = std::max<int64_t>(8, kTileElems / std::max<int64_t>(1, q.in) / 8 * 8);
    return std::min(rows, q.out);
}

size_t cuda_qgemm_workspace(const QuantDesc & q, int64_t M, DType act) {
    (void) M;
    return align_up(size_t(cuda_qgemm_tile_rows(q)) * size_t(q.in) * dtype_size(act), 256);
}

std::string cuda_flash_attention_refusal(int head_dim) {
    if (head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128) return {};
    return fmt::format("the CUDA flash-attention kernels take head dimensions 32, 64, 96 and 128, not {}", head_dim);
}

namespace {

class CudaSizing final : public NullBackend {
public:
    const char * name() const override { return "cuda-sizing"; }
    bool host_memory() const override { return false; }   // as the CUDA backend: offload goes to pinned host memory
    bool native_16bit_sums() const override { return true; }
    bool pure_sizing() const override { return true; }   // formulas only
    size_t gemm_workspace(const GemmDesc & d) const override { return cuda_gemm_workspace(d); }
    size_t flash_attention_workspace(int64_t B, int64_t T, int64_t C, int NH, DType) const override {
        return cuda_flash_attention_workspace(B, T, C, NH);
    }
    size_t qgemm_workspace(const QuantDesc & q, int64_t M, DType act) const override {
        return cuda_qgemm_workspace(q, M, act);
    }
    std::string flash_attention_refusal(int head_dim) const override { return cuda_flash_attention_refusal(head_dim); }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_sizing_backend() { return std::make_unique<CudaSizing>(); }

}  // namespace memfit
