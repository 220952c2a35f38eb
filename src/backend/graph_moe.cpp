// Graph's mixture-of-experts ops (backend/moe.h): routing, dispatch and combine as kernels, and
// the grouped matmul as the backend's gemms over each expert's rows.
#include <algorithm>
#include <vector>
#include <utility>

#include "backend/graph.h"
#include "backend/quant_format.h"
#include "core/error.h"

namespace memfit {

namespace {

// One tile's gemm: `rows` of the routed rows in the form `mode`, the expert matrices [M, K].
GemmDesc moe_desc(MoeGemm mode, int64_t rows, int64_t M, int64_t K, DType a, DType b, DType c) {
    GemmDesc d;
    if (mode == MoeGemm::fwd) d.M = rows, d.N = M, d.K = K, d.trans_b = true;
    else if (mode == MoeGemm::data) d.M = rows, d.N = K, d.K = M;
    else d.M = M, d.N = K, d.K = rows, d.trans_a = true, d.accumulate = true;
    d.a = a, d.b = b, d.c = c;
    return d;
}

// f(r0, n) over n rows from r0: tiles of kMoeTile, then the rest in falling powers of two.
template <class F>
void for_tiles(int64_t rows, F && f) {
    int64_t r0 = 0;
    for (; rows - r0 >= kMoeTile; r0 += kMoeTile) f(r0, kMoeTile);
    for (int64_t p = kMoeTile / 2; p >= 1; p /= 2)
        if (rows - r0 >= p) f(r0, p), r0 += p;
}

// The grouped matmul's groups when it runs: (first row, rows) of each, by expert g % d.experts.
// Dropless: the route's offsets; under a capacity, counts from row g * capacity.
std::vector<std::pair<int64_t, int64_t>> moe_spans(Backend * b, const Tensor & route, const MoeDesc & d) {
    const int64_t G = d.capacity > 0 ? int64_t(d.reps) * d.experts : d.experts;
    std::vector<int32_t> v(size_t(G + (d.capacity > 0 ? 0 : 1)));
    MF_ASSERT(route.numel() >= int64_t(v.size()));
    b->download(v.data(), route.data, v.size() * sizeof(int32_t));
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t g = 0; g < G; ++g)
        out.emplace_back(d.capacity > 0 ? g * d.capacity : v[size_t(g)],
                         d.capacity > 0 ? v[size_t(g)] : v[size_t(g + 1)] - v[size_t(g)]);
    return out;
}

// Rows [r0, r0 + n) of a resolved [*, cols] tensor (or matrix e of a stack of [n, cols] ones).
Tensor rows_of(Tensor t, int64_t r0, int64_t n, int64_t cols) {
    t.data = static_cast<char *>(t.data) + size_t(r0 * cols) * dtype_size(t.dtype);
    t.offset += size_t(r0 * cols) * dtype_size(t.dtype);
    t.ndim = 2, t.shape[0] = n, t.shape[1] = cols, t.shape[2] = t.shape[3] = 0;
    return t;
}

}  // namespace

void Graph::moe_route(Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d) {
    const double n = double(logits.numel());
    if (begin("moe_route", 5.0 * n + n * d.top_k, {route, wts, stats, logits}))
        backend_->moe_route(resolve(route), resolve(wts), resolve(stats), resolve(logits), d);
    end();
}

void Graph::moe_route_bwd(Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts, Tensor stats_all,
                          const MoeDesc & d) {
    if (begin("moe_route_bwd", 8.0 * double(logits.numel()), {dlogits, dwts, logits, route, wts, stats_all}))
        backend_->moe_route_bwd(resolve(dlogits), resolve(dwts), resolve(logits), resolve(route), resolve(wts),
                                resolve(stats_all), d);
    end();
}

void Graph::moe_gather(Tensor out, Tensor x, Tensor route, const MoeDesc & d) {
    if (begin("moe_gather", 0, {out, x, route})) backend_->moe_gather(resolve(out), resolve(x), resolve(route), d);
    end();
}

void Graph::moe_scatter(Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate) {
    if (begin("moe_scatter", double(dxs.numel()), {dx, dxs, route}))
        backend_->moe_scatter(resolve(dx), resolve(dxs), resolve(route), d, accumulate);
    end();
}

void Graph::moe_combine(Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d) {
    if (begin("moe_combine", 2.0 * double(y.numel()), {out, y, wts, route}))
        backend_->moe_combine(resolve(out), resolve(y), resolve(wts), resolve(route), d);
    end();
}

void Graph::moe_weight_bwd(Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route, const MoeDesc & d) {
    if (begin("moe_weight_bwd", 3.0 * double(g.numel()) + double(dys.numel()), {dwts, g, dys, act, wts, route}))
        backend_->moe_weight_bwd(resolve(dwts), resolve(g), resolve(dys), resolve(act), resolve(wts), resolve(route), d);
    end();
}

void Graph::moe_counts(Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d) {
    if (begin("moe_counts", 0, {counts, stats, route, wts}))
        backend_->moe_counts(resolve(counts), resolve(stats), resolve(route), resolve(wts), d);
    end();
}

void Graph::sigmoid_gate_fwd(Tensor out, Tensor y, Tensor logit) {
    if (begin("sigmoid_gate_fwd", 2.0 * double(y.numel()) + 4.0 * double(logit.numel()), {out, y, logit}))
        backend_->sigmoid_gate_fwd(resolve(out), resolve(y), resolve(logit));
    end();
}

