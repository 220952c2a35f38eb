// oneDNN 2.6 (v2 API: matmul::desc -> matmul::primitive_desc) behind GemmDesc.
//
// One primitive per distinct MatmulShape (a GemmDesc, or a tile of a mixed-precision gemm: see
// gemm_mixed.cpp), created on first use and cached together with the
// dnnl::memory objects it executes on; a call only swaps the data handles, so run() allocates
// nothing itself. Transposes are strided memory descriptors over the caller's row-major buffers
// (fp32: no copies; native bf16: B is packed into the workspace first where that copy is small,
// kPackedB below); `accumulate` is a sum post-op (C = 1.0 * C + A.B); `bias` is a {1,N}
// bias broadcast over rows. The scratchpad is user-managed so that its size can be planned as
// the gemm's workspace and handed back on every call.
//
// oneDNN asks for a scratchpad on some CPUs and not on others (none for these shapes on AVX2,
// some on AVX-512), so a caller that forgets the workspace can pass every test on one machine.
// MEMFIT_TEST_GEMM_SCRATCH=N (tests only) adds N bytes to every primitive's request and fills
// them on every call: each caller must then plan and pass the workspace on any CPU, and one that
// passes too little overwrites its neighbours (which the bitwise tests see).
//
// Not thread-safe: one DnnlGemm per thread that issues gemms (each call is itself parallel
// through OpenMP).
#include "backend/cpu/dnnl_gemm.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/bf16_path.h"
#include "backend/cpu/dnnl_check.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

using dims = dnnl::memory::dims;
using dt   = dnnl::memory::data_type;

struct ShapeHash {
    size_t operator()(const MatmulShape & s) const noexcept {
        uint64_t h = 0xcbf29ce484222325ull;
        auto mix = [&h](uint64_t v) {
            h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        };
        for (int64_t v : {s.M, s.N, s.K, s.a_sm, s.a_sk, s.b_sk, s.b_sn, s.ldc}) mix(uint64_t(v));
        mix(uint64_t(s.accumulate) | uint64_t(s.bias) << 1 | uint64_t(s.ab) << 8 | uint64_t(s.c) << 16);
        return size_t(h);
    }
};

// A cached primitive and the memory objects (handles swapped per call) it executes on.
struct Entry {
    dnnl::matmul prim;
    size_t       scratch_bytes = 0;   // what callers are told: oneDNN's, the packed B, the test padding
    size_t       dnnl_scratch = 0;    // oneDNN's own request
    size_t       packed_at = 0;       // a packed B's offset in the workspace (after oneDNN's scratchpad)
    dnnl::memory a, b, c, bias, scratch;
    std::unordered_map<int, dnnl::memory> args;
    // Native bf16 with B packed: the caller's B (strided) and the reorder into oneDNN's layout.
    std::optional<dnnl::reorder> pack;
    dnnl::memory b_user;
};

// A native bf16 gemm reads B packed into the layout its kernel wants (oneDNN's "any" weights
// format), reordered into the workspace on each call, when that copy is at most kPackedB and A
// has at least kPackedRows rows: on the Zen 5 VM the model's gemms then ran 9-25% faster
// (2048x384x1536 641-666 -> 802-825 GFLOP/s alone; dX of the same 671-682 -> 739-743), the
// reorder costing a read and a write of B, about 35/M of the product's time at these rates (so
// not for decoding's few rows). fp32's ran the same either way and keep the caller's B.
constexpr size_t kPackedB = size_t{8} << 20;
constexpr int64_t kPackedRows = 256;
size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

struct DnnlGemm::Impl {
    dnnl::engine engine;
    dnnl::stream stream;
    std::unordered_map<MatmulShape, Entry, ShapeHash> cache;
    std::unordered_map<MatmulShape, bool, ShapeHash> native;   // bf16 shapes: optimized primitive or not
    size_t test_pad = 0;   // MEMFIT_TEST_GEMM_SCRATCH
    std::optional<bool> native_forced;   // MEMFIT_CPU_NATIVE_BF16 as this object was made

