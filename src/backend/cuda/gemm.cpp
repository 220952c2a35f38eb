// cuBLASLt behind GemmDesc. Our matrices are row-major; cuBLASLt's are column-major, and a
// row-major X[r, c] is the column-major X^T[c, r]. So C[M,N] = op(A) op(B) is computed as the
// column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A,
// and a row-major operand stored transposed is a column-major one that is not.
#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda_sizing.h"

namespace memfit::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::f32: return CUDA_R_32F;
        case DType::bf16: return CUDA_R_16BF;
        case DType::f16: return CUDA_R_16F;
        default: MF_ASSERT(false && "gemm operands are f32, bf16 or f16");
    }
    return CUDA_R_32F;
}

// The largest power of two (at most 256) dividing the address: cuBLASLt picks kernels whose
// vector loads need it.
uint32_t alignment(const void * p) {
    const auto u = reinterpret_cast<uintptr_t>(p);
    uint32_t a = 256;
    while (a > 1 && (u % a) != 0) a >>= 1;
    return a;
}

// One shape's descriptors and chosen algorithm.
struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;   // a heuristic result exists
    ~Plan() {
        if (op) cublasLtMatmulDescDestroy(op);
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
    }
};

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, int, int, int, size_t, uint32_t, uint32_t,
                       uint32_t, uint32_t, int64_t, int64_t>;

}  // namespace

struct Gemm::Impl {
    cublasLtHandle_t handle = nullptr;
    std::map<Key, std::unique_ptr<Plan>> plans;

    Plan & plan(const GemmDesc & d, bool bias, size_t ws, const void * a, const void * b, const void * c,
                const void * bias_p, int64_t ldc) {
        const int64_t lda = gemm_lda(d);
        const Key key{d.M, d.N, d.K, d.trans_a, d.trans_b, bias, int(d.a), int(d.b), int(d.c), ws,
                      alignment(a), alignment(b), alignment(c), bias ? alignment(bias_p) : 256u, lda, ldc};
        auto it = plans.find(key);
        if (it != plans.end()) return *it->second;
        auto p = std::make_unique<Plan>();
        MF_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        // cuBLASLt's first operand is our B: stored [K,N] (op N) or [N,K] (trans_b: op T).
        const cublasOperation_t ta = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        const cublasOperation_t tb = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        MF_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        MF_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (bias) {
            const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bt = cuda_type(d.b);
            MF_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
            MF_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        }
        // Column-major shapes of the stored matrices: our B is [N,K] ld N (or [K,N] ld K
        // transposed), our A [K,M] ld lda (or [M,K] ld lda), our C [N,M] ld ldc (packed: K, M, N).
        const uint64_t N = uint64_t(d.N), M = uint64_t(d.M), K = uint64_t(d.K);
        MF_CUBLAS(d.trans_b ? cublasLtMatrixLayoutCreate(&p->la, cuda_type(d.b), K, N, int64_t(K))
                            : cublasLtMatrixLayoutCreate(&p->la, cuda_type(d.b), N, K, int64_t(N)));
        MF_CUBLAS(d.trans_a ? cublasLtMatrixLayoutCreate(&p->lb, cuda_type(d.a), M, K, lda)
                            : cublasLtMatrixLayoutCreate(&p->lb, cuda_type(d.a), K, M, lda));
        MF_CUBLAS(cublasLtMatrixLayoutCreate(&p->lc, cuda_type(d.c), N, M, ldc));

        cublasLtMatmulPreference_t pref = nullptr;
        MF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws64 = ws;
        MF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64,
                                                       sizeof ws64));
        const uint32_t al[4] = {std::get<11>(key), std::get<10>(key), std::get<12>(key), std::get<13>(key)};
        const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; ++i)
            MF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], i == 3 ? &al[2] : &al[i], sizeof(uint32_t)));
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        // No algorithm for this case (NOT_SUPPORTED, or none found): the plain kernel. Any other
        // failure (INVALID_VALUE: descriptors that disagree) is a bug here, not a missing kernel.
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) MF_CUBLAS(st);
        p->usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
        if (p->usable) p->algo = result.algo;
        return *plans.emplace(key, std::move(p)).first->second;
    }
};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) { MF_CUBLAS(cublasLtCreate(&impl_->handle)); }

