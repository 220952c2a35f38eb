#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "model/expert_parallel.h"
#include "model/param_layout.h"
#include "model/recompute.h"
#include "model/sparsity.h"
#include "plan/fit.h"
#include "plan/distill_plan.h"
#include "plan/lora_plan.h"
#include "run/compat.h"
#include "train/engine.h"

namespace memfit {

namespace {

// The interleaved schedule's most sends in flight on any stage (model/pipeline.h), remembered per
// (P, m, V): the search asks for the same few many times, from several threads. An accumulation
// the stages do not divide is refused elsewhere; it is charged every send of the step here.
int most_pending_sends(int P, int m, int V) {
    if (m % P != 0) return (2 * V - 1) * m;
    static std::mutex mu;
    static std::map<std::tuple<int, int, int>, int> known;
    {
        const std::lock_guard<std::mutex> lock(mu);
        if (const auto it = known.find({P, m, V}); it != known.end()) return it->second;
    }
    int most = 0;
    for (int s = 0; s < P; ++s) most = std::max(most, interleaved_pending_sends(P, s, m, V));
    const std::lock_guard<std::mutex> lock(mu);
    known[{P, m, V}] = most;
    return most;
}

}  // namespace

namespace {

constexpr uint64_t kGemmWorkspace = 32ull << 20;   // cuBLASLt's recommended workspace on Hopper

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }


}  // namespace

RunConfig candidate_run(const Candidate & c, int seq) {
    RunConfig r = c;
    r.seq = seq;
    r.lora.rank = c.lora_plan ? c.lora_plan->opts.rank : 0;
    if (c.lora_plan) {   // what unsupported() reads of the adapters the plan models
        r.lora.variant = c.lora_plan->opts.dora ? "dora" : "lora";
        if (c.lora_plan->quantized()) r.lora.base_weights = base_weights_name(c.lora_plan->opts.base);
        r.lora.gptq_bits = c.lora_plan->opts.gptq_bits, r.lora.gptq_group = c.lora_plan->opts.gptq_group;
    }
    r.distill = c.distill_plan ? c.distill_plan->config : DistillConfig{};
    return r;
}

ParamSplit param_split(const ModelConfig & cfg) {
    ModelConfig none = cfg, one = cfg;
    none.n_layer = 0;
    one.n_layer = 1;
    ParamSplit s;
    s.per_layer = one.num_params() - none.num_params();
    if (cfg.moe.enabled()) s.experts = int64_t(cfg.moe.experts) * 3 * cfg.n_embd * cfg.moe.ffn;
    const int64_t C = cfg.n_embd, V = cfg.vocab_size;
    // Before the layers: token (and GPT-2's position) embeddings; after: final norm and head.
    s.embed = V * C + (cfg.llama() ? 0 : int64_t(cfg.max_seq) * C);
    s.head = none.num_params() - s.embed;
    s.width = C;
    // GaLore's projected matrices (a mixture of experts' thousands are not: run/compat.cpp).
    if (cfg.moe.enabled()) return s;
    for (const auto & p : make_param_layout(one).params)
        if (p.shape.size() == 2 && sparse_target(p.name)) s.targets.push_back({p.shape[0], p.shape[1]});
    return s;
}

CategoryBytes model_state_bytes(int64_t params, const Candidate & c, int64_t width, int ranks) {
    const uint64_t P = uint64_t(params), s = dtype_size(c.compute), dp = uint64_t(ranks > 0 ? ranks : c.layout.data_ranks());
    const int zero = c.layout.zero;
    const uint64_t master = c.compute == DType::f32 || c.master_weights == MasterWeights::bf16_sr ? 0 : 4;
    // Per parameter; 8-bit AdamW's block scales make it fractional (rounded up over the tensor).
    const uint64_t opt_all = uint64_t(std::ceil(double(P) * optimizer_state_bytes(c.optimizer, width, c.galore_rank, c.adafactor_beta1 > 0)));
    const uint64_t grad = c.grad_accum > 1 ? 4 : s;
    CategoryBytes b;
    b[Category::parameters] = zero >= 3 ? ceil_div(P * s, dp) : P * s;
    b[Category::master_weights] = zero >= 1 ? ceil_div(P * master, dp) : P * master;
    b[Category::optimizer_states] = zero >= 1 ? ceil_div(opt_all, dp) : opt_all;
    b[Category::gradients] = zero >= 2 ? ceil_div(P * grad, dp) : P * grad;
    return b;
}

