// The CPU's optimizer step: the element loops of the per-element rows (backend/update_rules.h's
// rules; the 8-bit one is in kernels_adamw8.cpp) and the table CpuBackend::optimizer_step
// dispatches through, one row per backend/optimizer.h row.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/moments8.h"
#include "backend/stochastic_round.h"
#include "core/error.h"

namespace memfit {

namespace cpu {

// Stores the updated weight p of element i: W float as it is, bf16_t rounded stochastically;
// the compute copy P (when not float) rounded to nearest even.
template <class W, class P>
inline void store_weight(W * param, P * copy, size_t i, float p, const UpdateConsts & c) {
    if constexpr (std::is_same_v<W, float>) param[i] = p;
    else param[i] = bf16_t{sr_bf16_bits(p, c.sr_seed, c.sr_at + i)};
    if constexpr (!std::is_same_v<P, float>) copy[i] = from_f32<P>(p);
}

// keep_zeros is a compile-time case in both loops: its selects kept them scalar under AVX2 (4x
// slower).
template <class W, class G, class P, class M>
void adamw_update(W * param, [[maybe_unused]] P * param_copy, const G * grad, M * m, M * v, size_t n,
                  const UpdateConsts & cref) {
    const UpdateConsts c = cref;   // a local: read through a reference, GCC may keep the loop scalar
    auto run = [&](auto keep) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; ++i) {
            const float w = to_f32(param[i]);
            float mi = to_f32(m[i]), vi = to_f32(v[i]);
            const float p = adamw_rule(c, w, to_f32(grad[i]) * c.scale, mi, vi, decltype(keep)::value && w == 0.0f);
            if constexpr (std::is_same_v<M, float>) m[i] = mi, v[i] = vi;
            else m[i] = from_f32<M>(mi), v[i] = from_f32<M>(vi);
            store_weight(param, param_copy, i, p, c);
        }
    };
    if (c.keep_zeros) run(std::true_type{});
    else run(std::false_type{});
}

template <class W, class G, class P>
void sgd_update(W * param, [[maybe_unused]] P * param_copy, const G * grad, float * buf, size_t n,
                const UpdateConsts & cref) {
    const UpdateConsts c = cref;
    auto run = [&](auto keep) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; ++i) {
            const float w = to_f32(param[i]);
            const float p = sgd_rule(c, w, to_f32(grad[i]) * c.scale, buf[i], decltype(keep)::value && w == 0.0f);
            store_weight(param, param_copy, i, p, c);
        }
    };
    if (c.keep_zeros) run(std::true_type{});
    else run(std::false_type{});
}

// Adafactor over an R x C view (update_rules.h): the statistics' and u's sums accumulated in
// double, each in a fixed order (per row, or per column over the rows in order), so a step is
// the same on any thread count. The factors r_i and c_j formed once; a vector's (or a one-row
// matrix's) as one row of n columns with r = 1.
template <class W, class G, class P>
void adafactor_update(W * param, [[maybe_unused]] P * param_copy, const G * grad, float * stat, float * m, int64_t R,
                      int64_t C, const UpdateConsts & cref) {
    const UpdateConsts c = cref;
    const bool factored = R >= 2 && C >= 2;
    auto sq = [&](int64_t k) {
        const float g = to_f32(grad[k]) * c.scale;
        return double(g * g + c.eps1);
    };
    std::vector<float> rf, cf;   // r_i, c_j
    if (factored) {
        float * row = stat, * col = stat + R;
        std::vector<double> colsum(size_t(C), 0.0);
#pragma omp parallel for schedule(static)
        for (int64_t j0 = 0; j0 < C; j0 += 64)   // column blocks, each over every row in order
            for (int64_t i = 0; i < R; ++i)
                for (int64_t j = j0; j < std::min(C, j0 + 64); ++j) colsum[size_t(j)] += sq(i * C + j);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < R; ++i) {
            double s = 0;
            for (int64_t j = 0; j < C; ++j) s += sq(i * C + j);
            row[i] = adafactor_stat(c, row[i], s / double(C));
        }
        for (int64_t j = 0; j < C; ++j) col[j] = adafactor_stat(c, col[j], colsum[size_t(j)] / double(R));
        double rs = 0;
        for (int64_t i = 0; i < R; ++i) rs += row[i];
        const float row_mean = float(rs / double(R));
        rf.resize(size_t(R)), cf.resize(size_t(C));
        for (int64_t i = 0; i < R; ++i) rf[size_t(i)] = adafactor_row_factor(row[i], row_mean);
        for (int64_t j = 0; j < C; ++j) cf[size_t(j)] = adafactor_col_factor(col[j]);
    } else {
        const int64_t n = R * C;
        R = 1, C = n;
        rf.assign(1, 1.0f), cf.resize(size_t(n));
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < n; ++k) {
            stat[k] = adafactor_stat(c, stat[k], sq(k));
            cf[size_t(k)] = adafactor_col_factor(stat[k]);
        }
    }
    const float * cfp = cf.data();
    std::vector<double> part(size_t(R), 0.0);   // per row: u's sum of squares
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R; ++i) {
        const G * gi = grad + i * C;
        const float r = rf[size_t(i)], scale = c.scale;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < C; ++j) {
            const double u = adafactor_u(to_f32(gi[j]) * scale, r, cfp[j]);
            s += u * u;
        }
        part[size_t(i)] = s;
    }
    double u_sq = 0;
    for (double s : part) u_sq += s;
    const float inv = adafactor_inv_denom(c, u_sq, double(R) * double(C));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R; ++i) {
        const float r = rf[size_t(i)];
        auto run = [&](auto keep, auto first) {
#pragma omp simd
            for (int64_t j = 0; j < C; ++j) {
                const size_t k = size_t(i * C + j);
                const float w = to_f32(param[k]);
                const bool frozen = decltype(keep)::value && w == 0.0f;   // N:M sparsity: a kept zero stays
                const float u = adafactor_u(to_f32(grad[k]) * c.scale, r, cfp[j]);
                float p;
                if constexpr (decltype(first)::value) {
                    p = adafactor_rule_m(c, w, u, inv, m[k]);
                    if (frozen) m[k] = 0.0f;
                } else {
                    p = adafactor_rule(c, w, u, inv);
                }
                store_weight(param, param_copy, k, frozen ? w : p, c);
            }
        };
        if (c.keep_zeros && m) run(std::true_type{}, std::true_type{});
        else if (c.keep_zeros) run(std::true_type{}, std::false_type{});
        else if (m) run(std::false_type{}, std::true_type{});
        else run(std::false_type{}, std::false_type{});
    }
}

