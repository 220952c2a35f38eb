#include "plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "model/expert_parallel.h"
#include "model/recompute.h"
#include "plan/distill_plan.h"
#include "plan/lora_plan.h"
#include "plan/memory_model.h"
#include "plan/fit.h"
#include "plan/memory_model.h"

namespace memfit {

namespace {


bool keeps(uint32_t mask, Saved u) { return (mask >> int(u)) & 1u; }

// The matmul FLOPs of `layers` blocks and the LM head over `tokens` tokens, forward.
double matmul_forward_flops(const ModelConfig & cfg, double tokens, double layers) {
    const double C = cfg.n_embd, Q = cfg.qkv_dim(), F = double(cfg.active_fc_dim()), A = double(cfg.active_ffn()),
                 V = cfg.vocab_size;
    const double router = cfg.moe.enabled() ? C * cfg.moe.experts : 0.0;   // a mixture's router logits
    return tokens * (layers * 2.0 * (C * Q + C * C + C * F + A * C + router) + 2.0 * C * V);
}

// Query-key pairs of one causal sequence of T tokens: T(T+1)/2; within a sliding window W < T,
// W(W+1)/2 + (T - W) W (linear in T); Gemma 3's mix of sliding and global layers: their mean.
double attention_pairs(const ModelConfig & cfg, double T) {
    const double W = cfg.sliding_window > 0 && cfg.sliding_window < T ? double(cfg.sliding_window) : T;
    const double global = cfg.sliding_pattern > 0 ? double(cfg.n_layer / cfg.sliding_pattern) / cfg.n_layer : 0;
    return (1 - global) * (W * (W + 1) / 2 + (T - W) * W) + global * T * (T + 1) / 2;
}

// The rate the matmuls run at: their FLOPs at matmul_eff of the peak plus the bytes they move at
// the memory bandwidth (a roofline sum: the operands and results of thin gemms cost time that a
// large gemm hides; Williams et al. 2009). Per micro-batch forward, for `layers` blocks and the
// head: activations in and out (the column-parallel gemms read the whole input and write 1/tp,
// the row-parallel ones read 1/tp and write the whole partial sum) and each weight once, s bytes
// an element; the backward's two gemms per forward one move twice that, the same bytes per FLOP.
double matmul_rate(const ModelConfig & cfg, const Hardware & hw, double peak, double tokens, double layers, int tp,
                   double s) {
    const double C = cfg.n_embd, Q = cfg.qkv_dim(), F = double(cfg.active_fc_dim()), A = double(cfg.active_ffn()),
                 V = cfg.vocab_size;
    // Each weight read once a micro-batch: a mixture reads every expert's (E / k times the active ones).
    const double experts = cfg.moe.enabled() ? double(cfg.moe.experts) / cfg.moe.top_k : 1.0;
    const double layer_w = C * Q + C * C + experts * (C * F + A * C);
    const double bytes = s * (layers * (tokens * (4 * C + (Q + C + F + A) / tp) + layer_w / tp) +
                              tokens * (C + V / tp) + V * C / tp);
    const double flops = matmul_forward_flops(cfg, tokens, layers) / tp;
    return flops / (flops / (hw.matmul_eff * peak) + bytes / hw.mem_bw);
}

double need(double rate, const Hardware & hw, const char * what) {
    if (!(rate > 0))
        throw ConfigError(fmt::format("hardware '{}' has no {}: set it in the hardware catalog", hw.name, what));
    return rate;
}

struct Link {
    double bw = 0, latency = 0;
    // One collective: `volume` bytes per device in `steps` sequential messages.
    double time(double volume, double steps) const { return volume / (kLinkEfficiency * bw) + steps * latency; }
};

// Gradient collectives go in buckets, each paying its own latency.
double buckets(double bytes) { return std::max(1.0, std::ceil(bytes / kBucketBytes)); }

}  // namespace

double ring_allreduce_bytes(double bytes, int n) { return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * bytes; }
double reduce_scatter_bytes(double bytes, int n) { return n <= 1 ? 0.0 : double(n - 1) / n * bytes; }
double all_gather_bytes(double bytes, int n) { return n <= 1 ? 0.0 : double(n - 1) / n * bytes; }

double bubble_fraction(PipeSchedule s, int p, int m, int v) {
    if (p <= 1) return 0.0;
    MF_ASSERT(m >= 1);
    const double chunks = s == PipeSchedule::interleaved ? double(std::max(1, v)) * m : double(m);
    return double(p - 1) / (chunks + p - 1);
}

StepTime predict_step_time(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq, int nodes) {
    const Layout & L = c.layout;
    MF_ASSERT(L.dp >= 1 && L.tp >= 1 && L.pp >= 1 && c.micro_batch >= 1 && c.grad_accum >= 1 && seq >= 1);
    MF_ASSERT(L.zero >= 0 && L.zero <= 3);
    // TiledMLP recomputes the MLP's up-projection and activation in backward, whatever the policy.
    const uint32_t mlp_units = (1u << int(Saved::fc)) | (1u << int(Saved::gelu));
    const uint32_t mask = c.recompute.uniform_mask("the time model") &
                          (c.mlp_chunk > 0 && c.mlp_chunk < int64_t(c.micro_batch) * seq ? ~mlp_units : ~0u);
    check_lora_layout(c);
    if (c.compute == DType::bf16 && !(hw.bf16_flops > 0))
        throw ConfigError(fmt::format("hardware '{}' has no bf16 arithmetic: use --precision fp16 (with loss scaling) or fp32",
                                      hw.name));
    const double peak = need(hw.flops(c.compute), hw, "FLOP rate for the compute dtype");
    const double mem_bw = need(hw.mem_bw, hw, "memory bandwidth (mem_bw)");

    const double s = double(dtype_size(c.compute));
    const double g = c.grad_accum > 1 ? 4.0 : s;   // gradient bytes: fp32 accumulators across micro-batches
    const double C = cfg.n_embd, T = seq, V = cfg.vocab_size, b = c.micro_batch, m = c.grad_accum;
    const double A = double(cfg.active_ffn()), NH = cfg.n_head;
    const double R = double(cfg.n_head + cfg.kv_heads()) * cfg.head_dim();   // elements RoPE rotates per token
    // Context parallel: each rank holds T / cp tokens of every sequence and, balanced, 1/cp of its
    // attention pairs; its gradients are summed (and ZeRO-sharded) over data x context ranks.
    const double cpn = std::max(1, L.cp);
    const double tp = L.tp, dp = double(L.dp) * cpn, tokens = b * T / cpn;   // tokens per micro-batch per rank
    const int v = L.schedule == PipeSchedule::interleaved ? std::max(1, L.virtual_stages) : 1;
    const double layers = double(v) * std::ceil(double(cfg.n_layer) / (double(L.pp) * v));

    // --- math, per micro-batch on the busiest (last) stage
    const double mm_eff = matmul_rate(cfg, hw, peak, tokens, layers, L.tp, s);
    const double attn_eff = (c.flash() ? hw.attention_eff : hw.matmul_eff) * peak;
    const LoraPlan * lp = c.lora_plan.get();
    const double mm_fwd = matmul_forward_flops(cfg, tokens, layers) / tp;
    // LoRA: the adapters' gemms, 2 FLOPs per adapter parameter per token forward, 4 backward
    // (both the data and the weight gradient of A and B); the frozen base's backward is its data
    // gradient only (as many FLOPs as its forward), the head's included.
    // (The embedding's adapter is a lookup and an r x C product per token.)
    // DoRA: each site's norms once per micro-batch, (2 r + 2) FLOPs per weight it adapts.
    const double ad_fwd = lp ? (tokens * (layers * 2.0 * double(lp->adapters_per_layer) + 2.0 * double(lp->head_adapters) +
                                          (lp->embed_adapters > 0 ? 2.0 * lp->opts.rank * C : 0.0)) +
                                (lp->opts.dora ? layers * (2.0 * lp->opts.rank + 2.0) * double(lp->site_weights) : 0.0)) / tp
                             : 0.0;
    // QK^T and AV: 2 FLOPs x 2 per query-key pair per channel.
    const double attn_fwd = layers * b * 4.0 * attention_pairs(cfg, T) * C / tp / cpn;
    const double attn_bwd = attn_fwd * (c.flash() ? 2.5 : 2.0);
    // Distillation: the frozen teacher's forward on the same tokens, whole on every rank.
    double frozen_mb = 0;
    if (const DistillPlan * dist = c.distill_plan.get()) {
        const ModelConfig & t = *dist->opts.teacher;
        frozen_mb = matmul_forward_flops(t, tokens, t.n_layer) / mm_eff +
                     double(t.n_layer) * b * 4.0 * attention_pairs(t, T) * t.n_embd / attn_eff;
    }
    // Preference tuning: the reference's forward (LoRA's base again, or the copy; none when
    // precomputed) and the LM head's second forward (model/preference.h).
    if (c.pref.dpo()) {
        const bool forward = preference_options(c).reference != Reference::precompute;
        frozen_mb += 2.0 * tokens * C * V / mm_eff +
                      (forward ? matmul_forward_flops(cfg, tokens, layers) / mm_eff +
                                     layers * b * 4.0 * attention_pairs(cfg, T) * C / attn_eff
                               : 0.0);
    }
    const double fwd_mb = (mm_fwd + ad_fwd) / mm_eff + attn_fwd / attn_eff + frozen_mb;
    const double bwd_mm = lp ? mm_fwd + 2.0 * ad_fwd : 2.0 * mm_fwd;
    const double bwd_nr_mb = bwd_mm / mm_eff + attn_bwd / attn_eff;   // backward without recompute
    const uint32_t attn_bits = (1u << int(Saved::attn_out)) | (1u << int(Saved::attn_probs));
    const double rc_all = layer_keep_cost(cfg, c.micro_batch, seq, c.flash(), c.compute, mask).flops;
    const double rc_other = layer_keep_cost(cfg, c.micro_batch, seq, c.flash(), c.compute, mask | attn_bits).flops;
    // Projections a recomputation re-runs (memfit keeps each layer's output: never the down
    // projection), with their adapters and (packed base) their dequantization.
    const bool rc_proj[4] = {!keeps(mask, Saved::qkv), !keeps(mask, Saved::res2), !keeps(mask, Saved::fc), false};
    double rc_ad = 0, deq_layer = 0;   // adapter FLOPs per token recomputed; packed bytes read per layer
    if (lp)
        for (size_t p = 0; p < 4; ++p) {
            rc_ad += rc_proj[p] ? 2.0 * double(lp->adapters_by_proj[p]) : 0.0;
            deq_layer += double(lp->packed[p]) * (2.0 + (rc_proj[p] ? 1.0 : 0.0));   // forward, backward, recompute
        }
    const double rc_mb = layers / tp * ((rc_other / mm_eff + (rc_all - rc_other) / attn_eff) / cpn + tokens * rc_ad / mm_eff);
    const double bwd_mb = bwd_nr_mb + rc_mb;

    StepTime t;
    t.recompute = m * rc_mb;
    t.compute = m * (fwd_mb + bwd_mb);

    // --- memory-bound traffic, elements per token per layer
    const double norm = 2.0 * C, norm_b = 3.0 * C, res = 3.0 * C, res_b = 3.0 * C;
    const double act = cfg.gated() ? 3.0 * A : 2.0 * A, act_b = cfg.gated() ? 5.0 * A : 3.0 * A;
    const double rope = cfg.llama() ? 2.0 * R : 0.0;
    const double probs = c.flash() ? 0.0 : NH * T, probs_b = c.flash() ? 0.0 : NH * T;   // one pass over b NH T T
    double replicated = 2 * (norm + norm_b) + 2 * (res + res_b);
    double split = act + act_b + 2 * rope + 4 * probs + 5 * probs_b;
    // LoRA: add_columns reads d and the output slice and writes it (3), take_columns 2.
    if (lp) split += 5.0 * double(lp->site_cols);
    // DoRA: the factor's forward reads the slice and writes it and z (3), backward copies each
    // adapted projection's output gradient (2) and reads a slice of it and z and writes it (3).
    if (lp && lp->opts.dora) split += 6.0 * double(lp->site_cols) + 2.0 * double(lp->dora_out_total);
    // Dropout on the adapters' input: forward 2 (read, write); backward regenerates it (2), masks
    // the gradient (2) and adds it to the input's gradient (3).
    if (lp && lp->opts.dropout > 0) split += 9.0 * double(lp->site_in);
    // Recomputed units run their forward traffic again.
    if (!keeps(mask, Saved::ln1)) replicated += norm;
    if (!keeps(mask, Saved::ln2)) replicated += norm;
    if (!keeps(mask, Saved::res2)) replicated += res;
    if (!keeps(mask, Saved::gelu)) split += act;
    if (!keeps(mask, Saved::qkv)) split += rope;
    if (!c.flash() && (!keeps(mask, Saved::attn_out) || !keeps(mask, Saved::attn_probs))) split += 4 * probs;
    const double layer_bytes = s * (split / tp + (L.sp ? replicated / tp : replicated));
    const double bw = hw.bandwidth_eff * mem_bw;
    // A packed base is dequantized for every matmul that reads it: its packed bytes once each
    // (forward, backward's data gradient, recomputation).
    const double mem_mb = (tokens * (layers * layer_bytes + kLossBytesPerLogit * V / tp) + layers * deq_layer / tp) / bw;

    // --- parameters of this device and the optimizer update
    const ParamSplit ps = param_split(cfg);
    const double head = double(ps.head) + (cfg.tied_head && L.pp > 1 ? V * C : 0.0);
    const double first = layers * double(ps.per_layer) + double(ps.embed) + (L.pp == 1 ? head : 0.0);
    const double last = layers * double(ps.per_layer) + head;
    const double psi = (L.pp == 1 ? first : std::max(first, last)) / tp;
    // What trains (and is reduced, updated, offloaded) and what ZeRO-3 gathers, bytes: LoRA's
    // adapters, and the frozen base (packed or not) with them.
    // Expert parallelism: a rank reduces, updates and gathers its own experts only.
    const double ep_saved = L.ep > 1 ? layers * double(ps.experts) * (1.0 - 1.0 / L.ep) / tp : 0.0;
    const double train =
        lp ? (layers * double(lp->adapters_per_layer) + double(lp->head_adapters + lp->embed_adapters)) / tp
           : psi - ep_saved;
    double weights = (psi - ep_saved) * s;
    if (lp) {
        const double layer_base = double(lp->layer_base_bytes(ps.per_layer, uint64_t(s)));
        const double first_b = layers * layer_base + double(ps.embed) * s + (L.pp == 1 ? head * s : 0.0);
        const double last_b = layers * layer_base + head * s;
        weights = (L.pp == 1 ? first_b : std::max(first_b, last_b)) / tp + train * s;
    }
    const double shard = L.zero >= 1 ? train / dp : train;   // parameters this device's optimizer updates
    const double state = optimizer_state_bytes(c.optimizer, ps.width, c.galore_rank, c.adafactor_beta1 > 0);
    const bool master = c.compute != DType::f32 && c.master_weights != MasterWeights::bf16_sr;
    const double update_bytes = 2.0 * (state + 4.0) + g + (master ? s : 0.0);   // per parameter
    // The device runs the update (offloaded states are staged through it: train/step.h).
    t.memory_bound = m * mem_mb + shard * update_bytes / bw;
    // GaLore: each projected matrix's gradient projected and its update projected back, 4 r FLOPs
    // per element, at the fp32 matmul rate (the projector's refresh, every update gap, left out).
    if (has_state(c.optimizer, StateSize::projector)) {
        double proj = 0;
        for (const auto & [Rm, Cm] : ps.targets) proj += 4.0 * double(galore_rank(true, Rm, Cm, c.galore_rank)) * double(Rm * Cm);
        t.memory_bound += layers * proj / (hw.matmul_eff * need(hw.flops(DType::f32), hw, "fp32 FLOP rate"));
    }

    // --- placement and links
    const int devices = L.devices();
    const int per_node = hw.per_node > 0 ? hw.per_node : devices;
    const int r = std::min((devices + std::max(1, nodes) - 1) / std::max(1, nodes), per_node);
    // A group spanning nodes: each node's k members send over their own NICs at once (NCCL runs
    // one ring per NIC), so a ring's flow crosses nodes at k x inter_bw, capped by the links inside.
    auto link = [&](bool inter, int k) {
        const double intra = need(hw.intra_bw, hw, "intra-node bandwidth (intra_bw)");
        if (!inter) return Link{intra, hw.intra_latency};
        const double across = double(std::max(1, k)) * need(hw.inter_bw, hw, "inter-node bandwidth (inter_bw)");
        return Link{std::min(intra, across), hw.inter_latency};
    };

    // tensor parallel: 4 collectives per layer per micro-batch (+2 for full recompute's forward),
    // exposed. With c.tp_comm_overlap and sequence parallelism each all-gather / reduce-scatter
    // is pipelined in chunks with the gemm that consumes or produces it (Megatron-Core's TP
    // communication overlap; Wang et al. 2022): hidden up to kOverlapFraction of the gemms.
    double tp_comm = 0, tp_exposed = 0;
    if (L.tp > 1) {
        const Link lk = link(L.tp > r, r);
        const double per_layer = 4.0 + (mask == 0 ? 2.0 : 0.0);
        tp_comm = m * layers * per_layer * lk.time(ring_allreduce_bytes(tokens * C * s, L.tp), 2.0 * (L.tp - 1));
        const double gemms = m * (mm_fwd + bwd_mm) / mm_eff;
        tp_exposed = L.sp && c.tp_comm_overlap ? std::max(0.0, tp_comm - kOverlapFraction * gemms) : tp_comm;
    }
    // pipeline point-to-point: activation forward, gradient backward, per micro-batch and chunk.
    // Each tensor rank sends its 1/tp of the boundary tensor (with sequence parallelism that is
    // what it holds; without, Megatron's scatter/gather: the receivers all-gather it inside the
    // node, Narayanan et al. 2021 section 4.1).
    double pp_comm = 0;
    if (L.pp > 1) {
        const Link lk = link(devices > r, 1);
        const double gather = L.sp || L.tp == 1 ? 0.0
                                                : link(L.tp > r, r).time(all_gather_bytes(tokens * C * s, L.tp), L.tp - 1.0);
        pp_comm = m * 2.0 * v * (lk.time(tokens * C * s / tp, 1.0) + gather);
    }
    // context parallel (model/context_parallel.h): per layer and micro-batch the k | v all-gathered
    // in forward and again in backward (and for an attention recomputed), their gradients
    // reduce-scattered; blocking in memfit's engine, so exposed.
    double cp_comm = 0;
    if (L.cp > 1) {
        const Link lk = link(L.tp * L.cp > r, r / std::min(L.tp, r));
        const double kv = b * T * 2.0 * cfg.kv_heads() * cfg.head_dim() * s / tp;   // the whole sequence's k | v
        const double gathers = 2.0 + (keeps(mask, Saved::attn_out) ? 0.0 : 1.0);
        if (c.cp_comm_type == "p2p") {   // the ring: cp - 1 hops of a block each pass, fp32 gradients with it back
            const double block = kv / L.cp, grads = block / s * 4.0, hops = L.cp - 1.0;
            cp_comm = m * layers * (gathers * hops * lk.time(block, 1.0) + hops * lk.time(block + grads, 2.0) +
                                    lk.time(grads, 1.0));
        } else {
            cp_comm = m * layers * ((gathers * lk.time(all_gather_bytes(kv, L.cp), L.cp - 1.0)) +
                                    lk.time(reduce_scatter_bytes(kv, L.cp), L.cp - 1.0));
        }
    }
    // expert parallel: per sparse layer and micro-batch the routed rows all-to-all to the ranks
    // holding their experts and back, in forward and in backward (and again for an MLP
    // recomputed), blocking: exposed.
    double ep_comm = 0;
    if (L.ep > 1 && cfg.moe.enabled()) {
        const Link lk = link(L.tp * L.ep > r, r / std::min(L.tp, r));
        const double rows = tokens * cfg.moe.top_k * ep_capacity_factor(c.moe_capacity_factor);
        const double a2a = lk.time(double(L.ep - 1) / L.ep * rows * C * s / tp, L.ep - 1.0);
        const double sparse = layers * double(cfg.moe_layers()) / cfg.n_layer;
        ep_comm = m * sparse * (4.0 + (keeps(mask, Saved::fc) ? 0.0 : 2.0)) * a2a;
    }
    // data parallel
    double dp_comm = 0, dp_exposed = 0;
    if (dp > 1) {
        const Link lk = link(L.tp * int(dp) > r, r / std::min(L.tp, r));
        const int n = int(dp);
        auto rs = [&](double bytes) { return lk.time(reduce_scatter_bytes(bytes, n), buckets(bytes) * (n - 1)); };
        auto ag = [&](double bytes) { return lk.time(all_gather_bytes(bytes, n), buckets(bytes) * (n - 1)); };
        auto hide = [](double comm, double window) { return std::max(0.0, comm - kOverlapFraction * window); };
        switch (L.zero) {
            case 0: {
                const double ar = lk.time(ring_allreduce_bytes(train * g, n), buckets(train * g) * 2.0 * (n - 1));
                dp_comm = ar;
                dp_exposed = hide(ar, bwd_mb);
                break;
            }
            // ZeRO-1/2's all-gather of the updated parameters overlaps the next step's first
            // forward, bucket by bucket (Megatron's distributed optimizer, overlap_param_gather).
            case 1:
                dp_comm = rs(train * g) + ag(train * s);
                dp_exposed = hide(rs(train * g), bwd_mb) + hide(ag(train * s), fwd_mb);
                break;
            case 2:
                dp_comm = m * rs(train * s) + ag(train * s);
                dp_exposed = m * hide(rs(train * s), bwd_mb) + hide(ag(train * s), fwd_mb);
                break;
            default: {   // 3: one gather and one reduce-scatter per layer (FSDP's unit) and one for the rest
                const double units = layers + 1;
                const double gather = lk.time(all_gather_bytes(weights, n), units * (n - 1));
                const double scatter = lk.time(reduce_scatter_bytes(train * s, n), units * (n - 1));
                dp_comm = m * (2.0 * gather + scatter);
                dp_exposed = m * (hide(gather, fwd_mb) + hide(gather + scatter, bwd_mb));
                break;
            }
        }
    }
    t.comm = tp_comm + pp_comm + dp_comm + cp_comm + ep_comm;
    t.comm_exposed = tp_exposed + pp_comm + dp_exposed + cp_comm + ep_comm;

    // --- pipeline bubble: f of the step idle, f / (1 - f) of the stage's busy time
    if (L.pp > 1) {
        const double f = bubble_fraction(L.schedule, L.pp, c.grad_accum, v);
        t.bubble = f / (1.0 - f) * (t.compute + m * mem_mb + tp_exposed + pp_comm);
    }

    // --- offload
    if (L.offload != Offload::none) {
        const double host = need(hw.host_bw, hw, "host link bandwidth (host_bw)");
        // memfit's engine (train/step.h): the offloaded master weights and moments are read to
        // the device and written back, unit by unit; the device updates them.
        const double F = L.offload == Offload::optimizer ? c.offload_fraction : 1.0;
        t.offload = F * shard * 2.0 * (state + (master ? 4.0 : 0.0)) / host;
        if (L.offload == Offload::optimizer_params) {
            // The weights' shard: written by the update (read too where it is the fp32 truth), and
            // each layer's part read before its gather, forward and backward, every micro-batch.
            t.offload += shard * s * (master ? 1.0 : 2.0) / host + m * 2.0 * weights / dp / host;
        }
    }

    // --offload activations: each micro-batch writes the offloaded layers' kept units in its
    // forward and reads them in its backward on a copy stream beside the compute (a layer
    // ahead); what the compute does not cover shows.
    if (L.offload_acts && L.pp == 1) {
        const double host = need(hw.host_bw, hw, "host link bandwidth (host_bw)");
        const double bytes = double(activation_offload_bytes(cfg, c, seq));
        t.offload += m * (std::max(0.0, bytes / host - kOverlapFraction * fwd_mb) +
                          std::max(0.0, bytes / host - kOverlapFraction * bwd_mb));
    }

    t.total = t.compute + t.memory_bound + t.comm_exposed + t.bubble + t.offload;
    const double step_tokens = T * double(L.dp) * b * m;   // context ranks share their sequences
    t.tokens_per_s = step_tokens / t.total;
    // LoRA's model FLOPs: no weight gradients for the N base parameters, 6 per adapter parameter.
    const double full_flops = train_flops_per_token(cfg, seq);
    const double n_mult = (full_flops - 12.0 * cfg.n_layer * C * T) / 6.0;
    const double model_flops = lp ? full_flops - 2.0 * n_mult + 6.0 * double(lp->adapters) : full_flops;
    t.mfu = model_flops * step_tokens / (t.total * devices * peak);
    return t;
}

double TimeModel::op_seconds(const OpRecord & op, bool lowp) const {
    const std::string_view n = op.name;
    if (n == "offload_read" || n == "offload_write") return op_overhead + op.bytes / 2 / offload_rate;
    const double eff = n.starts_with("matmul") || n.starts_with("moe_gemm") || n.starts_with("moe_qgemm")
                           ? (lowp ? lowp_gemm : 1.0)
                       : n.starts_with("flash_attention") ? 0.8
                       : n.starts_with("attention")       ? 0.2
                       : n.starts_with("xent")            ? 0.015
                                                          : 0.15;
    return op_overhead + std::max(op.flops / (flops_rate * eff), op.bytes / byte_rate);
}

double TimeModel::step_seconds(const StepPlans & plans, int grad_accum) const {
    auto seconds = [&](const TrainStep * s) {
        double t = 0;
        if (s)
            for (const OpRecord & op : s->program().ops()) t += op_seconds(op, s->compute() != DType::f32);
        return t;
    };
    return seconds(plans.train.get()) + (grad_accum > 1 ? seconds(plans.first.get()) : 0) +
           (grad_accum > 2 ? double(grad_accum - 2) * seconds(plans.mid.get()) : 0);
}

}  // namespace memfit