CategoryBytes lora_state_bytes(uint64_t base, int64_t adapters, const Candidate & c) {
    // The adapters' states as a full run's, then the frozen base joins the parameters.
    CategoryBytes b = model_state_bytes(adapters, c);
    b[Category::parameters] += c.layout.zero >= 3 ? ceil_div(base, uint64_t(c.layout.data_ranks())) : base;
    return b;
}

void check_lora_layout(const Candidate & c) {
    if (!c.lora_plan || !c.lora_plan->quantized()) return;
    if (c.layout.offload == Offload::optimizer_params)
        throw ConfigError(fmt::format("--base-weights {} with --offload optimizer+params: offloading a packed base is "
                                      "not modelled; use --offload optimizer or none",
                                      base_weights_name(c.lora_plan->opts.base)));
}

namespace {

// The busiest pipeline stage: its stored blocks (shared ones once: --share-layers) and its
// parameters per device: the first stage (embedding) or the last (head; a tied head keeps a
// copy).
struct Stage {
    int64_t layers, head, params;
};

Stage busiest_stage(const ModelConfig & cfg, const Layout & L, const ParamSplit & ps) {
    Stage st;
    st.layers = (cfg.stored_layers() + L.pp - 1) / L.pp;
    st.head = ps.head + (cfg.tied_head && L.pp > 1 ? int64_t(cfg.vocab_size) * cfg.n_embd : 0);
    const int64_t first = st.layers * ps.per_layer + ps.embed + (L.pp == 1 ? st.head : 0);
    const int64_t last = st.layers * ps.per_layer + st.head;
    st.params = ((L.pp == 1 ? first : std::max(first, last)) + L.tp - 1) / L.tp;
    return st;
}

// GaLore's states on a stage: each layer's projection matrices at the rank galore_rank() gives
// them (the step's own rule), every other parameter's plain moments (ZeRO 0: run/compat.cpp).
uint64_t galore_states(const Candidate & c, const ParamSplit & ps, const Stage & st) {
    uint64_t matrices = 0, in_matrices = 0;
    for (const auto & [R, C] : ps.targets) {
        matrices += matrix_state_bytes(c.optimizer, R, C, galore_rank(true, R, C, c.galore_rank));
        in_matrices += uint64_t(R * C);
    }
    const uint64_t layers = uint64_t(st.layers), whole = layers * in_matrices;
    const uint64_t rest = uint64_t(st.params) > whole ? uint64_t(st.params) - whole : 0;   // --tp cuts: refused
    return layers * matrices + uint64_t(std::ceil(double(rest) * optimizer_state_bytes(c.optimizer, ps.width, 0)));
}

// Model states (parameters, master weights, moments, gradients) on the device, and what
// --offload moves to the host.
DeviceMemory model_states(const Candidate & c, const ParamSplit & ps, const Stage & st) {
    const Layout & L = c.layout;
    const LoraPlan * lp = c.lora_plan.get();
    const uint64_t s = dtype_size(c.compute);
    const int64_t adapters =   // lm_head's adapter beside the last layer (run/compat.cpp: one stage, no --tp)
        lp ? (st.layers * lp->adapters_per_layer + lp->head_adapters + lp->embed_adapters + L.tp - 1) / L.tp : 0;
    // Expert parallelism (model/expert_parallel.h): a rank holds 1 / ep of the experts and the whole
    // rest, one flat buffer that ZeRO shards over the ranks holding the same experts (data ranks /
    // ep), as the engine does.
    const int ep = std::max(1, L.ep);
    const int64_t experts = ep > 1 && !lp ? st.layers * ps.experts / L.tp : 0;
    const int64_t held = st.params - experts + experts / ep;
    const int holders = std::max(1, L.data_ranks() / ep);
    DeviceMemory m;
    if (lp) {
        // The same stages in bytes: a packed base makes a layer cheaper than its parameter count.
        const uint64_t layer_base = lp->layer_base_bytes(ps.per_layer, s);
        const uint64_t first_b = uint64_t(st.layers) * layer_base + uint64_t(ps.embed) * s + (L.pp == 1 ? uint64_t(st.head) * s : 0);
        const uint64_t last_b = uint64_t(st.layers) * layer_base + uint64_t(st.head) * s;
        const uint64_t base = ceil_div(L.pp == 1 ? first_b : std::max(first_b, last_b), uint64_t(L.tp));
        m.device = lora_state_bytes(base, adapters, c);
        m.frozen = L.zero >= 3 ? ceil_div(base, uint64_t(L.data_ranks())) : base;
    } else if (ep > 1) {
        m.device = model_state_bytes(held, c, ps.width, holders);
    } else {
        m.device = model_state_bytes(st.params, c, ps.width);
        if (has_state(c.optimizer, StateSize::projector)) m.device[Category::optimizer_states] = galore_states(c, ps, st);
    }
    if (c.optimizer_in_backward) {   // train/step.h: the rest's buckets and one layer's (two while one is summed)
        const int64_t layer = lp ? lp->adapters_per_layer : ps.per_layer;
        const int64_t rest = lp ? lp->head_adapters + lp->embed_adapters : ps.embed + ps.head;
        const uint64_t live = uint64_t(rest + layer * (L.data_ranks() > 1 ? 2 : 1)) * s;
        // ZeRO >= 2: and this rank's parts of them, reduce-scattered (no gradient shard persists).
        m.device[Category::gradients] = L.zero >= 2 ? live + ceil_div(live, uint64_t(L.data_ranks()))
                                                    : std::min(m.device[Category::gradients], live);
    }
    if (L.offload == Offload::none) return m;
    // memfit's engine (train/step.h): master weights and moments in host memory, staged through
    // the device three units at a time (2^18 elements, more past a shard of 64 Mi:
    // offload_unit_for); the gradients stay.
    // --offload-fraction F: that share of both (whole units of the shard, here to the byte).
    // optimizer+params (ZeRO 3): all of both and the weights' shard, which each unit's update
    // writes back through its staging (s bytes an element).
    const bool weights = L.offload == Offload::optimizer_params;
    const double per = optimizer_state_bytes(c.optimizer, ps.width, c.galore_rank, c.adafactor_beta1 > 0) +
                       (c.compute == DType::f32 || c.master_weights == MasterWeights::bf16_sr ? 0.0 : 4.0) +
                       (weights ? double(s) : 0.0);
    const double F = weights ? 1.0 : c.offload_fraction;
    const uint64_t trainable = lp ? uint64_t(adapters) : uint64_t(held);
    const size_t unit = offload_unit_for(L.zero >= 1 ? ceil_div(trainable, uint64_t(holders)) : trainable);
    const uint64_t mw = m.device[Category::master_weights], os = m.device[Category::optimizer_states];
    m.host = uint64_t(std::ceil(F * double(mw + os)));
    m.device[Category::master_weights] = mw - uint64_t(std::ceil(F * double(mw)));
    if (weights) {
        m.host += m.device[Category::parameters];
        m.device[Category::parameters] = 0;
    }
    m.device[Category::optimizer_states] =
        os - uint64_t(std::ceil(F * double(os))) + std::min(m.host, uint64_t(std::ceil(3.0 * double(unit) * per)));
    return m;
}

// Communication buffers: gathered weights (ZeRO-3, parameter offload), gradient buckets and a
// pipeline's boundary activations (BTC: one micro-batch's [b, T, C] in the compute dtype).
uint64_t communication_bytes(const Candidate & c, const ParamSplit & ps, uint64_t BTC) {
    const Layout & L = c.layout;
    const LoraPlan * lp = c.lora_plan.get();
    const uint64_t s = dtype_size(c.compute), tp = uint64_t(L.tp);
    // ZeRO-3 and parameter offload keep two layers' weights gathered on the device.
    // (Expert parallelism: a rank gathers its own experts only.)
    const int64_t per_layer = ps.per_layer - ps.experts + ps.experts / L.ep;
    const uint64_t layer_weights = lp ? lp->layer_base_bytes(ps.per_layer, s) + uint64_t(lp->adapters_per_layer) * s
                                      : uint64_t(per_layer) * s;
    const uint64_t gathered = ceil_div(layer_weights, tp) * 2;
    uint64_t comm = 0;
    if (L.zero >= 3) comm += gathered;
    // Parameter offload: two layers' parts of the shard staged (read ahead of their gathers).
    if (L.offload == Offload::optimizer_params) comm += ceil_div(gathered, uint64_t(L.data_ranks()));
    // Two gradient buckets: one moving, one filling (LoRA: at most the adapters' gradients).
    const uint64_t bucket = lp ? std::min(uint64_t(kBucketBytes),
                                          uint64_t(lp->adapters) * (c.grad_accum > 1 && L.zero < 2 ? 4 : s))
                               : uint64_t(kBucketBytes);
    if (L.data_ranks() > 1) comm += 2 * bucket;
    if (L.pp > 1) comm += 2 * BTC / (L.sp ? tp : 1);
    return comm;
}

// One layer's kept activations of one micro-batch (split: divided by tensor parallelism;
// replicated: divided only with sequence parallelism).
uint64_t kept_per_layer(const ModelConfig & cfg, const Candidate & c, int seq, uint64_t BTC) {
    const LoraPlan * lp = c.lora_plan.get();
    const int b = c.micro_batch;
    const uint64_t s = dtype_size(c.compute), rows = uint64_t(b) * uint64_t(seq), tp = uint64_t(c.layout.tp);
    const uint32_t mask = c.recompute.uniform_mask("the planner");
    // TiledMLP: the MLP's intermediates are never kept.
    const bool tiled = c.mlp_chunk > 0 && uint64_t(c.mlp_chunk) < rows;
    auto unit = [&](Saved u) -> uint64_t {
        if (tiled && (u == Saved::fc || u == Saved::gelu)) return 0;
        const uint64_t bytes = layer_keep_cost(cfg, b, seq, c.flash(), c.compute, 1u << int(u)).bytes;
        if (!lp) return bytes;
        // LoRA: a frozen projection's input is kept only for its adapter's dA.
        const uint64_t stats = (cfg.llama() && !cfg.layer_norm ? 1 : 2) * rows * 4;
        switch (u) {
            case Saved::ln1: return lp->adapts(Proj::qkv) ? bytes : stats;
            case Saved::ln2: return lp->adapts(Proj::fc) ? bytes : stats;
            case Saved::gelu: return lp->adapts(Proj::down) ? bytes : 0;
            case Saved::attn_out: return c.flash() || lp->adapts(Proj::o) ? bytes : 0;
            default: return bytes;
        }
    };
    uint64_t split = 0, replicated = BTC;   // the layer's input is always kept
    if (lp) replicated += rows * uint64_t(lp->u_cols) * s;   // the adapters' u, kept under every policy
    if (lp && lp->opts.dora) replicated += uint64_t(lp->site_cols) * (rows * s + 4);   // DoRA's z and norms
    // Gemma 3: the output norms' inputs (the o and down projections' outputs) and rstd, every policy
    if (cfg.sandwich_norm) replicated += 2 * (BTC + rows * 4);
    // A mixture of experts' routing, kept under every policy (model/transformer_moe.cpp): the
    // router's logits, the route (i32) and the k weights (f32).
    if (cfg.moe.enabled()) {
        const uint64_t E = uint64_t(cfg.moe.experts), k = uint64_t(cfg.moe.top_k);
        replicated += rows * E * s + (E + 1 + 3 * rows * k) * 4 + rows * k * 4;
        // Qwen2-MoE's shared expert: its gate|up, SwiGLU, output and gate logit, every policy.
        replicated += rows * (3 * uint64_t(cfg.moe.shared_ffn) + (cfg.moe.shared_ffn > 0 ? uint64_t(cfg.n_embd) + 1 : 0)) * s;
    }
    for (int u = 0; u < int(Saved::count); ++u) {
        if (!((mask >> u) & 1u)) continue;
        const Saved su = Saved(u);
        const bool by_heads = su == Saved::qkv || su == Saved::attn_out || su == Saved::attn_probs ||
                              su == Saved::fc || su == Saved::gelu;
        (by_heads ? split : replicated) += unit(su);
    }
    return split / tp + (c.layout.sp ? replicated / tp : replicated);
}

// The activations category apart from the logits: the kept units of the micro-batches in flight
// and what every stage holds beside them; at(lg) adds a logits chunk of lg bytes where the head is.
struct Activations {
    uint64_t kept = 0, last_kept = 0, common = 0;
    uint64_t host = 0;   // --offload activations: the offloaded layers' kept units, in the store
    bool pipeline = false;
    uint64_t at(uint64_t lg) const {
        return !pipeline ? kept + common + lg : std::max(kept + common, last_kept + common + lg);
    }
};

Activations activations(const ModelConfig & cfg, const Candidate & c, int seq, int64_t layers, uint64_t BTC) {
    const Layout & L = c.layout;
    const LoraPlan * lp = c.lora_plan.get();
    const uint64_t s = dtype_size(c.compute), rows = uint64_t(c.micro_batch) * uint64_t(seq), tp = uint64_t(L.tp);
    const uint64_t per_layer = kept_per_layer(cfg, c, seq, BTC);
    double in_flight = 1;
    if (L.pp > 1) {
        const double mb = double(c.grad_accum), p = double(L.pp);
        in_flight = L.schedule == PipeSchedule::gpipe ? mb
                  : L.schedule == PipeSchedule::one_f_one_b ? std::min(mb, p)
                  : std::min(mb, p) * (1.0 + (p - 1.0) / (p * double(L.virtual_stages)));
    }
    Activations a;
    a.pipeline = L.pp > 1;
    a.kept = uint64_t(std::ceil(double(per_layer * uint64_t(layers)) * in_flight));
    // A pipeline's last stage: one micro-batch's kept units (and the logits).
    a.last_kept = per_layer * uint64_t(layers);
    if (L.offload_acts && L.pp == 1) {
        // model/activation_offload.h: the offloaded layers' units wait in the store; on the device
        // two layers' are in flight (the one written or read, and the one computing or read ahead).
        const int64_t n = c.offload_activation_layers > 0 ? std::min<int64_t>(layers, c.offload_activation_layers) : layers;
        a.host = per_layer * uint64_t(n);
        a.kept = a.kept - a.host + per_layer * uint64_t(std::min<int64_t>(n, 2));
    }
    // One layer's backward working set (its activation gradients) and what it recomputes.
    const uint32_t mask = c.recompute.uniform_mask("the planner");
    const uint64_t M = c.mlp_chunk > 0 && uint64_t(c.mlp_chunk) < rows ? uint64_t(c.mlp_chunk) : 0;
    const uint32_t mlp_units = (1u << int(Saved::fc)) | (1u << int(Saved::gelu));
    const uint32_t rc_mask = M > 0 ? mask | mlp_units : mask;   // tiled: the MLP is recomputed per chunk
    const uint64_t all = layer_keep_cost(cfg, c.micro_batch, seq, c.flash(), c.compute, kKeepAll).bytes;
    const uint64_t rc = all - layer_keep_cost(cfg, c.micro_batch, seq, c.flash(), c.compute, rc_mask).bytes;
    // Tiled: one chunk's recomputed intermediates and their gradients, 2 M (F + A).
    const uint64_t mlp_width = cfg.moe.enabled() ? 3 * uint64_t(cfg.moe.ffn) : uint64_t(cfg.fc_dim() + cfg.ffn_dim());
    const uint64_t mlp_work = M > 0 ? 2 * M * mlp_width * s / tp : rows * mlp_width * s / tp;
    // A mixture of experts: the experts' k rows per token, and one of backward's dispatched output
    // gradient, input and input gradient ([N k, C] each: the arena reuses their bytes in turn),
    // the weights' and logits' gradients.
    const uint64_t k = cfg.moe.enabled() ? uint64_t(cfg.moe.top_k) : 1;
    const uint64_t moe_work = !cfg.moe.enabled() ? 0
                                                 : (k - 1) * mlp_work + k * BTC + rows * (uint64_t(cfg.moe.experts) * s + k * 4);
    const uint64_t grads = mlp_work + moe_work + rows * uint64_t(cfg.qkv_dim()) * s / tp + 3 * BTC;
    // LoRA's backward transients: dd, du, and with dropout the regenerated dropped input and its
    // gradient (the forward's dropped copy is gone by then).
    const uint64_t lora_grads = !lp ? 0
                              : rows * uint64_t(lp->max_site_cols + lp->opts.rank) * s +
                                    (lp->opts.dropout > 0 ? 2 * rows * uint64_t(lp->max_site_in) * s : 0) +
                                    rows * uint64_t(lp->dora_out_cols) * s;   // DoRA's scaled output gradient
    // The embedding adapter's u, kept from the first layer's forward to the end of backward.
    const uint64_t embed_u = lp && lp->embed_adapters > 0 ? rows * uint64_t(lp->opts.rank) * s : 0;
    // The interleaved schedule's sends in flight (model/pipeline.h: each completes once the peer
    // has answered it), at most over the stages, one boundary activation or gradient each.
    const uint64_t sent = L.pp > 1 && L.schedule == PipeSchedule::interleaved
                              ? uint64_t(most_pending_sends(L.pp, c.grad_accum, L.virtual_stages)) * (BTC / (L.sp ? tp : 1))
                              : 0;
    // The step's token ids, targets and losses (4 bytes each per token): a pipeline's program
    // holds all m micro-batches' (a huge m is memory too).
    const uint64_t batch = 12 * rows * uint64_t(L.pp > 1 ? c.grad_accum : 1);
    a.common = grads + lora_grads + rc / tp + 2 * BTC + sent + batch + embed_u;
    // Expert parallelism: the routed rows sent and received all-to-all ([N k, C] each way), the
    // received ones up to the capacity factor's share.
    if (L.ep > 1 && cfg.moe.enabled())
        a.common += uint64_t(double(k * BTC) * (1.0 + ep_capacity_factor(c.moe_capacity_factor)));
    return a;
}

}  // namespace