    Impl()
        : engine(MF_DNNL(dnnl::engine(dnnl::engine::kind::cpu, 0))),
          stream(MF_DNNL(dnnl::stream(engine))) {
        if (const char * v = std::getenv("MEMFIT_TEST_GEMM_SCRATCH")) test_pad = size_t(std::strtoull(v, nullptr, 10));
        if (const char * v = std::getenv("MEMFIT_CPU_NATIVE_BF16"); v && *v) native_forced = std::string(v) != "0";
    }

    static dt dnnl_type(DType t) { return t == DType::bf16 ? dt::bf16 : dt::f32; }

    // A bf16 shape: true when oneDNN creates an optimized primitive for it (a reference
    // implementation, which oneDNN falls back to on CPUs without bf16 instructions, is slower
    // than the convert path: no) and the native path is this machine's choice (bf16_path.h: the
    // faster of the two as measured here, or MEMFIT_CPU_NATIVE_BF16).
    bool has_native(const MatmulShape & d) {
        auto it = native.find(d);
        if (it != native.end()) return it->second;
        bool ok = false;
        try {
            const auto pd = primitive_desc(d);
            ok = std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
        } catch (const dnnl::error &) {
            ok = false;
        }
        // The machine's choice is asked only here, where a native kernel exists (measured once).
        ok = ok && (native_forced ? *native_forced : native_bf16_chosen());
        return native.emplace(d, ok).first->second;
    }

    // Logical shapes with the strides of the caller's storage; B in the kernel's own layout when
    // `packed_b`.
    dnnl::matmul::primitive_desc primitive_desc(const MatmulShape & d, bool packed_b = false) {
        const dnnl::memory::desc a_md({d.M, d.K}, dnnl_type(d.ab), dims{d.a_sm, d.a_sk});
        const dnnl::memory::desc b_md = packed_b ? dnnl::memory::desc({d.K, d.N}, dnnl_type(d.ab), dnnl::memory::format_tag::any)
                                                 : dnnl::memory::desc({d.K, d.N}, dnnl_type(d.ab), dims{d.b_sk, d.b_sn});
        const dnnl::memory::desc c_md({d.M, d.N}, dnnl_type(d.c), dims{d.ldc, 1});
        const dnnl::memory::desc bias_md({1, d.N}, dnnl_type(d.ab), dims{d.N, 1});
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        if (d.accumulate) {
            dnnl::post_ops po;
            po.append_sum(1.0f);
            attr.set_post_ops(po);
        }
        const dnnl::matmul::desc desc = d.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                               : dnnl::matmul::desc(a_md, b_md, c_md);
        return dnnl::matmul::primitive_desc(desc, attr, engine);
    }

    Entry & get(const MatmulShape & d) {
        auto it = cache.find(d);
        if (it != cache.end()) return it->second;

        MF_ASSERT(d.M > 0 && d.N > 0 && d.K > 0);
        MF_ASSERT(!(d.bias && d.accumulate));
        MF_ASSERT((d.ab == DType::f32 && d.c == DType::f32) || (d.ab == DType::bf16 && has_native(d)));
        const bool packed = d.ab == DType::bf16 && d.M >= kPackedRows && size_t(d.K) * size_t(d.N) * 2 <= kPackedB;
        const auto pd = MF_DNNL(primitive_desc(d, packed));
        const dnnl::memory::desc a_md = pd.src_desc(), b_md = pd.weights_desc(), c_md = pd.dst_desc();
        const dnnl::memory::desc bias_md({1, d.N}, dnnl_type(d.ab), dims{d.N, 1});

        Entry e;
        e.prim          = MF_DNNL(dnnl::matmul(pd));
        e.dnnl_scratch  = MF_DNNL(pd.scratchpad_desc().get_size());
        e.packed_at     = align64(e.dnnl_scratch);
        e.scratch_bytes = (packed ? e.packed_at + b_md.get_size() : e.dnnl_scratch) + test_pad;
        if (packed) {
            const dnnl::memory::desc user({d.K, d.N}, dnnl_type(d.ab), dims{d.b_sk, d.b_sn});
            e.b_user = MF_DNNL(dnnl::memory(user, engine, DNNL_MEMORY_NONE));
            e.pack   = MF_DNNL(dnnl::reorder(e.b_user, MF_DNNL(dnnl::memory(b_md, engine, DNNL_MEMORY_NONE))));
        }
        e.a             = MF_DNNL(dnnl::memory(a_md, engine, DNNL_MEMORY_NONE));
        e.b             = MF_DNNL(dnnl::memory(b_md, engine, DNNL_MEMORY_NONE));
        e.c             = MF_DNNL(dnnl::memory(c_md, engine, DNNL_MEMORY_NONE));
        e.args          = {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}};
        if (d.bias) {
            e.bias = MF_DNNL(dnnl::memory(bias_md, engine, DNNL_MEMORY_NONE));
            e.args.emplace(DNNL_ARG_BIAS, e.bias);
        }
        if (e.dnnl_scratch > 0) {
            e.scratch = MF_DNNL(dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE));
            e.args.emplace(DNNL_ARG_SCRATCHPAD, e.scratch);
        }
        return cache.emplace(d, std::move(e)).first->second;
    }
};

