// Mixed-precision gemm through fp32 tiles (see gemm_mixed.h).
//
// C is cut into tiles of mt x nt; K is never cut, so every output element is one fp32 reduction
// of the full K, done by oneDNN's fp32 matmul. Per tile: the operands stored in bf16/f16 are
// converted into fp32 tiles in the workspace (A: mt rows x K, B: K x nt columns, in A's and B's
// own layouts, transposed or not), operands stored in f32 are used in place through strided
// memory descriptors, and C is either written in place (f32 C, with oneDNN's sum post-op for
// accumulate) or computed into an fp32 tile and rounded into C once: C = round(C + tile) when
// accumulating. Bias (B's dtype) is converted per column tile.
//
// Plan. One dimension's tiles form the outer loop: with M outermost each A tile is converted
// once, and the B tiles are converted again for every M tile, unless N is a single tile (then
// B is converted once, up front); symmetrically with N outermost. Conversions are cheap per
// element but not free (about the cost of 50-100 flops each), so the plan minimises the
// elements converted plus a per-call cost (oneDNN call overhead, smaller tiles), under a budget
// for the fp32 tiles (GemmTileLimits, 32 MiB by default) and with tiles of at least min_tile
// (256) rows and columns where the matrix is that large, since oneDNN's fp32 kernels lose speed
// on smaller ones. It tries both loop orders, inner tiles of 1, 2, 4, 8, 16 x min_tile and the
// whole inner dimension, and for each the largest outer tile within the budget. When not even
// min_tile x min_tile tiles fit (very long K: e.g. the LM head's dX with K = vocabulary), the
// plan with the smallest workspace wins. Tile sizes are balanced (equal tiles, multiples of 16).
#include "backend/cpu/gemm_mixed.h"

#include <algorithm>
#include <unordered_map>

#include "backend/cpu/convert.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

constexpr size_t kAlign = 64;
constexpr double kCallCost = 32768;  // elements converted that one more oneDNN call is worth

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t count(int64_t dim, int64_t t) { return (dim + t - 1) / t; }

// The tile size for tiles of at most t over dim: as equal as possible, rounded up to a multiple
// of 16 when that stays within t.
int64_t balanced(int64_t dim, int64_t t) {
    t = std::clamp<int64_t>(t, 1, dim);
    const int64_t n = count(dim, t);
    const int64_t even = count(dim, n);
    const int64_t r16 = (even + 15) / 16 * 16;
    return r16 <= t ? std::min(r16, dim) : even;
}

struct GemmDescHash {
    size_t operator()(const GemmDesc & d) const noexcept {
        uint64_t h = 0xcbf29ce484222325ull;
        auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
        mix(uint64_t(d.M));
        mix(uint64_t(d.N));
        mix(uint64_t(d.K));
        mix(uint64_t(d.trans_a) | uint64_t(d.trans_b) << 1 | uint64_t(d.accumulate) << 2 | uint64_t(d.bias) << 3 |
            uint64_t(d.a) << 8 | uint64_t(d.b) << 16 | uint64_t(d.c) << 24);
        return size_t(h);
    }
};

// Workspace bytes of the fp32 tiles (without the scratchpad).
size_t tile_bytes(const GemmDesc & d, const GemmTilePlan & p, int64_t mt, int64_t nt) {
    const size_t f = sizeof(float);
    size_t s = 0;
    if (p.conv_a) s += align_up(f * size_t(mt) * size_t(d.K));
    if (p.conv_b) s += align_up(f * size_t(d.K) * size_t(nt));
    if (p.conv_bias) s += align_up(f * size_t(nt));
    if (p.conv_c) s += align_up(f * size_t(mt) * size_t(nt));
    return s;
}

// The oneDNN matmul of one mc x ncc tile.
MatmulShape tile_shape(const GemmDesc & d, const GemmTilePlan & p, int64_t mc, int64_t ncc) {
    MatmulShape s;
    s.M = mc, s.N = ncc, s.K = d.K;
    // A: [M,K] rows (or a converted [mc,K] tile): (K, 1); A^T stored [K,M]: (1, M), or (1, mc)
    // for a converted [K,mc] tile. B likewise: [K,N]: (N or ncc, 1); B^T stored [N,K]: (1, K).
    s.a_sm = d.trans_a ? 1 : d.K;
    s.a_sk = d.trans_a ? (p.conv_a ? mc : d.M) : 1;
    s.b_sk = d.trans_b ? 1 : (p.conv_b ? ncc : d.N);
    s.b_sn = d.trans_b ? d.K : 1;
    s.ldc = p.conv_c ? ncc : d.N;
    s.accumulate = d.accumulate && !p.conv_c;
    s.bias = d.bias;
    return s;
}

