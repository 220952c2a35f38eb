// Mixture of experts on the CPU (kernel_list.h's moe_*; the route's layout: backend/moe.h). Rows
// are read through to_f32 and computed in fp32; each op's order of sums is fixed whatever the
// thread count (deterministic). The grouped matmul itself is Graph::moe_gemm (backend gemms).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "core/error.h"

namespace memfit {

using cpu::dispatch;
using cpu::ptr;

namespace {

// Token n's router probabilities into p [E] (fp32); returns the row's log-sum-exp.
template <class S>
float softmax_row(float * p, const S * logits, int E) {
    cpu::to_f32_row(p, logits, size_t(E));
    float m = p[0];
    for (int e = 1; e < E; ++e) m = std::max(m, p[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += double(p[e] = std::exp(p[e] - m));
    const float inv = float(1.0 / sum);
    for (int e = 0; e < E; ++e) p[e] *= inv;
    return m + float(std::log(sum));
}

void check_route(Tensor route, int64_t N, const MoeDesc & d) {
    MF_ASSERT(route.dtype == DType::i32 && route.numel() == moe_route_elems(N, d));
}

}  // namespace

void CpuBackend::moe_route(Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d) {
    const int64_t N = logits.rows();
    const int E = d.experts, k = d.top_k;
    MF_ASSERT(logits.cols() == E && k >= 1 && k <= E && wts.dtype == DType::f32 && wts.numel() == N * k);
    MF_ASSERT(stats.dtype == DType::f32 && stats.numel() == moe_stats_width(d));
    check_route(route, N, d);
    int32_t * r = route.i32();
    int32_t * expert = r + (E + 1) + 2 * N * k;
    float * w = wts.f32();
    std::vector<float> lse2(static_cast<size_t>(N)), psum(size_t(E), 0.0f);
    std::vector<float> p(static_cast<size_t>(E));
    dispatch(logits.dtype, [&](auto s) {
        using S = decltype(s);
        const S * L = ptr<S>(logits);
        for (int64_t n = 0; n < N; ++n) {
            const float lse = softmax_row(p.data(), L + n * E, E);
            lse2[size_t(n)] = lse * lse;
            for (int e = 0; e < E; ++e) psum[size_t(e)] += p[size_t(e)];
            // The k largest, the lower expert first among equals.
            float chosen = 0;
            for (int j = 0; j < k; ++j) {
                int best = -1;
                for (int e = 0; e < E; ++e) {
                    bool taken = false;
                    for (int i = 0; i < j && !taken; ++i) taken = expert[n * k + i] == e;
                    if (!taken && (best < 0 || p[size_t(e)] > p[size_t(best)])) best = e;
                }
                expert[n * k + j] = best;
                w[n * k + j] = p[size_t(best)];
                chosen += p[size_t(best)];
            }
            if (d.norm_topk)
                for (int j = 0; j < k; ++j) w[n * k + j] /= chosen;
        }
    });
    // Counting sort of the choices by expert, token order kept within each.
    int32_t * offsets = r;
    int32_t * order = r + E + 1;
    int32_t * slot = order + N * k;
    std::fill(offsets, offsets + E + 1, 0);
    for (int64_t c = 0; c < N * k; ++c) ++offsets[expert[c] + 1];
    float * st = stats.f32();
    for (int e = 0; e < E; ++e) {
        st[e] = float(offsets[e + 1]);
        st[E + e] = psum[size_t(e)];
        offsets[e + 1] += offsets[e];
    }
    double z = 0;
    for (float v : lse2) z += v;
    st[2 * E] = float(z);
    st[2 * E + 1] = 0;   // dropped: moe_counts'
    std::vector<int32_t> next(offsets, offsets + E);
    for (int64_t c = 0; c < N * k; ++c) {
        const int32_t s = next[size_t(expert[c])]++;
        order[s] = int32_t(c);
        slot[c] = s;
    }
}

void CpuBackend::moe_route_bwd(Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts, Tensor stats_all,
                               const MoeDesc & d) {
    const int64_t N = logits.rows();
    const int E = d.experts, k = d.top_k;
    MF_ASSERT(dlogits.dtype == logits.dtype && dlogits.numel() == logits.numel() && logits.cols() == E);
    MF_ASSERT(dwts.dtype == DType::f32 && wts.dtype == DType::f32 && dwts.numel() == N * k);
    MF_ASSERT(stats_all.dtype == DType::f32 && stats_all.numel() == d.layers * moe_stats_width(d));
    check_route(route, N, d);
    const MoeRoute rt(route.i32(), N, d);
    // The load-balancing loss E / (LN)^2 sum_e count_e psum_e: its gradient on p[n, e].
    const double LN = double(d.layers) * double(N), LN_all = LN * double(d.stat_ranks);
    std::vector<float> aux(size_t(E), 0.0f);
    for (int e = 0; e < E; ++e) {
        double c = 0;
        for (int l = 0; l < d.layers; ++l) c += stats_all.f32()[l * moe_stats_width(d) + e];
        aux[size_t(e)] = float(double(d.aux_scale) * E * c / (LN * LN_all));
    }
    const float zf = float(2.0 * double(d.z_scale) / LN);
    dispatch(logits.dtype, [&](auto s) {
        using S = decltype(s);
        const S * L = ptr<S>(logits);
        S * D = ptr<S>(dlogits);
#pragma omp parallel
        {
            std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; ++n) {
                const float lse = softmax_row(p.data(), L + n * E, E);
                std::copy(aux.begin(), aux.end(), dp.begin());
                const float * dw = dwts.f32() + n * k, * w = wts.f32() + n * k;
                float chosen = 0, dot_w = 0;
                for (int j = 0; j < k; ++j) chosen += p[size_t(rt.expert[n * k + j])], dot_w += dw[j] * w[j];
                for (int j = 0; j < k; ++j)
                    dp[size_t(rt.expert[n * k + j])] += d.norm_topk ? (dw[j] - dot_w) / chosen : dw[j];
                float dot = 0;
                for (int e = 0; e < E; ++e) dot += p[size_t(e)] * dp[size_t(e)];
                for (int e = 0; e < E; ++e) dp[size_t(e)] = p[size_t(e)] * (dp[size_t(e)] - dot + zf * lse);
                cpu::from_f32_row(D + n * E, dp.data(), size_t(E));
            }
        }
    });
}

void CpuBackend::moe_gather(Tensor out, Tensor x, Tensor route, const MoeDesc & d) {
    const int64_t N = x.rows(), C = x.cols(), k = d.top_k, cap = d.capacity;
    MF_ASSERT(out.dtype == x.dtype && out.rows() == moe_rows(N, d) && out.cols() == C);
    check_route(route, N, d);
    const MoeRoute rt(route.i32(), N, d);
    const size_t row = size_t(C) * dtype_size(x.dtype);
    const char * src = static_cast<const char *>(x.data);
    char * dst = static_cast<char *>(out.data);
    if (cap > 0) {   // row e*cap + i: expert e's i-th routed row while it has one, else zeros
#pragma omp parallel for schedule(static)
        for (int64_t s = 0; s < d.experts * cap; ++s) {
            const int64_t e = s / cap, at = rt.offsets[e] + s % cap;
            if (at < rt.offsets[e + 1]) std::memcpy(dst + size_t(s) * row, src + size_t(rt.order[at] / k) * row, row);
            else std::memset(dst + size_t(s) * row, 0, row);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < N * k; ++s) std::memcpy(dst + size_t(s) * row, src + size_t(rt.order[s] / k) * row, row);
}

void CpuBackend::moe_counts(Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d) {
    const int E = d.experts;
    const int64_t N = wts.numel() / d.top_k;
    MF_ASSERT(d.capacity > 0 && counts.dtype == DType::i32 && counts.numel() == E && wts.dtype == DType::f32);
    MF_ASSERT(stats.dtype == DType::f32 && stats.numel() == moe_stats_width(d));
    check_route(route, N, d);
    const int32_t * off = route.i32();
    int32_t * order = route.i32() + E + 1, * slot = order + N * d.top_k;
    const float * w = wts.f32();
    double dropped = 0;
    for (int e = 0; e < E; ++e) {
        const int64_t n = off[e + 1] - off[e];
        if (d.drop_probs && n > d.capacity) {   // the most probable first (ties: the lower choice)
            std::sort(order + off[e], order + off[e + 1],
                      [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
            for (int64_t s = off[e]; s < off[e + 1]; ++s) slot[order[s]] = int32_t(s);
        }
        counts.i32()[e] = int32_t(std::min(n, d.capacity));
        dropped += double(std::max<int64_t>(0, n - d.capacity));
    }
    stats.f32()[2 * E + 1] = float(dropped);
}

// Each choice's routed row: the route's slots, or the capacity layout's rows (-1: dropped).
static const int32_t * choice_rows(const MoeRoute & rt, int64_t N, const MoeDesc & d, std::vector<int32_t> & keep) {
    if (d.capacity == 0) return rt.slot;
    keep.resize(size_t(N * d.top_k));
    for (int64_t c = 0; c < N * d.top_k; ++c) keep[size_t(c)] = int32_t(rt.capacity_row(c, d.capacity));
    return keep.data();
}

namespace {

// out[n] (+)= sum_j w[n k + j] in[slot[n k + j]] over each token's k slots (w null: 1; a slot
// of -1: dropped), fp32 sums in slot order: the dispatch's backward and the combine.
template <class G, class S>
void sum_slots(G * out, const S * in, const int32_t * slot, const float * w, int64_t N, int64_t C, int64_t k,
               bool accumulate) {
#pragma omp parallel
    {
        std::vector<float> acc(static_cast<size_t>(C)), row(static_cast<size_t>(C));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            if (accumulate) cpu::to_f32_row(acc.data(), out + n * C, size_t(C));
            else std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t j = 0; j < k; ++j) {
                if (slot[n * k + j] < 0) continue;
                cpu::to_f32_row(row.data(), in + int64_t(slot[n * k + j]) * C, size_t(C));
                const float wj = w ? w[n * k + j] : 1.0f;
                for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += wj * row[size_t(c)];
            }
            cpu::from_f32_row(out + n * C, acc.data(), size_t(C));
        }
    }
}

}  // namespace

void CpuBackend::moe_scatter(Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate) {
    const int64_t N = dx.rows(), C = dx.cols(), k = d.top_k;
    MF_ASSERT(dxs.rows() == moe_rows(N, d) && dxs.cols() == C);
    check_route(route, N, d);
    const MoeRoute rt(route.i32(), N, d);
    std::vector<int32_t> keep;
    const int32_t * rows = choice_rows(rt, N, d, keep);
    dispatch(dx.dtype, [&](auto sd) {
        dispatch(dxs.dtype, [&](auto ss) {
            sum_slots(ptr<decltype(sd)>(dx), ptr<decltype(ss)>(dxs), rows, nullptr, N, C, k, accumulate);
        });
    });
}

void CpuBackend::moe_combine(Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d) {
    const int64_t N = out.rows(), C = out.cols(), k = d.top_k;
    MF_ASSERT(y.dtype == out.dtype && y.rows() == moe_rows(N, d) &&
              y.cols() == C && wts.numel() == N * k);
    check_route(route, N, d);
    const MoeRoute rt(route.i32(), N, d);
    std::vector<int32_t> keep;
    const int32_t * rows = choice_rows(rt, N, d, keep);
    dispatch(out.dtype, [&](auto s) {
        using S = decltype(s);
        sum_slots(ptr<S>(out), ptr<S>(y), rows, wts.f32(), N, C, k, false);
    });
}

void CpuBackend::moe_weight_bwd(Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route,
                                const MoeDesc & d) {
    const int64_t k = d.top_k, choices = wts.numel(), N = choices / k, F = g.cols();
    const int64_t rows = moe_rows(N, d), C = dys.valid() ? dys.cols() : 0;
    MF_ASSERT(act.dtype == g.dtype && act.rows() == rows && g.rows() == rows && act.cols() == F);
    MF_ASSERT(!dys.valid() || dys.rows() == rows);
    MF_ASSERT(dwts.dtype == DType::f32 && dwts.numel() == choices && wts.dtype == DType::f32);
    check_route(route, N, d);
    const MoeRoute rt(route.i32(), N, d);
    std::vector<int32_t> keep;
    const int32_t * at = choice_rows(rt, N, d, keep);
    dispatch(g.dtype, [&](auto s) {
        using S = decltype(s);
        dispatch(dys.valid() ? dys.dtype : g.dtype, [&](auto sy) {
            using Y = decltype(sy);
            S * gg = ptr<S>(g);
            Y * dy = dys.valid() ? ptr<Y>(dys) : nullptr;
            const S * a = ptr<S>(act);
#pragma omp parallel
            {
                std::vector<float> x(static_cast<size_t>(F)), y(static_cast<size_t>(F)), r(static_cast<size_t>(C));
#pragma omp for schedule(static)
                for (int64_t c = 0; c < choices; ++c) {
                    const int64_t sl = at[c];
                    if (sl < 0) {   // dropped
                        dwts.f32()[c] = 0;
                        continue;
                    }
                    cpu::to_f32_row(x.data(), gg + sl * F, size_t(F));
                    cpu::to_f32_row(y.data(), a + sl * F, size_t(F));
                    float dot = 0;
                    for (int64_t i = 0; i < F; ++i) dot += x[size_t(i)] * y[size_t(i)];
                    dwts.f32()[c] = dot;
                    const float w = wts.f32()[c];
                    for (int64_t i = 0; i < F; ++i) x[size_t(i)] *= w;
                    cpu::from_f32_row(gg + sl * F, x.data(), size_t(F));
                    if (!dy) continue;
                    cpu::to_f32_row(r.data(), dy + sl * C, size_t(C));
                    for (int64_t i = 0; i < C; ++i) r[size_t(i)] *= w;
                    cpu::from_f32_row(dy + sl * C, r.data(), size_t(C));
                }
            }
        });
    });
}

void CpuBackend::sigmoid_gate_fwd(Tensor out, Tensor y, Tensor logit) {
    const int64_t N = out.rows(), C = out.cols();
    MF_ASSERT(y.dtype == out.dtype && logit.dtype == out.dtype && y.numel() == N * C && logit.numel() == N);
    dispatch(out.dtype, [&](auto sd) {
        using S = decltype(sd);
        S * o = ptr<S>(out);
        const S * in = ptr<S>(y), * z = ptr<S>(logit);
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const float g = 1.0f / (1.0f + std::exp(-to_f32(z[n])));
            for (int64_t c = 0; c < C; ++c) o[n * C + c] = from_f32<S>(to_f32(o[n * C + c]) + g * to_f32(in[n * C + c]));
        }
    });
}

void CpuBackend::sigmoid_gate_bwd(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit) {
    const int64_t N = dout.rows(), C = dout.cols();
    MF_ASSERT(dy.dtype == dout.dtype && y.dtype == dout.dtype && logit.dtype == dout.dtype && dlogit.dtype == dout.dtype);
    MF_ASSERT(dy.numel() == N * C && y.numel() == N * C && logit.numel() == N && dlogit.numel() == N);
    dispatch(dout.dtype, [&](auto sd) {
        using S = decltype(sd);
        S * d = ptr<S>(dy), * dz = ptr<S>(dlogit);
        const S * g = ptr<S>(dout), * in = ptr<S>(y), * z = ptr<S>(logit);
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const float sg = 1.0f / (1.0f + std::exp(-to_f32(z[n])));
            float dot = 0;
            for (int64_t c = 0; c < C; ++c) {
                const float go = to_f32(g[n * C + c]);
                dot += go * to_f32(in[n * C + c]);
                d[n * C + c] = from_f32<S>(sg * go);
            }
            dz[n] = from_f32<S>(sg * (1.0f - sg) * dot);
        }
    });
}

}  // namespace memfit
