#include "model/recompute.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

bool RecomputePlan::recomputes() const {
    return segment >= 2 || std::any_of(keep.begin(), keep.end(), [](uint32_t m) { return m != kKeepAll; });
}

namespace {

constexpr double kRopeFlops = 3.0;   // per rotated element (6 per rotated pair, as Graph counts)

RecomputePlan uniform(int n_layer, uint32_t mask, const std::string & name) {
    RecomputePlan p;
    p.name = name;
    if (mask != kKeepAll) p.keep.assign(size_t(n_layer), mask);
    return p;
}

RecomputePlan segments(int n_layer, int K, const std::string & name) {
    if (K <= 1 || n_layer <= 1) return uniform(n_layer, 0, name);
    RecomputePlan p;
    p.name = name;
    p.segment = K;
    return p;
}

}  // namespace

const std::vector<RecomputePolicy> & recompute_policies() {
    static const std::vector<RecomputePolicy> table = {
        {"none", "keep every activation", RecomputePolicy::uniform, kKeepAll, true},
        {"full", "keep each layer's input", RecomputePolicy::uniform, 0, true},
        {"every", "keep every K-th layer's input", RecomputePolicy::segments},
        {"sqrt", "segments of sqrt(layers)", RecomputePolicy::sqrt_segments},
        {"selective", "recompute norms, GELU, attention probabilities", RecomputePolicy::uniform, kKeepSelective,
         true},
        {"budget", "least recompute that fits --memory-budget", RecomputePolicy::budget},
    };
    return table;
}

std::string recompute_help() {
    std::string s;
    for (const RecomputePolicy & p : recompute_policies())
        s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", p.kind == RecomputePolicy::segments ? "every:K" : p.name,
                         p.help);
    return s;
}

std::vector<std::string> searched_recompute_policies() {
    std::vector<std::string> v;
    for (const RecomputePolicy & p : recompute_policies())
        if (p.searched) v.push_back(p.name);
    return v;
}

Recompute::Recompute(std::string_view spelled) {
    const size_t colon = spelled.find(':');
    const std::string_view head = spelled.substr(0, colon);
    for (const RecomputePolicy & p : recompute_policies()) {
        if (head != p.name) continue;
        const bool takes_k = p.kind == RecomputePolicy::segments;
        if (!takes_k && colon == std::string_view::npos) {
            policy = p.name;
            return;
        }
        const std::string_view k_text = colon == std::string_view::npos ? "" : spelled.substr(colon + 1);
        if (takes_k && !k_text.empty() && k_text.size() < 6 && std::all_of(k_text.begin(), k_text.end(), ::isdigit) &&
            std::stoi(std::string(k_text)) >= 1) {
            policy = p.name;
            k = std::stoi(std::string(k_text));
            return;
        }
    }
    std::string names;
    for (const RecomputePolicy & p : recompute_policies())
        names += fmt::format("{}{}", names.empty() ? "" : ", ",
                             p.kind == RecomputePolicy::segments ? "every:K (K >= 1)" : p.name);
    throw ConfigError(fmt::format("--recompute '{}': expected {}", spelled, names));
}

const RecomputePolicy & Recompute::info() const {
    for (const RecomputePolicy & p : recompute_policies())
        if (policy == p.name) return p;
    MF_ASSERT(false && "a Recompute outside the table");
    return recompute_policies().front();
}

uint32_t Recompute::uniform_mask(const char * who) const {
    if (info().kind == RecomputePolicy::uniform) return info().mask;
    throw ConfigError(fmt::format("--recompute {}: {} models {}", name(), who,
                                  fmt::join(searched_recompute_policies(), ", ")));
}

RecomputePlan recompute_plan(const Recompute & r, int n_layer) {
    const RecomputePolicy & p = r.info();
    switch (p.kind) {
    case RecomputePolicy::uniform: return uniform(n_layer, p.mask, r.name());
    case RecomputePolicy::segments: return segments(n_layer, r.k, r.name());
    case RecomputePolicy::sqrt_segments:
        return segments(n_layer, std::max(1, int(std::ceil(std::sqrt(double(n_layer))))), r.name());
    case RecomputePolicy::budget: break;
    }
    throw ConfigError("--recompute budget is solved against the memory budget (recompute_for_budget)");
}

