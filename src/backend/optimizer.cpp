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
     "factored second moments, a row and a column vector per matrix (Shazeer & Stern 2018); no first moment", 1,
     {kFactored("adafactor.v")}, {-1, 0}, {-1, -1}, 14, nullptr},
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

double optimizer_state_bytes(Optimizer o, int64_t width) {
    const OptimizerRow & r = optimizer_row(o);
    double b = 0;
    for (int i = 0; i < r.n_states; ++i) {
        const OptimizerState & s = r.states[size_t(i)];
        const double per = s.size == StateSize::blocks ? 1.0 / double(kMoments8Block)
                         : s.size == StateSize::factored ? 2.0 / double(std::max<int64_t>(width, 1))
                                                         : 1.0;
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
    const size_t n = size_t(param.numel()), nb = moments8_blocks(n);
    const size_t nf = factored_len(view_rows(param), view_cols(param));
    MF_ASSERT(size_t(grad.numel()) == n && h.t >= 1);
    for (int i = 0; i < kMaxOptimizerStates; ++i) {
        const Tensor & s = st.t[size_t(i)];
        if (i >= r.n_states) {
            MF_ASSERT(!s.valid());
            continue;
        }
        const OptimizerState & d = r.states[size_t(i)];
        MF_ASSERT(s.dtype == d.dtype &&
                  size_t(s.numel()) == (d.size == StateSize::blocks ? nb : d.size == StateSize::factored ? nf : n));
    }
    if (param_copy.valid())
        MF_ASSERT(size_t(param_copy.numel()) == n && (param_copy.dtype == DType::bf16 || param_copy.dtype == DType::f16));
    (void) sr_weights(param, param_copy, h);
}

}  // namespace memfit