MatmulShape matmul_shape(const GemmDesc & d) {
    MF_ASSERT((d.a == DType::f32 && d.b == DType::f32 && d.c == DType::f32) || bf16_operands(d));
    MatmulShape s;
    s.M = d.M, s.N = d.N, s.K = d.K;
    // Row-major storage: A is [M,K] ([K,M] when trans_a), B is [K,N] ([N,K] when trans_b).
    s.a_sm = d.trans_a ? 1 : gemm_lda(d);
    s.a_sk = d.trans_a ? gemm_lda(d) : 1;
    s.b_sk = d.trans_b ? 1 : d.N;
    s.b_sn = d.trans_b ? d.K : 1;
    s.ldc = d.N;
    s.accumulate = d.accumulate;
    s.bias = d.bias;
    s.ab = d.a;
    s.c = d.c;
    return s;
}

DnnlGemm::DnnlGemm() : impl_(std::make_unique<Impl>()) {}
DnnlGemm::~DnnlGemm() = default;

size_t DnnlGemm::workspace_bytes(const GemmDesc & d) { return scratch_bytes(matmul_shape(d)); }

void DnnlGemm::run(const GemmDesc & d, float * c, const float * a, const float * b, const float * bias,
                   void * workspace) {
    run(matmul_shape(d), c, a, b, bias, workspace);
}

size_t DnnlGemm::scratch_bytes(const MatmulShape & s) { return impl_->get(s).scratch_bytes; }

// A native gemm runs in tiles of M (rows of A and C, each over the whole K) when oneDNN's
// scratchpad for one call would pass kNativeScratch: for a strided or transposed A it copies A's
// panels, and for the LM head's dW (M = vocabulary) that asked for 147 MiB. Tiles of 64-row
// multiples, equal but the last; the planned workspace is the larger of the two tiles' needs.
// (Tiles of N for the LM head's forward, each with its B packed, were tried: oneDNN then took
// its jit gemm at 655-659 GFLOP/s and the reorders of the transposed weight ran at 6 GB/s, no
// faster than one unpacked call.)
namespace {
constexpr size_t kNativeScratch = size_t{8} << 20;

MatmulShape rows_of(MatmulShape s, int64_t rows) {
    s.M = rows;
    return s;
}

// The rows of the last of the tiles of mt rows over M.
int64_t last_tile_rows(int64_t M, int64_t mt) { return M - (M - 1) / mt * mt; }
}  // namespace

int64_t DnnlGemm::native_tile_rows(const MatmulShape & s) {
    const int64_t tuned = tuned_rows(s);
    const size_t whole = impl_->get(s).dnnl_scratch;   // a packed B is per tile, whatever its rows
    if (whole <= kNativeScratch || s.M <= 64) return tuned;
    const int64_t tiles = int64_t((whole + kNativeScratch - 1) / kNativeScratch);
    return std::min(tuned, ((s.M + tiles - 1) / tiles + 63) / 64 * 64);
}

