#include "backend/optimizer.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/moments8.h"

namespace memfit {

namespace {

constexpr OptimizerState kF32(const char * n) { return {n, DType::f32, StateSize::elements}; }
constexpr OptimizerState kBf16(const char * n) { return {n, DType::bf16, StateSize::elements}; }
constexpr OptimizerState kU8(const char * n) { return {n, DType::u8, StateSize::elements}; }
constexpr OptimizerState kScales(const char * n) { return {n, DType::f32, StateSize::blocks}; }
constexpr OptimizerState kFactored(const char * n) { return {n, DType::f32, StateSize::factored}; }
constexpr OptimizerState kProjector(const char * n) { return {n, DType::f32, StateSize::projector}; }
constexpr OptimizerState kProjected(const char * n, DType dt) { return {n, dt, StateSize::projected}; }
constexpr OptimizerState kProjectedScales(const char * n) { return {n, DType::f32, StateSize::projected_blocks}; }
constexpr OptimizerState kScratch(const char * n) { return {n, DType::f32, StateSize::scratch}; }
constexpr OptimizerState kFirstMoment(const char * n) { return {n, DType::f32, StateSize::first_moment}; }

// Indexed by Optimizer.
constexpr OptimizerRow kRows[kOptimizerCount] = {
    {Optimizer::adamw, "adamw", "adamw", "two fp32 moments (torch.optim.AdamW)", 2,
     {kF32("adamw.m"), kF32("adamw.v")}, {0, 1}, {-1, -1}, 16, "AdamW"},
    {Optimizer::adamw_bf16, "adamw-bf16", "adamw", "two bf16 moments, updated in fp32", 2,
     {kBf16("adamw.m"), kBf16("adamw.v")}, {0, 1}, {-1, -1}, 16, nullptr},
    {Optimizer::sgd, "sgd", "sgd", "one fp32 momentum (torch.optim.SGD, L2 weight decay)", 1,
     {kF32("sgd.momentum")}, {0, -1}, {-1, -1}, 6, "SGD"},
    {Optimizer::adamw_8bit, "adamw-8bit", "adamw_8bit", "two 8-bit moments with f32 block scales (backend/moments8.h)",
     4, {kU8("adamw.m"), kU8("adamw.v"), kScales("adamw.m_scale"), kScales("adamw.v_scale")}, {0, 1}, {2, 3}, 20,
     nullptr},
    {Optimizer::adafactor, "adafactor", "adafactor",
     "factored second moments, a row and a column vector per matrix (Shazeer & Stern 2018); a first moment only "
     "with --adafactor-beta1", 2,
     {kFactored("adafactor.v"), kFirstMoment("adafactor.m")}, {1, 0}, {-1, -1}, 14, nullptr},
    {Optimizer::galore_adamw, "galore-adamw", "galore_adamw",
     "AdamW on each projection matrix's gradient projected to rank r (Zhao et al. 2024): two fp32 r x max(R, C) "
     "moments and an r x min(R, C) projector; other parameters plain AdamW",
     4, {kProjected("adamw.m", DType::f32), kProjected("adamw.v", DType::f32), kProjector("galore.projector"),
         kScratch("galore.scratch")}, {0, 1}, {-1, -1}, 16, nullptr},
    {Optimizer::galore_adamw_8bit, "galore-adamw-8bit", "galore_adamw_8bit",
     "galore-adamw with 8-bit projected moments and f32 block scales (backend/moments8.h)",
     6, {kProjected("adamw.m", DType::u8), kProjected("adamw.v", DType::u8), kProjectedScales("adamw.m_scale"),
         kProjectedScales("adamw.v_scale"), kProjector("galore.projector"), kScratch("galore.scratch")},
     {0, 1}, {2, 3}, 20, nullptr},
};

constexpr bool rows_in_order() {
    for (int i = 0; i < kOptimizerCount; ++i)
        if (int(kRows[i].id) != i) return false;
    return true;
}
static_assert(rows_in_order(), "kRows is indexed by Optimizer");

// Spellings beside the rows' own (bitsandbytes' name of the 8-bit one).
struct Alias { const char * text; Optimizer o; };
constexpr Alias kAliases[] = {{"adamw8bit", Optimizer::adamw_8bit}};

}  // namespace

const OptimizerRow & optimizer_row(Optimizer o) {
    MF_ASSERT(int(o) < kOptimizerCount);
    return kRows[int(o)];
}

size_t state_len(StateSize k, int64_t rows, int64_t cols, int64_t rank, bool first_moment) {
    const size_t n = size_t(rows * cols), s = size_t(std::min(rows, cols)), l = size_t(std::max(rows, cols));
    const size_t r = size_t(rank), projected = r ? r * l : n;
    switch (k) {
        case StateSize::elements: return n;
        case StateSize::blocks: return moments8_blocks(n);
        case StateSize::factored: return factored_len(rows, cols);
        case StateSize::projector: return r * s;
        case StateSize::projected: return projected;
        case StateSize::projected_blocks: return moments8_blocks(projected);
        // The scaled fp32 gradient, the projected gradient (then the update's direction) and,
        // in doubles, the shorter side's Gram matrix and its eigenvectors (cpu/kernels_galore.cpp).
        case StateSize::scratch: return r ? n + r * l + 4 * s * s : 0;
        case StateSize::first_moment: return first_moment ? n : 0;
    }
    MF_UNREACHABLE();
}

bool has_state(Optimizer o, StateSize k) {
    const OptimizerRow & r = optimizer_row(o);
    return std::any_of(r.states.begin(), r.states.begin() + r.n_states, [&](const OptimizerState & s) { return s.size == k; });
}

size_t matrix_state_bytes(Optimizer o, int64_t rows, int64_t cols, int64_t rank, bool first_moment) {
    const OptimizerRow & r = optimizer_row(o);
    size_t b = 0;
    for (int i = 0; i < r.n_states; ++i) {
        const OptimizerState & s = r.states[size_t(i)];
        if (s.size != StateSize::scratch) b += state_len(s.size, rows, cols, rank, first_moment) * dtype_size(s.dtype);
    }
    return b;
}

double optimizer_state_bytes(Optimizer o, int64_t width, int64_t rank, bool first_moment) {
    const OptimizerRow & r = optimizer_row(o);
    const int64_t w = std::max<int64_t>(width, 1), gr = galore_rank(true, w, w, rank);
    double b = 0;
    for (int i = 0; i < r.n_states; ++i) {
        const OptimizerState & s = r.states[size_t(i)];
        if (s.size == StateSize::scratch) continue;   // transient: not a state the model keeps
        const double per = double(state_len(s.size, w, w, gr, first_moment)) / double(w * w);
        b += per * double(dtype_size(s.dtype));
    }
    return b;
}

std::string optimizer_choices() {
    std::string s;
    for (const auto & r : kRows) s += fmt::format("{}{}", s.empty() ? "" : ", ", r.name);
    return s;
}

Optimizer parse_optimizer(std::string_view o) {
    // bitsandbytes' paged optimizers (HF's optim="paged_adamw_8bit", ...) move states at the
    // driver's will, which a planned step cannot (docs/memory-techniques.md, "Optimizer offload").
    if (o.starts_with("paged"))
        throw ConfigError(fmt::format("--optimizer '{}': paged optimizers are not offered (their pages move at run time, "
                                      "outside the plan); use --optimizer adamw-8bit or adamw with --offload optimizer "
                                      "[--offload-fraction F]",
                                      o));
    for (const auto & r : kRows)
        if (o == r.name) return r.id;
    for (const auto & a : kAliases)
        if (o == a.text) return a.o;
    std::string all = optimizer_choices();
    for (const auto & a : kAliases) all += fmt::format(", {}", a.text);
    throw ConfigError(fmt::format("--optimizer '{}': expected one of {}", o, all));
}

const char * optimizer_name(Optimizer o) { return optimizer_row(o).name; }

void check_optimizer_view(Optimizer o, const Tensor & param, const Tensor & grad, const OptimizerStates & st,
                          const Tensor & param_copy, const OptimHyper & h) {
    const OptimizerRow & r = optimizer_row(o);
    const size_t n = size_t(param.numel());
    MF_ASSERT(size_t(grad.numel()) == n && h.t >= 1);
    MF_ASSERT(h.galore_rank == 0 || (has_state(o, StateSize::projector) && param.ndim == 2 && h.galore_update_gap >= 1));
    for (int i = 0; i < kMaxOptimizerStates; ++i) {
        const Tensor & s = st.t[size_t(i)];
        if (i >= r.n_states) {
            MF_ASSERT(!s.valid());
            continue;
        }
        const OptimizerState & d = r.states[size_t(i)];
        const size_t len = state_len(d.size, view_rows(param), view_cols(param), h.galore_rank, h.adafactor_beta1 > 0);
        if (!s.valid() && len == 0) continue;   // an optional state the run does not keep
        MF_ASSERT(s.dtype == d.dtype && size_t(s.numel()) == len);
    }
    if (param_copy.valid())
        MF_ASSERT(size_t(param_copy.numel()) == n && (param_copy.dtype == DType::bf16 || param_copy.dtype == DType::f16));
    (void) sr_weights(param, param_copy, h);
}

}  // namespace memfit