void Graph::sigmoid_gate_bwd(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit) {
    if (begin("sigmoid_gate_bwd", 3.0 * double(y.numel()) + 6.0 * double(logit.numel()), {dy, dlogit, dout, y, logit}))
        backend_->sigmoid_gate_bwd(resolve(dy), resolve(dlogit), resolve(dout), resolve(y), resolve(logit));
    end();
}

void Graph::moe_gemm(Tensor c, Tensor a, Tensor b, Tensor route, const MoeDesc & d, MoeGemm mode, int64_t stride,
                     bool accumulate) {
    const int64_t rows = a.rows(), E = d.experts;
    // The experts' matrices [M, K]: W for fwd and data, d(W) for weight.
    const int64_t M = mode == MoeGemm::fwd ? c.cols() : a.cols();
    const int64_t K = mode == MoeGemm::fwd ? a.cols() : mode == MoeGemm::data ? c.cols() : b.cols();
    const Tensor & stack = mode == MoeGemm::weight ? c : b;
    const int64_t S = stride > 0 ? stride : M * K;
    MF_ASSERT(S >= M * K && stack.numel() == (E - 1) * S + M * K);
    MF_ASSERT((mode == MoeGemm::weight ? b.rows() : c.rows()) == rows);
    auto desc = [&](int64_t n) {
        GemmDesc g = moe_desc(mode, n, M, K, a.dtype, b.dtype, c.dtype);
        g.accumulate = g.accumulate || accumulate;
        return g;
    };
    if (recording_ && sizing_) {
        size_t ws = 0;
        for (int64_t p = 1; p <= std::min(kMoeTile, rows); p *= 2) ws = std::max(ws, sizing_->gemm_workspace(desc(p)));
        grow_workspace(ws);
    }
    if (begin("moe_gemm", 2.0 * double(rows) * double(M) * double(K), {c, a, b, route}, true)) {
        const Tensor rc = resolve(c), ra = resolve(a), rb = resolve(b);
        const auto spans = moe_spans(backend_, resolve(route), d);
        for (size_t gi = 0; gi < spans.size(); ++gi) {
            const int64_t e = int64_t(gi) % E;
            Tensor w = rows_of(mode == MoeGemm::weight ? rc : rb, 0, M, K);
            w.data = static_cast<char *>(w.data) + size_t(e * S) * dtype_size(w.dtype);
            for_tiles(spans[gi].second, [&](int64_t r0, int64_t n) {
                const int64_t s = spans[gi].first + r0;
                const GemmDesc g = desc(n);
                const Tensor ws = workspace_tensor(backend_->gemm_workspace(g));
                if (mode == MoeGemm::fwd) backend_->gemm(g, rows_of(rc, s, n, M), rows_of(ra, s, n, K), w, Tensor{}, ws);
                else if (mode == MoeGemm::data) backend_->gemm(g, rows_of(rc, s, n, K), rows_of(ra, s, n, M), w, Tensor{}, ws);
                else backend_->gemm(g, w, rows_of(ra, s, n, M), rows_of(rb, s, n, K), Tensor{}, ws);
            });
        }
    }
    end();
}

void Graph::moe_qgemm(Tensor c, Tensor a, const QWeight & w, Tensor route, const MoeDesc & d, MoeGemm mode,
                      bool accumulate) {
    MF_ASSERT(mode != MoeGemm::weight && w.valid());
    const int64_t rows = a.rows(), E = d.experts, in = w.q.in, out = w.q.out;
    MF_ASSERT(c.rows() == rows && (mode == MoeGemm::fwd ? a.cols() == in && c.cols() == out
                                                         : a.cols() == out && c.cols() == in));
    MF_ASSERT(mode == MoeGemm::data || !accumulate);
    if (recording_ && sizing_) {
        size_t ws = 0;
        for (int64_t p = 1; p <= std::min(kMoeTile, rows); p *= 2)
            ws = std::max(ws, sizing_->qgemm_workspace(w.q, p, a.dtype));
        grow_workspace(ws);
    }
    if (begin("moe_qgemm", 2.0 * double(rows) * double(in) * double(out), {c, a, w.packed, route}, true)) {
        const Tensor rc = resolve(c), ra = resolve(a), rp = resolve(w.packed);
        const auto spans = moe_spans(backend_, resolve(route), d);
        const int64_t qb = int64_t(quant_bytes(w.q));
        for (size_t gi = 0; gi < spans.size(); ++gi) {
            const int64_t e = int64_t(gi) % E;
            Tensor packed = rp;
            packed.data = static_cast<char *>(packed.data) + size_t(e * w.stride);
            packed.ndim = 1, packed.shape[0] = qb;
            for_tiles(spans[gi].second, [&](int64_t r0, int64_t n) {
                const int64_t s = spans[gi].first + r0;
                const Tensor ws = workspace_tensor(backend_->qgemm_workspace(w.q, n, a.dtype));
                if (mode == MoeGemm::fwd)
                    backend_->qgemm_fwd(w.q, rows_of(rc, s, n, out), rows_of(ra, s, n, in), packed, Tensor{}, ws);
                else
                    backend_->qgemm_bwd(w.q, rows_of(rc, s, n, in), rows_of(ra, s, n, out), packed, accumulate, ws);
            });
        }
    }
    end();
}

}  // namespace memfit