// Native gemms this wide (the LM head's forward and the like) take the row tile timed for their
// shape on this machine (bf16_path.h: machine_row_tile); the rest run as one call. Candidates:
// one call, then 256, 128 and 64 rows, each timed over the whole M on constant operands of the
// shape's strides, in three interleaved rounds (medians). Shapes whose operands would pass
// kTuneBytes, or one call kTuneFlops, are not timed (one call): the timing stays under a few
// seconds once per machine (gpt2-6l's head: 19.8 GFLOP a call, 16 calls).
namespace {
constexpr int64_t kTuneMinN = 16384, kTuneMinM = 128;
constexpr size_t kTuneBytes = size_t{512} << 20;
constexpr double kTuneFlops = 40e9;

size_t extent(int64_t rows, int64_t cols, int64_t s_row, int64_t s_col) {
    return size_t((rows - 1) * s_row + (cols - 1) * s_col + 1);
}

std::string shape_key(const MatmulShape & s) {
    const auto n = [](DType t) { return std::string(t == DType::bf16 ? "bf16" : "f32"); };
    return std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N) + " a" + std::to_string(s.a_sm) +
           "," + std::to_string(s.a_sk) + " b" + std::to_string(s.b_sk) + "," + std::to_string(s.b_sn) + " c" +
           std::to_string(s.ldc) + " " + n(s.ab) + ">" + n(s.c) + (s.accumulate ? " sum" : "") + (s.bias ? " bias" : "");
}
}  // namespace

int64_t DnnlGemm::tuned_rows(const MatmulShape & s) {
    if (s.N < kTuneMinN || s.M < kTuneMinM || !native(s)) return s.M;
    const size_t ea = dtype_size(s.ab), ec = dtype_size(s.c);
    const size_t bytes = extent(s.M, s.K, s.a_sm, s.a_sk) * ea + extent(s.K, s.N, s.b_sk, s.b_sn) * ea +
                         size_t(s.M * s.ldc) * ec;
    if (bytes > kTuneBytes || 2.0 * double(s.M) * double(s.N) * double(s.K) > kTuneFlops) return s.M;
    const int64_t r = machine_row_tile(shape_key(s), [&] { return measure_row_tile(s); });
    return r > 0 && r < s.M ? r : s.M;
}

int64_t DnnlGemm::measure_row_tile(const MatmulShape & s) {
    const size_t ea = dtype_size(s.ab), ec = dtype_size(s.c);
    std::vector<int64_t> rows = {s.M};
    for (const int64_t r : {256, 128, 64})
        if (r < s.M) rows.push_back(r);
    size_t ws = 0;
    for (const int64_t r : rows) ws = std::max({ws, scratch_bytes(rows_of(s, r)), scratch_bytes(rows_of(s, last_tile_rows(s.M, r)))});
    std::vector<uint16_t> a(extent(s.M, s.K, s.a_sm, s.a_sk) * ea / 2, 0x3c00), b(extent(s.K, s.N, s.b_sk, s.b_sn) * ea / 2, 0x3c00),
        bias(size_t(s.N), 0);   // bf16 1/128: the operands' values do not change the time
    std::vector<std::byte> c(size_t(s.M * s.ldc) * ec), work(ws + 64);
    auto run_all = [&](int64_t mt) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t m0 = 0; m0 < s.M; m0 += mt)
            execute(rows_of(s, std::min(mt, s.M - m0)), c.data() + size_t(m0 * s.ldc) * ec,
                    reinterpret_cast<const std::byte *>(a.data()) + size_t(m0 * s.a_sm) * ea, b.data(), bias.data(), work.data());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<std::vector<double>> secs(rows.size());
    for (const int64_t r : rows) run_all(r);   // warm-up: primitives made, pages touched
    for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < rows.size(); ++i) secs[i].push_back(run_all(rows[i]));
    std::vector<std::pair<int64_t, double>> timed;
    for (size_t i = 0; i < rows.size(); ++i) {
        std::sort(secs[i].begin(), secs[i].end());
        timed.emplace_back(i == 0 ? 0 : rows[i], secs[i][1]);
    }
    return choose_row_tile(timed);
}

bool DnnlGemm::native(const GemmDesc & d) {
    if (!bf16_operands(d)) return false;
    const MatmulShape s = matmul_shape(d);
    if (!native(s)) return false;
    const int64_t mt = native_tile_rows(s);
    return native(rows_of(s, mt)) && native(rows_of(s, last_tile_rows(d.M, mt)));
}