DeviceMemory predict_memory(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq) {
    const Layout & L = c.layout;
    MF_ASSERT(L.dp >= 1 && L.tp >= 1 && L.pp >= 1 && c.micro_batch >= 1 && c.grad_accum >= 1);
    check_lora_layout(c);
    const LoraPlan * lp = c.lora_plan.get();
    const ParamSplit ps = param_split(cfg);
    const Stage st = busiest_stage(cfg, L, ps);
    const uint64_t s = dtype_size(c.compute), tp = uint64_t(L.tp);
    // Context parallel: a rank's activations are those of its T / cp positions of each sequence;
    // one layer's attention at a time holds the whole sequence's k | v, gathered (forward, or in
    // backward twice with their gradients), with this rank's share.
    const uint64_t whole_kv = uint64_t(c.micro_batch) * uint64_t(seq) * 2 * uint64_t(cfg.kv_heads() * cfg.head_dim()) * s;
    if (L.cp > 1) seq /= L.cp;
    const uint64_t rows = uint64_t(c.micro_batch) * uint64_t(seq);
    const uint64_t BTC = rows * uint64_t(cfg.n_embd) * s;   // one micro-batch of one layer's [b, T, C]

    DeviceMemory m = model_states(c, ps, st);
    Activations acts = activations(cfg, c, seq, st.layers, BTC);
    if (L.cp > 1 && c.cp_comm_type == "p2p") {   // the ring: two blocks, fp32 output (forward), dq and three dk | dv
        const uint64_t block = whole_kv / uint64_t(L.cp), block32 = block / s * 4;
        acts.common += 2 * block + 3 * block32 + rows * uint64_t(cfg.n_head * cfg.head_dim()) * 4;
    } else if (L.cp > 1) {
        acts.common += 4 * whole_kv + 3 * whole_kv / uint64_t(L.cp);
    }
    // One loss chunk's fp32 logits (the whole micro-batch's unchunked), as the engine declares;
    // lm_head's adapter: u and its gradient, and the scaled addition (forward) or its gradient
    // (backward) beside them.
    const uint64_t logit_rows = c.loss_chunk > 0 ? std::min<uint64_t>(uint64_t(c.loss_chunk), rows) : rows;
    const uint64_t head_adapter = lp && lp->head_adapters > 0
                                      ? logit_rows * (uint64_t(cfg.vocab_size) + 2 * uint64_t(lp->opts.rank)) * s : 0;
    const uint64_t logits = logit_rows * uint64_t(cfg.vocab_size) * 4 / tp + head_adapter;
    m.device[Category::activations] = acts.at(logits);
    m.host += acts.host;
    uint64_t teacher_logits = 0;   // a distillation teacher's logits chunk, beside the student's
    if (const DistillPlan * dp = c.distill_plan.get()) {
        // The teacher's weights; and live with the student's kept activations through the loss,
        // its final norm's output, its logits chunk and the loss's two floats per row.
        const ModelConfig & t = *dp->opts.teacher;
        m.device[Category::teacher] = dp->weight_bytes(c.compute);
        teacher_logits = logit_rows * uint64_t(t.vocab_size) * 4;
        m.device[Category::activations] += rows * uint64_t(t.n_embd) * s + teacher_logits + 2 * logit_rows * 4;
    }
    if (c.pref.dpo()) {   // preference tuning (model/preference.h)
        // Each row's gradient factor per token and its two log-probabilities; a reference copy's
        // weights (its forward's activations are gone before the policy's forward starts).
        const PreferenceOptions po = preference_options(c);
        m.device[Category::activations] += rows * 4 + 2 * uint64_t(c.micro_batch) * 4;
        m.device[Category::reference] = reference_bytes(cfg, po, c.compute);
    }
    m.device[Category::communication] = communication_bytes(c, ps, BTC);
    // A packed base on a GPU: one tile of the largest projection dequantized (cuda_qgemm_tile_rows:
    // about 4 Mi elements), in the compute dtype.
    const uint64_t tile = std::min<uint64_t>(ceil_div(uint64_t(lp ? lp->largest_projection : 0), tp), 1u << 22);
    const uint64_t dequant = lp && lp->quantized() ? tile * s : 0;
    m.device[Category::workspace] = hw.name == "cpu" ? 0 : kGemmWorkspace + dequant;
    // --loss-chunk auto: the engine's rule (plan/fit.h) on these numbers.
    if (c.loss_chunk < 0) {
        const uint64_t chunk_rows = uint64_t(auto_chunk_rows(int64_t(rows)));
        const uint64_t chunked = chunk_rows * uint64_t(cfg.vocab_size) * 4 / tp;
        const uint64_t both = logits + teacher_logits;
        if (both >= kAutoChunkMinBytes && 4 * both >= m.device.total() && chunked < logits) {
            m.device[Category::activations] -= acts.at(logits) - acts.at(chunked);
            if (teacher_logits) {   // the teacher's chunk and the loss's per-row floats shrink alike
                m.device[Category::activations] -= teacher_logits - teacher_logits / rows * chunk_rows;
                m.device[Category::activations] -= 2 * (rows - chunk_rows) * 4;
            }
        }
    }
    m.device[Category::runtime] = hw.memory - hw.usable;
    m.loaded = L.pp == 1 ? (L.devices() == 1 ? "the only device" : "every device alike")
                         : "the busier of the first and last pipeline stages";
    return m;
}