KeepSet layer_keep_cost(const ModelConfig & cfg, int B, int T, bool flash, DType compute, uint32_t mask) {
    // A mixture of experts' layer (the typical one: its sparse layers): k routed rows per token.
    const int topk = cfg.moe.enabled() ? cfg.moe.top_k : 1;
    const double bt = double(B) * T, C = cfg.n_embd, Q = cfg.qkv_dim(), H = cfg.attn_dim(),
                 F = double(topk) * (cfg.moe.enabled() ? 2 * cfg.moe.ffn : cfg.fc_dim()),
                 A = double(topk) * (cfg.moe.enabled() ? cfg.moe.ffn : cfg.ffn_dim());
    const uint64_t s = dtype_size(compute), BT = uint64_t(B) * uint64_t(T), BTC = BT * uint64_t(cfg.n_embd);
    const bool llama = cfg.llama(), layer_norm = !llama || cfg.layer_norm;
    const uint64_t stats = (layer_norm ? 2 : 1) * BT * 4;   // (mean and) rstd, f32
    const double R = double(cfg.n_head + cfg.kv_heads()) * cfg.head_dim();   // elements RoPE rotates per row
    // q and k norms: their inputs (every q and k element) and a rstd per group (head, or OLMo 2's whole q and k)
    const uint64_t QKE = cfg.qk_norm ? uint64_t(cfg.n_head + cfg.kv_heads()) * uint64_t(cfg.head_dim()) : 0;
    const uint64_t QKG = cfg.qk_norm ? uint64_t(cfg.qk_norm_q_groups() + cfg.qk_norm_k_groups()) : 0;
    const uint64_t qk_norm_bytes = BT * (QKE * s + QKG * 4);
    // (+ Gemma 3's q norm weight scaled for query_pre_attn_scalar: one FLOP per element)
    const double qk_norm_flops = 4.0 * bt * double(QKE) + (cfg.qk_norm && cfg.score_scale() != 1.0f ? cfg.qk_norm_width() : 0);
    struct Unit { uint64_t bytes; double flops; };
    // Bytes kept and FLOPs to recompute, per unit (attention's FLOPs are counted once below), as
    // Graph records them: norms 8 (LayerNorm) or 4 (RMSNorm) per element, RoPE 3 per rotated
    // element (kRopeFlops), GELU 10 and SwiGLU 6 per output element.
    // post_norm (OLMo 2): ln1 and ln2 keep their norm's input, the o and down projections'
    // outputs, as many bytes, and recompute it with them; res2 recomputes ln1's output again.
    // sandwich_norm (Gemma 3): the norms on the outputs keep their inputs (the o and down
    // projections' outputs) and rstd whatever the mask (as a layer's output is kept); res2
    // recomputes the first of them with its projection. GeGLU: 10 FLOPs per element, as GELU.
    const bool post = cfg.post_norm;
    // GPT-NeoX's parallel residual: backward never reads res2 (the MLP's norm read the input).
    const double norm_flops = (layer_norm ? 8.0 : 4.0) * bt * C;
    const double act_flops = (cfg.gated() && cfg.glu == Glu::silu ? 6.0 : 10.0) * bt * A;
    const bool parallel = cfg.parallel_residual;
    const double post_attn_flops = cfg.sandwich_norm ? norm_flops : 0;
    const Unit units[int(Saved::count)] = {
        {BTC * s + stats, post ? 2.0 * bt * H * C + norm_flops : norm_flops},                // ln1
        // qkv (+ RoPE; + Qwen3's q/k norms: their inputs and rstd kept, 4 FLOPs per element)
        {uint64_t(Q) * BT * s + qk_norm_bytes, 2.0 * bt * C * Q + (llama ? kRopeFlops * bt * R : 0) + qk_norm_flops},
        {BT * uint64_t(H) * s + (flash ? uint64_t(B) * uint64_t(cfg.n_head) * uint64_t(T) * 4 : 0), 0},   // attn_out (+ lse)
        {flash ? 0 : uint64_t(B) * uint64_t(cfg.n_head) * uint64_t(T) * uint64_t(T) * s, 0},   // attn_probs
        {parallel ? 0 : BTC * s,
         parallel ? 0 : post ? norm_flops + bt * C : 2.0 * bt * H * C + post_attn_flops + bt * C},   // res2: proj + residual
        {BTC * s + stats, post ? 2.0 * bt * A * C + norm_flops : norm_flops},  // ln2
        {uint64_t(F) * BT * s, 2.0 * bt * C * F},                             // fc (gate | up)
        {uint64_t(A) * BT * s, act_flops},                                    // gelu | swiglu | geglu
    };
    KeepSet k;
    k.mask = mask;
    for (int u = 0; u < int(Saved::count); ++u) {
        if ((mask >> u) & 1u) k.bytes += units[u].bytes;
        else k.flops += units[u].flops;
    }
    const bool probs_dropped = !flash && !((mask >> int(Saved::attn_probs)) & 1u);
    if (!((mask >> int(Saved::attn_out)) & 1u) || probs_dropped)
        k.flops += 4.0 * B * (double(T) * (T + 1) / 2.0) * H;   // one attention forward
    return k;
}

RecomputePlan recompute_for_budget(const ModelConfig & cfg, int B, int T, bool flash, DType compute,
                                   uint64_t kept_budget) {
    // The solver's units are additive: the attention output and its probabilities (or lse) are
    // one unit, because one attention forward recomputes both (dropping only one of the pair
    // costs the same FLOPs and keeps more bytes, so an optimum never does).
    const uint32_t attn = (1u << int(Saved::attn_out)) | (1u << int(Saved::attn_probs));
    const std::vector<uint32_t> groups = {1u << int(Saved::ln1), 1u << int(Saved::qkv), attn, 1u << int(Saved::res2),
                                          1u << int(Saved::ln2), 1u << int(Saved::fc), 1u << int(Saved::gelu)};
    std::vector<KeepCost> units;
    for (uint32_t g : groups)
        units.push_back(KeepCost{layer_keep_cost(cfg, B, T, flash, compute, g).bytes,
                                 layer_keep_cost(cfg, B, T, flash, compute, kKeepAll & ~g).flops});
    const std::optional<KeepPlan> best =
        min_recompute(std::vector<std::vector<KeepCost>>(size_t(cfg.n_layer), units), kept_budget);
    MF_ASSERT(best.has_value());   // keeping nothing needs 0 bytes
    RecomputePlan p;
    p.name = "budget";
    for (uint32_t m : best->mask) {
        uint32_t keep = 0;
        for (size_t u = 0; u < groups.size(); ++u)
            if ((m >> u) & 1u) keep |= groups[u];
        p.keep.push_back(keep);
    }
    return p;
}

}  // namespace memfit