GemmTilePlan make_plan(const GemmDesc & d, const GemmTileLimits & lim, DnnlGemm & gemm) {
    MF_ASSERT(d.M > 0 && d.N > 0 && d.K > 0);
    MF_ASSERT(!(d.bias && d.accumulate) && d.lda == 0);
    GemmTilePlan p;
    p.conv_a = d.a != DType::f32;
    p.conv_b = d.b != DType::f32;
    p.conv_bias = d.bias && p.conv_b;
    p.conv_c = d.c != DType::f32;
    MF_ASSERT(p.conv_a || p.conv_b || p.conv_c);

    struct Best {
        bool set = false, fits = false;
        double cost = 0;
        size_t bytes = 0;
        bool m_outer = true;
        int64_t mt = 0, nt = 0;
    };
    Best best;
    for (const bool m_outer : {true, false}) {
        const int64_t Do = m_outer ? d.M : d.N, Di = m_outer ? d.N : d.M;
        for (const int64_t mult : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{16}, int64_t{0}}) {
            const int64_t ti = balanced(Di, mult == 0 ? Di : mult * lim.min_tile);
            auto bytes_for = [&](int64_t to) {
                return m_outer ? tile_bytes(d, p, to, ti) : tile_bytes(d, p, ti, to);
            };
            // The largest outer tile within the budget (bytes grow with it), at least min_tile.
            int64_t lo = std::min(lim.min_tile, Do), hi = Do;
            if (bytes_for(lo) <= lim.budget_bytes) {
                while (lo < hi) {
                    const int64_t mid = lo + (hi - lo + 1) / 2;
                    if (bytes_for(mid) <= lim.budget_bytes) lo = mid; else hi = mid - 1;
                }
            }
            const int64_t to = balanced(Do, lo);
            const int64_t mt = m_outer ? to : ti, nt = m_outer ? ti : to;
            const int64_t mT = count(d.M, mt), nT = count(d.N, nt);
            const double conv_a = p.conv_a ? double(d.M) * double(d.K) * double(m_outer || mT == 1 ? 1 : nT) : 0.0;
            const double conv_b = p.conv_b ? double(d.K) * double(d.N) * double(!m_outer || nT == 1 ? 1 : mT) : 0.0;
            const double cost = conv_a + conv_b + kCallCost * double(mT * nT);
            const size_t bytes = tile_bytes(d, p, mt, nt);
            const bool fits = bytes <= lim.budget_bytes;
            // Within the budget: the cheapest (then the smallest); else the smallest (then the
            // cheapest).
            const bool cheaper = cost < best.cost || (cost == best.cost && bytes < best.bytes);
            const bool smaller = bytes < best.bytes || (bytes == best.bytes && cost < best.cost);
            const bool better = !best.set || (fits != best.fits ? fits : fits ? cheaper : smaller);
            if (better) best = {true, fits, cost, bytes, m_outer, mt, nt};
        }
    }
    p.m_outer = best.m_outer;
    p.mt = best.mt;
    p.nt = best.nt;
    p.m_tiles = count(d.M, p.mt);
    p.n_tiles = count(d.N, p.nt);

    // Workspace layout, and the largest scratchpad of the (up to four) tile shapes.
    size_t off = 0;
    const size_t f = sizeof(float);
    if (p.conv_a) { p.off_a = off; off += align_up(f * size_t(p.mt) * size_t(d.K)); }
    if (p.conv_b) { p.off_b = off; off += align_up(f * size_t(d.K) * size_t(p.nt)); }
    if (p.conv_bias) { p.off_bias = off; off += align_up(f * size_t(p.nt)); }
    if (p.conv_c) { p.off_c = off; off += align_up(f * size_t(p.mt) * size_t(p.nt)); }
    p.off_scratch = off;
    for (const int64_t mc : {p.mt, d.M - (p.m_tiles - 1) * p.mt})
        for (const int64_t ncc : {p.nt, d.N - (p.n_tiles - 1) * p.nt})
            p.scratch_bytes = std::max(p.scratch_bytes, gemm.scratch_bytes(tile_shape(d, p, mc, ncc)));
    p.bytes = off + p.scratch_bytes;
    return p;
}

}  // namespace

struct MixedGemm::Impl {
    DnnlGemm & gemm;
    GemmTileLimits limits;
    std::unordered_map<GemmDesc, GemmTilePlan, GemmDescHash> plans;
};

