#include "model/tensor_parallel.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "model/param_layout.h"

namespace memfit {

namespace {

// How a parameter is split: replicated, by vocabulary rows, or along `dim` into T pieces inside
// each of `parts` equal blocks (GPT-2's fused c_attn holds q|k|v as three column blocks).
struct Split {
    enum Kind { replicated, vocab, split } kind = replicated;
    int dim = 0, parts = 1;
};

Split split_of(const std::string & name) {
    auto ends = [&](const char * s) { return name.ends_with(s); };
    if (ends("wte.weight") || ends("embed_tokens.weight") || ends("lm_head.weight")) return {Split::vocab, 0, 1};
    // GPT-2 Conv1D weights are [in, out]: column-parallel splits dim 1, row-parallel dim 0.
    if (ends("attn.c_attn.weight")) return {Split::split, 1, 3};
    if (ends("attn.c_attn.bias")) return {Split::split, 0, 3};
    if (ends("mlp.c_fc.weight")) return {Split::split, 1, 1};
    if (ends("mlp.c_fc.bias")) return {Split::split, 0, 1};
    if (ends("attn.c_proj.weight") || ends("mlp.c_proj.weight")) return {Split::split, 0, 1};
    // LLaMA Linear weights are [out, in].
    if (ends("q_proj.weight") || ends("k_proj.weight") || ends("v_proj.weight") || ends("gate_proj.weight") ||
        ends("up_proj.weight"))
        return {Split::split, 0, 1};
    if (ends("o_proj.weight") || ends("down_proj.weight")) return {Split::split, 1, 1};
    // LoRA's adapters (PEFT's A [r, in], B [out, r]): a column-parallel projection's B by its
    // output rows, a row-parallel one's A by its input columns; the other matrix replicated.
    if (ends("c_attn.lora_B.weight")) return {Split::split, 0, 3};
    for (const char * m : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "c_fc"})
        if (ends((std::string(m) + ".lora_B.weight").c_str())) return {Split::split, 0, 1};
    for (const char * m : {"o_proj", "down_proj", "c_proj"})
        if (ends((std::string(m) + ".lora_A.weight").c_str())) return {Split::split, 1, 1};
    return {};   // norms, wpe, row-parallel biases, the replicated adapter matrices
}

}  // namespace

ModelConfig tp_local_config(const ModelConfig & cfg, int T) {
    MF_ASSERT(T >= 1);
    if (T == 1) return cfg;
    auto refuse = [&](const char * what, int n) {
        throw ConfigError(fmt::format("--tp {}: model '{}' has {} = {}, not divisible by {}; pick a --tp that divides it",
                                      T, cfg.name, what, n, T));
    };
    if (cfg.qkv_bias || cfg.qk_norm)
        throw ConfigError(fmt::format("--tp {}: model '{}' ({}) has {}, which tensor parallelism does not split yet; "
                                      "train it with data parallelism (--zero)",
                                      T, cfg.name, cfg.model_type, cfg.qkv_bias ? "q, k and v biases" : "q and k norms"));
    if (cfg.n_head % T) refuse("n_head", cfg.n_head);
    // Fewer KV heads than ranks: each rank holds the one its query heads read (replicated).
    if (cfg.kv_heads() % T && T % cfg.kv_heads())
        throw ConfigError(fmt::format("--tp {}: model '{}' has n_kv_head = {}, which neither divides by {} nor divides "
                                      "it; pick a --tp that does", T, cfg.name, cfg.kv_heads(), T));
    if (cfg.ffn_dim() % T) refuse("ffn", cfg.ffn_dim());
    MF_ASSERT(cfg.vocab_size > 0);
    ModelConfig l = cfg;
    l.head_size = cfg.head_dim();
    l.n_head = cfg.n_head / T;
    l.n_kv_head = cfg.n_kv_head > 0 ? std::max(1, cfg.n_kv_head / T) : 0;
    l.ffn = cfg.ffn_dim() / T;
    l.vocab_size = (cfg.vocab_size + T - 1) / T;
    return l;
}

std::vector<TpRun> tp_runs(const ModelConfig & cfg, int T, int r) {
    return tp_runs(make_param_layout(cfg), make_param_layout(tp_local_config(cfg, T)), cfg, T, r);
}