size_t DnnlGemm::native_workspace_bytes(const GemmDesc & d) {
    MF_ASSERT(native(d));
    const MatmulShape s = matmul_shape(d);
    const int64_t mt = native_tile_rows(s);
    return std::max(scratch_bytes(rows_of(s, mt)), scratch_bytes(rows_of(s, last_tile_rows(d.M, mt))));
}

void DnnlGemm::run_native(const GemmDesc & d, void * c, const void * a, const void * b, const void * bias,
                          void * workspace) {
    const MatmulShape s = matmul_shape(d);
    const int64_t mt = native_tile_rows(s);
    const size_t ea = dtype_size(s.ab), ec = dtype_size(s.c);
    for (int64_t m0 = 0; m0 < s.M; m0 += mt)
        run_native(rows_of(s, std::min(mt, s.M - m0)), static_cast<char *>(c) + size_t(m0 * s.ldc) * ec,
                   static_cast<const char *>(a) + size_t(m0 * s.a_sm) * ea, b, bias, workspace);
}

bool DnnlGemm::native(const MatmulShape & s) { return s.ab == DType::bf16 && impl_->has_native(s); }

void DnnlGemm::run_native(const MatmulShape & s, void * c, const void * a, const void * b, const void * bias,
                          void * scratch) {
    MF_ASSERT(native(s));
    execute(s, c, a, b, bias, scratch);
}

void DnnlGemm::run(const MatmulShape & d, float * c, const float * a, const float * b, const float * bias,
                   void * workspace) {
    MF_ASSERT(d.ab == DType::f32 && d.c == DType::f32);
    execute(d, c, a, b, bias, workspace);
}

void DnnlGemm::execute(const MatmulShape & d, void * c, const void * a, const void * b, const void * bias,
                       void * workspace) {
    Entry & e = impl_->get(d);
    MF_ASSERT(c != nullptr && a != nullptr && b != nullptr);
    MF_ASSERT(!d.bias || bias != nullptr);
    MF_ASSERT(e.scratch_bytes == 0 || workspace != nullptr);

    // The memory objects were created without buffers; point them at the caller's (inputs are
    // only read, oneDNN's handle type is just not const).
    MF_DNNL(e.a.set_data_handle(const_cast<void *>(a)));
    MF_DNNL(e.c.set_data_handle(c));
    if (d.bias) MF_DNNL(e.bias.set_data_handle(const_cast<void *>(bias)));
    if (e.dnnl_scratch > 0) MF_DNNL(e.scratch.set_data_handle(workspace));
    const size_t used = e.scratch_bytes - impl_->test_pad;
    if (impl_->test_pad > 0) std::memset(static_cast<std::byte *>(workspace) + used, 0xA5, impl_->test_pad);
    if (e.pack) {   // B into its packed copy in the workspace, then the matmul reads that
        MF_DNNL(e.b_user.set_data_handle(const_cast<void *>(b)));
        MF_DNNL(e.b.set_data_handle(static_cast<std::byte *>(workspace) + e.packed_at));
        MF_DNNL(e.pack->execute(impl_->stream, e.b_user, e.b));
    } else {
        MF_DNNL(e.b.set_data_handle(const_cast<void *>(b)));
    }

    MF_DNNL(e.prim.execute(impl_->stream, e.args));
    MF_DNNL(impl_->stream.wait());
}

// What this measures: the sustained fp32 rate of oneDNN's matmul on this machine with the
// current OpenMP thread count, for plain (non-transposed, non-accumulating) gemms of the shapes
// that dominate GPT-2-small-ish training on CPU (rows = B*T = 2048, C = 384 / 4C = 1536). Each
// shape runs once to create the primitive and warm caches, then `repeats` timed runs; the
// result is the best shape's median GFLOP/s (2*M*N*K / time). It is the achievable matmul
// ceiling model-FLOPs utilisation is quoted against, not the CPU's theoretical FMA peak.
// About 2.4 GFLOP per run: roughly 0.4 s total on 2 AVX2 cores with repeats = 5.
}  // namespace memfit::cpu