uint64_t activation_offload_bytes(const ModelConfig & cfg, const Candidate & c, int seq) {
    if (!c.layout.offload_acts || c.layout.pp > 1) return 0;
    seq /= std::max(1, c.layout.cp);
    const uint64_t BTC = uint64_t(c.micro_batch) * uint64_t(seq) * uint64_t(cfg.n_embd) * dtype_size(c.compute);
    return activations(cfg, c, seq, cfg.n_layer, BTC).host;
}

uint64_t megatron_layer_activation_bytes(const ModelConfig & cfg, int b, int s, int t, bool sp,
                                         const std::string & policy) {
    const uint64_t sbh = uint64_t(b) * uint64_t(s) * uint64_t(cfg.n_embd);
    const uint64_t as2b = uint64_t(cfg.n_head) * uint64_t(s) * uint64_t(s) * uint64_t(b);
    if (policy == "full") return 2 * sbh;   // the layer's input only
    if (policy != "none" && policy != "attention")
        throw ConfigError(fmt::format("Megatron accounting knows none, attention and full, not '{}'", policy));
    // memfit's units in 16 bits without the f32 norm statistics, naive attention.
    auto unit = [&](Saved u) {
        const uint64_t with = layer_keep_cost(cfg, b, s, false, DType::bf16, 1u << int(u)).bytes;
        const bool norm = u == Saved::ln1 || u == Saved::ln2;
        return norm ? with - 4 * uint64_t(b) * uint64_t(s) * (cfg.llama() && !cfg.layer_norm ? 1 : 2) : with;
    };
    // Split by tensor parallelism: q|k|v, the attention output, fc and its activation, and the
    // attention core (probabilities, their dropout mask and output).
    uint64_t split = unit(Saved::qkv) + unit(Saved::attn_out) + unit(Saved::fc) + unit(Saved::gelu);
    if (policy == "none") split += unit(Saved::attn_probs) + as2b + 2 * as2b;
    // Not split without sequence parallelism: the two norms' inputs and outputs and the two
    // residual dropouts' 1-byte masks.
    const uint64_t rest = 2 * sbh + unit(Saved::ln1) + unit(Saved::res2) + unit(Saved::ln2) + 2 * sbh;
    const uint64_t T = uint64_t(t);
    return split / T + (sp ? rest / T : rest);
}