std::vector<TpRun> tp_runs(const ParamLayout & full, const ParamLayout & local, const ModelConfig & cfg, int T, int r) {
    MF_ASSERT(r >= 0 && r < T);
    MF_ASSERT(full.params.size() == local.params.size());
    std::vector<TpRun> runs;
    for (size_t i = 0; i < full.params.size(); ++i) {
        const ParamInfo & f = full.params[i];
        const ParamInfo & l = local.params[i];
        MF_ASSERT(f.name == l.name);
        const Split s = split_of(f.name);
        const size_t R1 = f.shape.size() > 1 ? size_t(f.shape[1]) : 1;
        if (s.kind == Split::replicated || T == 1) {
            MF_ASSERT(f.numel == l.numel);
            runs.push_back({f.offset, l.offset, f.numel});
            continue;
        }
        const bool kv = f.name.ends_with("k_proj.weight") || f.name.ends_with("v_proj.weight");
        if (kv && tp_kv_replicas(cfg, T) > 1) {   // the KV head rank r's query heads read, whole
            const size_t rows = size_t(l.shape[0]), head = size_t(r / tp_kv_replicas(cfg, T));
            runs.push_back({f.offset + head * rows * R1, l.offset, rows * R1});
            continue;
        }
        if (s.kind == Split::vocab) {
            const size_t rows = size_t(l.shape[0]), lo = size_t(r) * rows, V = size_t(f.shape[0]);
            if (lo < V) runs.push_back({f.offset + lo * R1, l.offset, (std::min(V, lo + rows) - lo) * R1});
            continue;
        }
        const size_t E = size_t(f.shape[size_t(s.dim)]), block = E / size_t(s.parts), piece = block / size_t(T);
        MF_ASSERT(block * size_t(s.parts) == E && piece * size_t(T) == block);
        MF_ASSERT(size_t(l.shape[size_t(s.dim)]) == piece * size_t(s.parts));
        if (s.dim == 0) {
            for (int p = 0; p < s.parts; ++p)
                runs.push_back({f.offset + (size_t(p) * block + size_t(r) * piece) * R1,
                                l.offset + size_t(p) * piece * R1, piece * R1});
            continue;
        }
        const size_t rows = size_t(f.shape[0]), lcols = piece * size_t(s.parts);
        for (size_t row = 0; row < rows; ++row)
            for (int p = 0; p < s.parts; ++p)
                runs.push_back({f.offset + row * R1 + size_t(p) * block + size_t(r) * piece,
                                l.offset + row * lcols + size_t(p) * piece, piece});
    }
    return runs;
}

namespace {
// The element ranges of the parameters `keep` selects, adjacent ones merged.
template <class F>
std::vector<TpRange> ranges_where(const ParamLayout & local, F keep) {
    std::vector<TpRange> out;
    for (const auto & p : local.params) {
        if (!keep(p.name)) continue;
        if (!out.empty() && out.back().b == p.offset) out.back().b += p.numel;
        else out.push_back({p.offset, p.offset + p.numel});
    }
    return out;
}
}  // namespace

std::vector<TpRange> tp_replicated(const ParamLayout & local, int T) {
    return ranges_where(local, [&](const std::string & n) { return T == 1 || split_of(n).kind == Split::replicated; });
}

int tp_kv_replicas(const ModelConfig & cfg, int T) {
    return T > cfg.kv_heads() ? T / cfg.kv_heads() : 1;
}

std::vector<TpRange> tp_kv_ranges(const ParamLayout & local) {
    return ranges_where(local, [](const std::string & n) {
        return n.ends_with("k_proj.weight") || n.ends_with("v_proj.weight");
    });
}

std::vector<TpRange> sp_partial(const ParamLayout & local) {
    return ranges_where(local, [](const std::string & n) {   // the norms
        return split_of(n).kind == Split::replicated && !n.ends_with("c_proj.bias") && !n.ends_with("wpe.weight") &&
               n.find(".lora_") == std::string::npos;
    });
}

std::vector<TpRange> tp_lora_partial(const ParamLayout & local) {
    return ranges_where(local, [](const std::string & n) {
        return n.find(".lora_") != std::string::npos && split_of(n).kind == Split::replicated;
    });
}

std::vector<float> tp_slice(const ModelConfig & cfg, int T, int r, const float * full) {
    return tp_slice(make_param_layout(cfg), make_param_layout(tp_local_config(cfg, T)), cfg, T, r, full);
}

std::vector<float> tp_slice(const ParamLayout & whole, const ParamLayout & local, const ModelConfig & cfg, int T, int r,
                            const float * full) {
    std::vector<float> out(local.total, 0.0f);
    for (const auto & run : tp_runs(whole, local, cfg, T, r)) std::copy_n(full + run.full, run.n, out.data() + run.local);
    return out;
}

void tp_assemble(const ModelConfig & cfg, int T, const std::vector<const float *> & slices, float * full) {
    tp_assemble(make_param_layout(cfg), make_param_layout(tp_local_config(cfg, T)), cfg, T, slices, full);
}

void tp_assemble(const ParamLayout & whole, const ParamLayout & local, const ModelConfig & cfg, int T,
                 const std::vector<const float *> & slices, float * full) {
    MF_ASSERT(slices.size() == size_t(T));
    for (int r = 0; r < T; ++r)
        for (const auto & run : tp_runs(whole, local, cfg, T, r))
            std::copy_n(slices[size_t(r)] + run.local, run.n, full + run.full);
}

}  // namespace memfit