// fp32 weights, gradients and moments, no copy: the kernel tests' reference case.
template void adamw_update<float, float, float, float>(float *, float *, const float *, float *, float *, size_t,
                                                       const UpdateConsts &);

}  // namespace cpu

namespace {

using cpu::dispatch;
using cpu::ptr;

// f(W * param, G * grad, P * copy) for the weights' (float, or bf16-sr's bf16_t), the gradients'
// and the compute copy's storage (P = float and a null copy when there is none).
template <class F>
void with_storage(const Tensor & param, const Tensor & grad, const Tensor & copy, const OptimHyper & h, F && f) {
    const bool sr = sr_weights(param, copy, h);
    dispatch(grad.dtype, [&](auto gz) {
        using G = decltype(gz);
        if (sr) return f(ptr<bf16_t>(param), ptr<G>(grad), static_cast<float *>(nullptr));
        dispatch(copy.valid() ? copy.dtype : DType::f32, [&](auto pz) {
            using P = decltype(pz);
            P * cp = nullptr;
            if constexpr (!std::is_same_v<P, float>) cp = ptr<P>(copy);
            f(param.f32(), ptr<G>(grad), cp);
        });
    });
}

using StepFn = void (*)(Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy, const OptimHyper & h,
                        const UpdateConsts & c);

void adamw_step(Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy, const OptimHyper & h,
                const UpdateConsts & c) {
    const size_t n = size_t(param.numel());
    with_storage(param, grad, copy, h, [&](auto * w, auto * g, auto * cp) {
        if (st.t[0].dtype == DType::bf16) cpu::adamw_update(w, cp, g, ptr<bf16_t>(st.t[0]), ptr<bf16_t>(st.t[1]), n, c);
        else cpu::adamw_update(w, cp, g, st.t[0].f32(), st.t[1].f32(), n, c);
    });
}

void sgd_step(Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy, const OptimHyper & h,
              const UpdateConsts & c) {
    with_storage(param, grad, copy, h, [&](auto * w, auto * g, auto * cp) {
        cpu::sgd_update(w, cp, g, st.t[0].f32(), size_t(param.numel()), c);
    });
}

void adamw8_step(Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy, const OptimHyper & h,
                 const UpdateConsts & c) {
    with_storage(param, grad, copy, h, [&](auto * w, auto * g, auto * cp) {
        using G = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
        using P = std::remove_pointer_t<decltype(cp)>;
        using W = std::remove_pointer_t<decltype(w)>;
        cpu::adamw_update_8bit<G, P, W>(w, cp, g, static_cast<uint8_t *>(st.t[0].data),
                                        static_cast<uint8_t *>(st.t[1].data), st.t[2].f32(), st.t[3].f32(),
                                        size_t(param.numel()), c);
    });
}

void adafactor_step(Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy, const OptimHyper & h,
                    const UpdateConsts & c) {
    with_storage(param, grad, copy, h, [&](auto * w, auto * g, auto * cp) {
        float * m = st.t[1].valid() && st.t[1].numel() > 0 ? st.t[1].f32() : nullptr;
        MF_ASSERT((m != nullptr) == (h.adafactor_beta1 > 0));
        cpu::adafactor_update(w, cp, g, st.t[0].f32(), m, view_rows(param), view_cols(param), c);
    });
}

// GaLore (Zhao et al. 2024, Algorithm 1 with AdamW's decoupled weight decay): every update_gap
// steps the projector is refreshed from the scaled gradient; the gradient is projected to rank
// r, AdamW's moments updated there and their direction N = m^ / (sqrt(v^) + eps) formed, then
// p = p (1 - lr wd) - lr alpha (N projected back). N comes from the rows' own rules run on the
// projected elements with a weight of 0, lr -1 and no decay (adamw_rule then returns N itself).
// The scratch: the shorter side's Gram matrix and eigenvectors (doubles), the scaled fp32
// gradient (then, for the 8-bit moments, N), the projected gradient (fp32 moments: then N).
void galore_step(Tensor param, Tensor grad, const OptimizerStates & st, Tensor copy, const OptimHyper & h,
                 const UpdateConsts & c) {
    const bool eight = st.t[0].dtype == DType::u8;
    const int np = eight ? 4 : 2;   // the projector and the scratch follow the moments (and scales)
    if (h.galore_rank == 0) {       // not projected: the row's AdamW on the whole view
        OptimizerStates plain;
        std::copy_n(st.t.begin(), np, plain.t.begin());
        return eight ? adamw8_step(param, grad, plain, copy, h, c) : adamw_step(param, grad, plain, copy, h, c);
    }
    MF_ASSERT(!c.keep_zeros);   // run/compat.cpp refuses N:M sparsity with GaLore
    const int64_t R = view_rows(param), C = view_cols(param), r = h.galore_rank, s = std::min(R, C);
    const int64_t n = R * C, nl = r * std::max(R, C);
    float * proj = st.t[size_t(np)].f32();
    double * work = static_cast<double *>(st.t[size_t(np) + 1].data);
    float * gs = reinterpret_cast<float *>(work + 2 * s * s), * low = gs + n;
    with_storage(param, grad, copy, h, [&](auto * w, auto * g, auto * cp) {
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; ++i) gs[i] = to_f32(g[i]) * c.scale;
        if ((h.t - 1) % h.galore_update_gap == 0) cpu::galore_projector(proj, gs, R, C, r, work);
        cpu::galore_project(low, proj, gs, R, C, r);
        UpdateConsts in = c;   // the moments' step in the projected space: returns N
        in.lr = -1.0f, in.decay = 1.0f, in.scale = 1.0f, in.keep_zeros = false;
        const float * dir = low;
        if (eight) {
            std::fill(gs, gs + nl, 0.0f);
            cpu::adamw_update_8bit<float, float, float>(gs, nullptr, low, static_cast<uint8_t *>(st.t[0].data),
                                                        static_cast<uint8_t *>(st.t[1].data), st.t[2].f32(),
                                                        st.t[3].f32(), size_t(nl), in);
            dir = gs;
        } else {
            float * m = st.t[0].f32(), * v = st.t[1].f32();
#pragma omp parallel for simd schedule(static)
            for (int64_t i = 0; i < nl; ++i) low[i] = adamw_rule(in, 0.0f, low[i], m[i], v[i], false);
        }
        const float step = c.lr * h.galore_scale;
#pragma omp parallel
        {
            std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
            for (int64_t i = 0; i < R; ++i) {
                cpu::galore_project_back_row(row.data(), proj, dir, i, R, C, r);
                for (int64_t j = 0; j < C; ++j) {
                    const size_t k = size_t(i * C + j);
                    cpu::store_weight(w, cp, k, to_f32(w[k]) * c.decay - step * row[size_t(j)], c);
                }
            }
        }
    });
}

// One row per backend/optimizer.h row, in its order.
constexpr struct { Optimizer id; StepFn fn; } kSteps[kOptimizerCount] = {
    {Optimizer::adamw, adamw_step},
    {Optimizer::adamw_bf16, adamw_step},
    {Optimizer::sgd, sgd_step},
    {Optimizer::adamw_8bit, adamw8_step},
    {Optimizer::adafactor, adafactor_step},
    {Optimizer::galore_adamw, galore_step},
    {Optimizer::galore_adamw_8bit, galore_step},
};

}  // namespace

void CpuBackend::optimizer_step(Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states, Tensor norm_sq,
                                Tensor param_copy, const OptimHyper & h) {
    check_optimizer_view(o, param, grad, states, param_copy, h);
    MF_ASSERT(kSteps[int(o)].id == o);
    const float nsq = norm_sq.valid() ? norm_sq.f32()[0] : 0.0f;
    if (skips_update(h, nsq) || param.numel() == 0) return;
    kSteps[int(o)].fn(param, grad, states, param_copy, h, update_consts(h, update_scale(h, nsq)));
}

}  // namespace memfit
