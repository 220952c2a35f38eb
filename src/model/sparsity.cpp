#include "model/sparsity.h"

#include <cstdio>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/error.h"

namespace memfit {

namespace {

constexpr int kMaxGroup = 64;   // a group's keep flags live on the stack

// The projection weights' names within a block (param_layout.cpp's).
constexpr const char * kTargets[] = {
    ".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight",   // GPT-2
    ".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
    ".self_attn.o_proj.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight",   // LLaMA
};

// The sum of f(first element, stride) over every group of M input-dimension weights of every
// target of `layout`: LLaMA's Linear [out, in] groups run along a row (stride 1), GPT-2's Conv1D
// [in, out] down a column. Output rows are parallel tasks; a group is one task's.
template <class F>
size_t sum_over_groups(const ModelConfig & cfg, const ParamLayout & layout, int M, F && f) {
    size_t total = 0;
    for (const ParamInfo & p : layout.params) {
        if (!sparse_target(p.name)) continue;
        MF_ASSERT(p.shape.size() == 2);
        const int64_t in = sparse_in_dim(cfg, p), out = p.shape[0] * p.shape[1] / in;
        MF_ASSERT(in % M == 0);
        const auto stride = size_t(cfg.llama() ? 1 : out);
        size_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
        for (int64_t o = 0; o < out; ++o)
            for (int64_t g = 0; g < in; g += M) {
                const int64_t first = cfg.llama() ? o * in + g : g * out + o;
                sum += f(p.offset + size_t(first), stride);
            }
        total += sum;
    }
    return total;
}

}  // namespace

std::string NmSparsity::name() const { return enabled() ? fmt::format("{}:{}", n, m) : "off"; }

NmSparsity parse_sparsity(const std::string & s) {
    NmSparsity r;
    if (s.empty() || s == "off") return r;
    int n = 0, m = 0;
    char tail = 0;
    if (std::sscanf(s.c_str(), "%d:%d%c", &n, &m, &tail) != 2)
        throw ConfigError(fmt::format("--sparsity {}: expected N:M, e.g. 2:4 (N of every M consecutive input weights "
                                      "kept)", s));
    if (n < 1 || m <= n || m > kMaxGroup)
        throw ConfigError(fmt::format("--sparsity {}: needs 1 <= N < M <= {} (N of every M weights kept), e.g. 2:4",
                                      s, kMaxGroup));
    r.n = n;
    r.m = m;
    return r;
}

bool sparse_target(const std::string & name) {
    if (param_block(name) < 0) return false;
    for (const char * t : kTargets)
        if (name.ends_with(t)) return true;
    return false;
}

int64_t sparse_in_dim(const ModelConfig & cfg, const ParamInfo & p) {
    MF_ASSERT(p.shape.size() == 2);
    return cfg.llama() ? p.shape[1] : p.shape[0];
}

std::string sparsity_refusal(const ModelConfig & cfg, const NmSparsity & s, bool lora) {
    if (!s.enabled()) return {};
    if (lora)
        return fmt::format("--sparsity {} with LoRA: the base is frozen, so there is nothing to prune and mask; train "
                           "the model sparse without LoRA, or give LoRA a 2:4-packed base (--base-weights sparse24)",
                           s.name());
    if (s.start < 0) return fmt::format("--sparsity-start {}: expected the dense updates before the prune, 0 or more", s.start);
    ModelConfig sized = cfg;   // a small preset learns its vocabulary from the data, later; the blocks do not care
    if (sized.vocab_size <= 0) sized.vocab_size = 1;
    for (const ParamInfo & p : make_param_layout(sized).params) {
        if (!sparse_target(p.name)) continue;
        const int64_t in = sparse_in_dim(cfg, p);
        if (in % s.m != 0)
            return fmt::format("--sparsity {}: {} has an input dimension of {}, not a multiple of M = {}; pick an M "
                               "that divides every projection's input (e.g. 2:4)", s.name(), p.name, in, s.m);
    }
    return {};
}

size_t prune_nm(const ModelConfig & cfg, const ParamLayout & layout, float * w, const NmSparsity & s) {
    MF_ASSERT(s.enabled() && s.m <= kMaxGroup);
    return sum_over_groups(cfg, layout, s.m, [&](size_t first, size_t stride) {
        bool keep[kMaxGroup];
        nm_keep(w + first, stride, s.n, s.m, keep);
        size_t zeroed = 0;
        for (int j = 0; j < s.m; ++j) {
            float & x = w[first + size_t(j) * stride];
            if (keep[j]) continue;
            zeroed += x != 0.0f;
            x = 0.0f;
        }
        return zeroed;
    });
}

size_t nm_violations(const ModelConfig & cfg, const ParamLayout & layout, const float * w, const NmSparsity & s) {
    MF_ASSERT(s.enabled());
    return sum_over_groups(cfg, layout, s.m, [&](size_t first, size_t stride) {
        int nonzero = 0;
        for (int j = 0; j < s.m; ++j) nonzero += w[first + size_t(j) * stride] != 0.0f;
        return size_t(nonzero > s.n);
    });
}

}  // namespace memfit