MixedGemm::MixedGemm(DnnlGemm & gemm, GemmTileLimits limits) : impl_(new Impl{gemm, limits, {}}) {}
MixedGemm::~MixedGemm() = default;

const GemmTilePlan & MixedGemm::plan(const GemmDesc & d) {
    auto it = impl_->plans.find(d);
    if (it == impl_->plans.end()) it = impl_->plans.emplace(d, make_plan(d, impl_->limits, impl_->gemm)).first;
    return it->second;
}

void MixedGemm::run(const GemmDesc & d, void * c, const void * a, const void * b, const void * bias,
                    void * workspace) {
    const GemmTilePlan & p = plan(d);
    MF_ASSERT(c != nullptr && a != nullptr && b != nullptr);
    MF_ASSERT(!d.bias || bias != nullptr);
    MF_ASSERT(p.bytes == 0 || workspace != nullptr);

    char * ws = static_cast<char *>(workspace);
    float * wa = p.conv_a ? reinterpret_cast<float *>(ws + p.off_a) : nullptr;
    float * wb = p.conv_b ? reinterpret_cast<float *>(ws + p.off_b) : nullptr;
    float * wbias = p.conv_bias ? reinterpret_cast<float *>(ws + p.off_bias) : nullptr;
    float * wc = p.conv_c ? reinterpret_cast<float *>(ws + p.off_c) : nullptr;
    void * scratch = p.scratch_bytes ? ws + p.off_scratch : nullptr;
    const char * ca = static_cast<const char *>(a);
    const char * cb = static_cast<const char *>(b);
    const char * cbias = static_cast<const char *>(bias);
    char * cc = static_cast<char *>(c);
    const size_t ea = dtype_size(d.a), eb = dtype_size(d.b), ec = dtype_size(d.c);

    auto load_a = [&](int64_t m0, int64_t mc) {
        if (d.trans_a)  // A^T stored [K,M]: K rows of mc columns
            load_rows(wa, ca + size_t(m0) * ea, d.a, size_t(d.M), d.K, mc);
        else
            load_rows(wa, ca + size_t(m0 * d.K) * ea, d.a, size_t(d.K), mc, d.K);
    };
    auto load_b = [&](int64_t n0, int64_t ncc) {
        if (d.trans_b)  // B^T stored [N,K]: ncc rows of K
            load_rows(wb, cb + size_t(n0 * d.K) * eb, d.b, size_t(d.K), ncc, d.K);
        else
            load_rows(wb, cb + size_t(n0) * eb, d.b, size_t(d.N), d.K, ncc);
        if (p.conv_bias) load_rows(wbias, cbias + size_t(n0) * eb, d.b, size_t(ncc), 1, ncc);
    };
    auto tile = [&](int64_t m0, int64_t mc, int64_t n0, int64_t ncc) {
        const float * ap = p.conv_a ? wa : static_cast<const float *>(a) + (d.trans_a ? m0 : m0 * d.K);
        const float * bp = p.conv_b ? wb : static_cast<const float *>(b) + (d.trans_b ? n0 * d.K : n0);
        const float * biasp = !d.bias ? nullptr : p.conv_bias ? wbias : static_cast<const float *>(bias) + n0;
        float * cp = p.conv_c ? wc : static_cast<float *>(c) + m0 * d.N + n0;
        impl_->gemm.run(tile_shape(d, p, mc, ncc), cp, ap, bp, biasp, scratch);
        if (p.conv_c) store_rows(cc + size_t(m0 * d.N + n0) * ec, d.c, size_t(d.N), wc, mc, ncc, d.accumulate);
    };

    for (int64_t oi = 0; oi < (p.m_outer ? p.m_tiles : p.n_tiles); ++oi) {
        for (int64_t ii = 0; ii < (p.m_outer ? p.n_tiles : p.m_tiles); ++ii) {
            const int64_t mi = p.m_outer ? oi : ii, ni = p.m_outer ? ii : oi;
            const int64_t m0 = mi * p.mt, mc = std::min(p.mt, d.M - m0);
            const int64_t n0 = ni * p.nt, ncc = std::min(p.nt, d.N - n0);
            // A tile: converted when it changes (each outer step with M outer; else only when
            // there are several M tiles, or the first time). B tile likewise.
            const bool new_a = p.m_outer ? ii == 0 : (p.m_tiles > 1 || oi == 0);
            const bool new_b = p.m_outer ? (p.n_tiles > 1 || oi == 0) : ii == 0;
            if (p.conv_a && new_a) load_a(m0, mc);
            if (p.conv_b && new_b) load_b(n0, ncc);
            tile(m0, mc, n0, ncc);
        }
    }
}

}  // namespace memfit::cpu