namespace {

// The engine's options of a candidate's stage programs as the trainer resolves them: stage 0's,
// and the last stage's --loss-chunk auto (the trainer resolves it per stage; only the last, which
// holds the head, can chunk, and the choice does not depend on the micro-batches: plan/fit.h).
struct StageOptions {
    EngineOptions eo;
    int last_chunk = 0;
};

StageOptions stage_options(const ModelConfig & cfg, const Candidate & c, int seq, const Backend & sizing) {
    const RunConfig run = candidate_run(c, seq);
    StageOptions so;
    so.eo = engine_options(run, cfg, sizing, /*with_eval=*/false);
    if (c.lora_plan) so.eo.lora = c.lora_plan->opts;
    if (c.distill_plan) so.eo.distill = c.distill_plan->opts;
    so.last_chunk = so.eo.loss_chunk;
    if (c.layout.pp > 1 && run.loss_chunk < 0) {
        EngineOptions last = so.eo;
        last.pp_rank = c.layout.pp - 1;
        so.last_chunk = auto_loss_chunk(cfg, sizing, last);
    }
    return so;
}

// Rank 0's program of one stage with m micro-batches (per step and data-parallel rank), recorded:
// its peak live bytes, and (stage 0) the bytes of the frozen LoRA base. Every data and tensor
// rank's buffers have the same sizes (equal, padded shards and slices); the stages differ.
CategoryBytes record_stage(const ModelConfig & cfg, const Candidate & c, const Backend & sizing,
                           const StageOptions & so, int stage, int m, uint64_t * frozen) {
    EngineOptions eo = so.eo;
    eo.grad_accum = m;
    eo.pp_rank = stage;
    eo.loss_chunk = stage == c.layout.pp - 1 ? so.last_chunk : so.eo.loss_chunk;
    const StepPlans plans(cfg, sizing, eo, /*place=*/false);
    if (frozen && c.lora_plan)
        for (const auto & buf : plans.train->program().buffers())
            if (buf.name == "parameters" || buf.name == "parameters.quantized") *frozen += buf.bytes;
    return plans.peak_live();
}

}  // namespace