Gemm::~Gemm() {
    impl_->plans.clear();
    if (impl_->handle) cublasLtDestroy(impl_->handle);
}

void Gemm::run(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace,
               int64_t ldc) {
    MF_ASSERT(!(d.bias && d.accumulate));
    if (ldc == 0) ldc = d.N;
    if (d.M == 0 || d.N == 0) return;
    if (cuda_gemm_narrowing(d).applies) {
        run_narrowed(s, d, c, a, b, workspace, ldc);
        return;
    }
    // cuBLASLt takes A and B of one dtype and C of theirs or f32; the bias epilogue adds a
    // vector of C's dtype here. Other mixes (and K = 0) take the plain kernel. The alignment
    // preferences do not cover the bias pointer, and the epilogue kernels assume a 16-byte aligned
    // bias (a misaligned one faults): such a bias (a view at an odd offset) also takes the plain kernel.
    const bool lt = d.a == d.b && (d.c == d.a || d.c == DType::f32) && d.K > 0 &&
                    (!d.bias || (d.b == d.c && alignment(bias.data) >= 16));
    if (!lt) {
        gemm_simple(s, d, c, a, b, bias, ldc);
        return;
    }
    const size_t ws = workspace.valid() ? workspace.nbytes() : 0;
    Plan & p = impl_->plan(d, d.bias, ws, a.data, b.data, c.data, bias.data, ldc);
    if (!p.usable) {
        gemm_simple(s, d, c, a, b, bias, ldc);
        return;
    }
    if (d.bias)
        MF_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.data,
                                                 sizeof bias.data));
    const float alpha = 1.0f, beta = d.accumulate ? 1.0f : 0.0f;
    MF_CUBLAS(cublasLtMatmul(impl_->handle, p.op, &alpha, b.data, p.la, a.data, p.lb, &beta, c.data, p.lc, c.data,
                             p.lc, &p.algo, ws ? workspace.data : nullptr, ws, s));
}

void Gemm::run_narrowed(cudaStream_t s, const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor workspace,
                        int64_t ldc) {
    const CudaGemmNarrowing n = cuda_gemm_narrowing(d);
    MF_ASSERT(workspace.valid() && workspace.nbytes() >= n.bytes);
    Tensor buf = workspace, rest = workspace;
    rest.data = static_cast<char *>(workspace.data) + n.bytes;
    rest.ndim = 1, rest.shape[0] = int64_t(workspace.nbytes() - n.bytes), rest.dtype = DType::u8;
    const Tensor & wide = n.a_is_f32 ? a : b;
    const auto * src = static_cast<const float *>(wide.data);
    const size_t c_elem = dtype_size(d.c);
    const int64_t total = n.a_is_f32 ? d.M : d.N;
    // Stored rows of K elements (A not transposed, B transposed) or a block of columns.
    const bool rows_of_k = n.a_is_f32 ? !d.trans_a : d.trans_b;
    const int64_t src_ld = n.a_is_f32 ? gemm_lda(d) : (d.trans_b ? d.K : d.N);
    for (int64_t r0 = 0; r0 < total; r0 += n.block) {
        const int64_t rows = std::min(n.block, total - r0);
        // B's last block, narrower than the others, is stored packed at its own width.
        const int64_t ld = !n.a_is_f32 && !rows_of_k ? rows : n.ld;
        if (rows_of_k) narrow_block(s, buf.data, n.to, ld, src + r0 * src_ld, src_ld, rows, d.K);
        else narrow_block(s, buf.data, n.to, ld, src + r0, src_ld, d.K, rows);
        GemmDesc bd = d;
        Tensor na = a, nb = b, nc = c;
        if (n.a_is_f32) {
            bd.M = rows, bd.a = n.to, bd.lda = n.ld;
            na.data = buf.data, na.dtype = n.to;
            nc.data = static_cast<char *>(c.data) + size_t(r0 * ldc) * c_elem;
        } else {
            bd.N = rows, bd.b = n.to;   // C's columns r0.. (ldc apart)
            nb.data = buf.data, nb.dtype = n.to;
            nc.data = static_cast<char *>(c.data) + size_t(r0) * c_elem;
        }
        run(s, bd, nc, na, nb, Tensor{}, rest, ldc);
    }
}

}  // namespace memfit::cuda