PipelineSamples pipeline_samples(const Layout & L, int stage) {
    // Where a stage's peak live bytes become affine in m (tests/plan/test_plan_memory.cpp checks
    // the extrapolation against full recordings): GPipe from 2 micro-batches (accumulation makes
    // the gradients fp32), 1F1B once the stage reaches its steady state (m >= P - s, its warm-up
    // of P - s - 1 forwards and one more), interleaving once its warm-up of (P - s - 1) * 2 +
    // (V - 1) * P chunk forwards fits twice (m >= 2P), stepping by P there (m is a multiple of P).
    const int P = L.pp;
    if (L.schedule == PipeSchedule::interleaved) return {2 * P, P};
    if (L.schedule == PipeSchedule::one_f_one_b) return {std::max(2, P - stage), 1};
    return {2, 1};
}

DeviceMemory exact_memory(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq,
                          const Backend & sizing, bool extrapolate) {
    const Layout & L = c.layout;
    check_supported(candidate_run(c, seq), cfg, &sizing);
    const int m = c.grad_accum;
    const StageOptions so = stage_options(cfg, c, seq, sizing);
    struct {
        std::vector<CategoryBytes> live;
        uint64_t frozen = 0;
    } rec;
    for (int stage = 0; stage < L.pp; ++stage) {
        uint64_t * frozen = stage == 0 ? &rec.frozen : nullptr;
        const PipelineSamples at = pipeline_samples(L, stage);
        if (!extrapolate || L.pp == 1 || m <= at.from + at.step) {
            rec.live.push_back(record_stage(cfg, c, sizing, so, stage, m, frozen));
            continue;
        }
        // A pipeline's program holds all m micro-batches, so its recording costs O(m); a stage's
        // peak live bytes are affine in m past `from`: two recordings give its line.
        const CategoryBytes a = record_stage(cfg, c, sizing, so, stage, at.from, frozen);
        const CategoryBytes b = record_stage(cfg, c, sizing, so, stage, at.from + at.step, nullptr);
        const uint64_t steps = uint64_t((m - at.from) / at.step);
        CategoryBytes live = a;
        for (size_t k = 0; k < kCategoryCount; ++k) {
            MF_ASSERT(b.v[k] >= a.v[k]);
            live.v[k] += (b.v[k] - a.v[k]) * steps;
        }
        rec.live.push_back(live);
    }
    DeviceMemory mem;
    for (size_t stage = 0; stage < rec.live.size(); ++stage) {
        const CategoryBytes & live = rec.live[stage];
        if (L.pp > 1) mem.stages.push_back(live);
        if (stage > 0 && live.total() <= mem.device.total()) continue;
        mem.device = live;
        mem.loaded = L.pp > 1 ? fmt::format("pipeline stage {} (the largest)", stage)
                   : L.devices() > 1 ? "every rank (equal shards)" : "the only device";
    }
    mem.frozen = rec.frozen;
    mem.device[Category::runtime] = hw.memory - hw.usable;
    mem.host = mem.device[Category::offloaded];   // off the device: the node's host memory
    mem.device[Category::offloaded] = 0;
    mem.exact = true;
    return mem;
}

}  // namespace memfit
