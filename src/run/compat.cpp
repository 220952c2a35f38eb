#include "run/compat.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "model/llama_types.h"
#include "model/lora.h"
#include "model/tensor_parallel.h"

namespace memfit {

std::optional<std::string> out_of_range(const RunConfig & r) {
    const Layout & L = r.layout;
    if (L.zero < 0 || L.zero > 3)
        return fmt::format("--zero {}: expected 0 (no sharding), 1 (optimizer states), 2 (+ gradients) or 3 (+ "
                           "parameters)", L.zero);
    if (!(r.bucket_mb >= 0) || !std::isfinite(r.bucket_mb) || r.bucket_mb > 1048576.0)
        return fmt::format("--bucket-mb {}: expected a size in MiB, 0 or more (0: one bucket per transformer block)",
                           r.bucket_mb);
    if (L.tp < 1 || L.tp > 4096)
        return fmt::format("--tp {}: expected the number of ranks of a tensor group, 1 or more", L.tp);
    if (L.pp < 1 || L.pp > 4096) return fmt::format("--pp {}: expected the number of pipeline stages, 1 or more", L.pp);
    // fp16's loss scales: the gradients are unscaled by 1 / scale, so a scale outside these
    // bounds turns a step into zeros times infinity; 2^32 is DeepSpeed's largest customary
    // initial_scale_power, and above 2^24 every fp16 gradient of a unit loss overflows anyway.
    constexpr float kMinScale = 1.0f / (1 << 24), kMaxScale = 4294967296.0f;
    auto scale_ok = [&](float s) { return s >= kMinScale && s <= kMaxScale; };
    if (r.loss_scale != 0 && !scale_ok(r.loss_scale))
        return fmt::format("--loss-scale {:g}: expected 0 (dynamic) or a static scale from 2^-24 to 2^32", r.loss_scale);
    if (!scale_ok(r.initial_loss_scale) || !scale_ok(r.min_loss_scale))
        return fmt::format("--initial-loss-scale {:g} / --min-loss-scale {:g}: expected scales from 2^-24 to 2^32",
                           r.initial_loss_scale, r.min_loss_scale);
    if (r.min_loss_scale > r.initial_loss_scale)
        return fmt::format("--min-loss-scale {:g} is above --initial-loss-scale {:g}: the dynamic scale starts at the "
                           "initial one and is never halved below the minimum", r.min_loss_scale,
                           r.initial_loss_scale);
    if (r.layout.ep < 1) return fmt::format("--ep {}: expected 1 (off) or more ranks per expert group", r.layout.ep);
    if (!(r.offload_fraction > 0 && r.offload_fraction <= 1))
        return fmt::format("--offload-fraction {:g}: expected the share of the optimizer state to offload, above 0 "
                           "and at most 1", r.offload_fraction);
    return std::nullopt;
}

namespace {

// --offload optimizer+params streams each layer's weights from the rank's ZeRO-3 shard, which it
// keeps off the device with the whole optimizer state (train/step.h).
// --cp: the engine's context parallelism (model/context_parallel.h) and what it does not combine
// with yet.
std::optional<std::string> context_parallel_refusal(const RunConfig & r, const ModelConfig & cfg) {
    const Layout & L = r.layout;
    if (L.cp < 1) return fmt::format("--cp {}: expected 1 (off) or more ranks per sequence", L.cp);
    if (r.cp_comm_type != "all_gather" && r.cp_comm_type != "p2p")
        return fmt::format("--cp-comm-type {}: expected all_gather or p2p", r.cp_comm_type);
    if (L.cp == 1) return std::nullopt;
    if (r.seq % (2 * L.cp) != 0)
        return fmt::format("--cp {} cuts each sequence into {} chunks (two per rank, mirrored for the causal mask's "
                           "balance): --seq {} is not a multiple of {}; use --seq {}",
                           L.cp, 2 * L.cp, r.seq, 2 * L.cp, (r.seq / (2 * L.cp) + 1) * 2 * L.cp);
    auto no = [&](const std::string & what, const std::string & hint) {
        return fmt::format("--cp {} with {}: not yet; {}", L.cp, what, hint);
    };
    if (L.tp > 1 || L.pp > 1)
        return no(L.tp > 1 ? fmt::format("--tp {}", L.tp) : fmt::format("--pp {}", L.pp),
                  "context parallelism composes with data parallelism and ZeRO for now");
    if (r.attention == Attention::naive)
        return no("--attention naive", "its attention never stores the scores (as flash attention); drop --attention");
    if (!r.distill.teacher.empty()) return no("--teacher", "train the student without --cp, or with a shorter --seq");
    if (r.pref.dpo()) return no("--objective dpo", "preference pairs are short: drop --cp");
    if (cfg.sliding_window > 0 && cfg.sliding_window < r.seq)
        return no(fmt::format("a sliding window of {} ({})", cfg.sliding_window, cfg.name), "use --seq up to the window");
    if (cfg.head_dim() > 256) return no(fmt::format("head dimension {}", cfg.head_dim()), "its kernels take up to 256");
    return std::nullopt;
}

// --offload activations moves what one program's blocks save between their forward and backward.
std::optional<std::string> activation_offload_refusal(const RunConfig & r) {
    const Layout & L = r.layout;
    if (!L.offload_acts) {
        if (r.offload_activation_layers != 0)
            return fmt::format("--offload-activations-layers {} says how many layers --offload activations moves; add "
                               "--offload activations (or optimizer+activations)", r.offload_activation_layers);
        return std::nullopt;
    }
    if (r.offload_activation_layers < 0)
        return fmt::format("--offload-activations-layers {}: expected 0 (every layer) or a number of layers",
                           r.offload_activation_layers);
    if (L.pp > 1)
        return fmt::format("--offload activations with --pp {}: each in-flight micro-batch keeps its activations "
                           "on its stage for now; use --recompute, or --offload activations without --pp", L.pp);
    return std::nullopt;
}

std::optional<std::string> offload_refusal(const RunConfig & r) {
    const Layout & L = r.layout;
    if (L.offload != Offload::optimizer_params) return std::nullopt;
    if (L.zero < 3)
        return fmt::format("--offload optimizer+params with --zero {}: the weights leave the device as this rank's "
                           "ZeRO-3 shard, gathered layer by layer; add --zero 3 (on one process too)", L.zero);
    if (r.offload_fraction != 1)
        return fmt::format("--offload-fraction {:g} with --offload optimizer+params: the weights' update writes them "
                           "from the offloaded states, so all of them go; drop --offload-fraction (or use --offload "
                           "optimizer)", r.offload_fraction);
    if (r.lora.rank > 0)
        return std::string("--offload optimizer+params with LoRA: the frozen base stays on the device (or sharded "
                           "by --zero 3); use --offload optimizer, or --base-weights nf4 for a smaller base");
    if (L.pp > 1)
        return fmt::format("--offload optimizer+params with --pp {}: parameter offload streams one stage's layers "
                           "for data and tensor parallelism for now; use --offload optimizer with --pp", L.pp);
    return std::nullopt;
}

// --optimizer-in-backward: each layer's update runs as soon as its own gradients are whole, before
// any global quantity of the step exists (torchtune refuses the same: optimizer_in_bwd with
// gradient clipping or accumulation).
std::optional<std::string> in_backward_refusal(const RunConfig & r) {
    if (!r.optimizer_in_backward) return std::nullopt;
    const Layout & L = r.layout;
    auto no = [](const std::string & what, const std::string & hint) {
        return fmt::format("--optimizer-in-backward with {}: {}", what, hint);
    };
    if (r.clip > 0)
        return no(fmt::format("--clip {:g}", r.clip),
                  "global-norm clipping needs every gradient before the first update; drop --clip (or the fused step)");
    if (r.grad_accum > 1)
        return no(fmt::format("--grad-accum {}", r.grad_accum),
                  "each micro-batch would update the weights; raise --micro-batch, or use --recompute to fit it");
    if (r.fit_auto)
        return no("--fit auto", "the search trades accumulation for memory; set --micro-batch yourself");
    if (r.compute == DType::f16 && !r.precision_auto)
        return no("--precision fp16", "the loss scaler skips a step only after seeing every gradient; use bf16");
    if (L.tp > 1 || L.pp > 1)
        return no(L.tp > 1 ? fmt::format("--tp {}", L.tp) : fmt::format("--pp {}", L.pp),
                  "data parallelism (any --zero) for now");
    if (L.offload != Offload::none)
        return no(fmt::format("--offload {}", offload_name(L.offload)), "the update streams the states after the "
                  "backward; use --optimizer adamw-8bit for smaller states");
    return std::nullopt;
}

// DoRA (--lora-variant dora, model/lora.h) as the engine computes it: each adapted row's norm read
// from the dense base, on the block projections, without dropout, on whole rows.
std::optional<std::string> dora_refusal(const RunConfig & r, const ModelConfig & cfg) {
    if (r.lora.variant != "dora" || r.lora.rank <= 0) return std::nullopt;
    const Layout & L = r.layout;
    const bool packed = r.lora.base_weights != "compute" && r.lora.base_weights != "fp32" && r.lora.base_weights != "bf16" &&
                        r.lora.base_weights != "fp16";
    if (packed && (cfg.n_embd % 8 != 0 || cfg.ffn_dim() % 8 != 0 || cfg.attn_dim() % 8 != 0))
        return fmt::format("--lora-variant dora with --base-weights {}: the norms dequantize whole 8-element groups of "
                           "rows, and {}'s projection inputs ({}, {}, {}) are not all multiples of 8; use a dense base",
                           r.lora.base_weights, cfg.name, cfg.n_embd, cfg.attn_dim(), cfg.ffn_dim());
    if (r.lora.dropout > 0)
        return fmt::format("--lora-variant dora with --lora-dropout {:g}: PEFT's DoRA under dropout runs the base "
                           "projection a second time on the dropped input, which memfit does not yet; drop --lora-dropout "
                           "(torchtune's DoRA configs train without it) or use plain LoRA", r.lora.dropout);
    if (L.tp > 1)
        return fmt::format("--lora-variant dora with --tp {}: a row-parallel projection's rows are split over the "
                           "tensor ranks and so are their norms; use data parallelism (--zero 3 shards the base)", L.tp);
    try {
        for (const auto & t : parse_lora_targets(cfg, r.lora.targets))
            if (t == "lm_head" || t == "embed_tokens")
                return fmt::format("--lora-variant dora with --lora-targets {}: DoRA adapts the block projections "
                                   "only, for now; drop {} from the targets", t, t);
    } catch (const ConfigError & e) {
        return std::string(e.what());
    }
    return std::nullopt;
}

// GaLore projects whole matrices of the full weights, refreshing its projector by an eigen-
// decomposition the CPU backend has (cpu/kernels_galore.cpp).
// Preference tuning: pairs of whole rows on one rank, the reference beside the policy.
std::optional<std::string> preference_refusal(const RunConfig & r) {
    if (!r.pref.dpo()) return std::nullopt;
    const Layout & L = r.layout;
    const bool lora = r.lora.rank > 0;
    const std::string ref = r.pref.reference == "auto" ? (lora ? "adapters-off" : "copy") : r.pref.reference;
    if (L.tp > 1 || L.pp > 1)
        return fmt::format("--objective dpo with --{} {}: each pair's log-probabilities are summed on one rank; "
                           "use data parallelism (and ZeRO)", L.tp > 1 ? "tp" : "pp", L.tp > 1 ? L.tp : L.pp);
    if (ref == "adapters-off" && !lora)
        return std::string("--reference adapters-off switches LoRA's adapters off, and this run has none; use "
                           "--reference copy (a frozen copy) or precompute, or add --lora-rank R");
    if (ref == "adapters-off" && L.zero >= 3)
        return std::string("--reference adapters-off with --zero 3: the base would be gathered twice per step; use "
                           "--reference precompute (no reference forward) or --zero 2");
    if (!r.distill.teacher.empty())
        return std::string("--objective dpo with --teacher: one frozen model beside the policy at a time; drop --teacher");
    if (r.packing)
        return std::string("--objective dpo with --packing: each answer of a pair is a row of its own; drop --packing");
    // --fit auto keeps the rows per step and tries micro-batches that divide them: the even ones
    // (the rest are refused below, candidate by candidate).
    if (r.fit_auto && r.micro_batch > 0 && r.grad_accum > 0 && r.micro_batch * r.grad_accum % 2)
        return fmt::format("--objective dpo with --fit auto: {} rows per step cannot be cut into micro-batches of "
                           "whole pairs; use an even --micro-batch", r.micro_batch * r.grad_accum);
    if (!r.fit_auto && r.micro_batch > 0 && r.micro_batch % 2)
        return fmt::format("--micro-batch {} with --objective dpo: a batch holds whole pairs (chosen, rejected), so "
                           "its rows must be even; use --micro-batch {}", r.micro_batch, r.micro_batch + 1);
    return std::nullopt;
}

std::optional<std::string> galore_refusal(const RunConfig & r, const Backend * backend) {
    if (!has_state(r.optimizer, StateSize::projector)) return std::nullopt;
    const Layout & L = r.layout;
    const char * o = optimizer_name(r.optimizer);
    if (L.zero >= 1 || L.tp > 1 || L.offload != Offload::none)
        return fmt::format("--optimizer {} keeps a projector per whole matrix: {} cuts them; use --zero 0 (data "
                           "parallelism keeps whole states), or --optimizer adamw-8bit",
                           o, L.zero >= 1 ? fmt::format("--zero {}", L.zero) : L.tp > 1 ? fmt::format("--tp {}", L.tp)
                                                                                : std::string("--offload"));
    if (r.lora.rank > 0)
        return fmt::format("--optimizer {} trains the full weights in a low-rank subspace of their gradients; with "
                           "--lora-rank {} only the adapters train (drop one of them)", o, r.lora.rank);
    if (r.sparsity.enabled())
        return fmt::format("--optimizer {} with --sparsity {}: a projected update cannot keep the pruned weights at "
                           "zero; use --optimizer adamw or adamw-8bit", o, r.sparsity.name());
    if (r.galore_rank < 1)
        return fmt::format("--galore-rank {}: expected 1 or more (GaLore's default is 128)", r.galore_rank);
    if (backend && !backend->host_memory())
        return fmt::format("--optimizer {} runs on the CPU backend for now (its projector's eigen-decomposition has "
                           "no CUDA kernel yet); use --device cpu, or --optimizer adamw-8bit on the GPU", o);
    return std::nullopt;
}

}  // namespace

// A mixture of experts trains with every expert on every rank, with data parallelism and ZeRO,
// recomputation and offload, bf16 or fp32, on the CPU and on GPUs: what cuts its tokens or its
// layers across ranks, or its MLP's matrices, waits for expert parallelism.
std::optional<std::string> moe_refusal(const RunConfig & r, const ModelConfig & cfg) {
    const Layout & L = r.layout;
    if (L.ep > 1 && !cfg.moe.enabled())
        return fmt::format("--ep {}: model '{}' has no experts to spread; drop --ep", L.ep, cfg.name);
    // (The data ranks are known once the world is: 1 here means not yet; the trainer checks them.)
    if (L.ep > 1 && ((L.data_ranks() > 1 && L.data_ranks() % L.ep) || cfg.moe.experts % L.ep))
        return fmt::format("--ep {} must divide the {} data-parallel ranks and the {} experts", L.ep, L.data_ranks(),
                           cfg.moe.experts);
    if (L.ep > 1) {   // model/expert_parallel.h: the experts split, routed rows exchanged
        const char * what = r.lora.rank > 0             ? "LoRA"
                            : r.optimizer_in_backward     ? "--optimizer-in-backward"
                            : r.fit_auto                  ? "--fit auto"
                                                          : nullptr;
        if (what)
            return fmt::format("--ep {} with {} is not supported yet; drop one (memfit plan shows what fits without it)",
                               L.ep, what);
    }
    if (r.moe_token_drop_policy != "probs" && r.moe_token_drop_policy != "position")
        return fmt::format("--moe-token-drop-policy {}: expected probs or position", r.moe_token_drop_policy);
    if (r.moe_capacity_factor > 0 && L.ep <= 1)
        return std::string("--moe-capacity-factor bounds what --ep's ranks receive; without --ep routing is dropless: "
                           "drop it");
    if (!cfg.moe.enabled()) return std::nullopt;
    const bool lora = r.lora.rank > 0;
    const char * what = L.tp > 1 ? "--tp" : L.pp > 1 ? "--pp" : L.cp > 1 ? "--cp" : r.mlp_chunk > 0 ? "--mlp-chunk"
                        : !r.distill.teacher.empty() ? "--teacher" : r.sparsity.enabled() ? "--sparsity"
                        : has_state(r.optimizer, StateSize::projector) ? "GaLore"
                        : lora && r.lora.variant == "dora" ? "--lora-variant dora"
                        : lora && r.lora.dropout > 0 ? "--lora-dropout"
                        : lora && (r.lora.base_weights == "sparse24" || r.lora.base_weights == "gptq")
                            ? "--base-weights sparse24 or gptq"
                        : lora && cfg.moe.shared_ffn > 0 ? "LoRA on shared experts (qwen2_moe)" : nullptr;
    if (!what) return std::nullopt;
    return fmt::format("{} with a mixture of experts ({}: {} experts, top {}) is not supported yet; train it with "
                       "data parallelism and ZeRO (mpirun -np N memfit train --zero 1..3)", what, cfg.name,
                       cfg.moe.experts, cfg.moe.top_k);
}

std::optional<std::string> unsupported(const RunConfig & r, const ModelConfig & cfg, const Backend * backend) {
    const Layout & L = r.layout;
    if (auto why = out_of_range(r)) return why;
    if (auto why = moe_refusal(r, cfg)) return why;
    // What the engine has.
    if (L.offload == Offload::none && r.offload_fraction != 1)
        return std::string("--offload-fraction says how much --offload optimizer moves; add --offload optimizer");
    if (L.offload == Offload::none && !L.offload_acts && !r.offload_dir.empty())
        return std::string("--offload-dir says where --offload puts what it moves; add --offload optimizer (or "
                           "activations)");
    if (auto why = offload_refusal(r)) return why;
    if (auto why = activation_offload_refusal(r)) return why;
    if (auto why = in_backward_refusal(r)) return why;
    if (auto why = galore_refusal(r, backend)) return why;
    if (auto why = preference_refusal(r)) return why;
    if (r.adafactor_beta1 > 0 && r.optimizer != Optimizer::adafactor)
        return fmt::format("--adafactor-beta1 {:g} is Adafactor's first moment: add --optimizer adafactor (--optimizer {} "
                           "has its own: --adam-beta1)", r.adafactor_beta1, optimizer_name(r.optimizer));
    if (r.optimizer == Optimizer::adafactor && (L.zero >= 1 || L.tp > 1 || L.offload != Offload::none))
        return fmt::format("--optimizer adafactor keeps statistics per row and column of each whole matrix: {} cuts "
                           "them; use --zero 0 (data parallelism keeps whole states), or --optimizer adamw-8bit",
                           L.zero >= 1 ? fmt::format("--zero {}", L.zero) : L.tp > 1 ? fmt::format("--tp {}", L.tp)
                                                                           : std::string("--offload"));
    const bool offloads = L.offload != Offload::none || L.offload_acts;
    if (offloads && backend && backend->host_memory() && r.offload_dir.empty())
        return fmt::format("--offload {} on the CPU backend: its device memory is the host's, so what moves can only "
                           "go to files; add --offload-dir DIR (a fast local disk)", offload_flag(L));
    if (offloads && backend && !backend->host_memory() && !r.offload_dir.empty())
        return fmt::format("--offload-dir {} with --device cuda: the states go to pinned host memory on a GPU (files "
                           "are for the CPU backend for now); drop --offload-dir", r.offload_dir);
    if (r.master_weights == MasterWeights::bf16_sr && (r.compute != DType::bf16 || r.precision_auto))
        return fmt::format("--master-weights bf16-sr rounds the weights to bf16 stochastically: it needs --precision "
                           "bf16 (this run computes in {})", r.precision_auto ? "auto" : precision_name(r.compute));
    if (r.master_weights == MasterWeights::bf16_sr && r.lora.rank > 0)
        return std::string("--master-weights bf16-sr with LoRA: the adapters are small, keep their fp32 master "
                           "weights (--master-weights fp32)");
    if (r.precision_auto && !r.fit_auto)
        return std::string("--precision auto needs --fit auto (it lets the search choose the precision)");
    if ((L.tp > 1 || L.pp > 1) && r.fit_auto)
        return std::string("--fit auto searches one rank's micro-batch, precision and recomputation; with --tp or "
                           "--pp set them yourself (memfit plan --tp T --pp P shows what fits)");
    if (r.attention == Attention::flash && backend && !backend->runs_flash_attention(cfg.head_dim()))
        return fmt::format("--attention flash: {}; use --attention naive", backend->flash_attention_refusal(cfg.head_dim()));
    // ZeRO-3 gathers one layer's weights at a time.
    const RecomputePolicy::Kind kind = r.recompute.info().kind;
    if (L.zero >= 3 && (kind == RecomputePolicy::segments || kind == RecomputePolicy::sqrt_segments) &&
        recompute_plan(r.recompute, cfg.n_layer).segment >= 2)
        return std::string("--zero 3 gathers each layer's weights just before its backward, but --recompute every:K "
                           "and sqrt recompute whole segments at once; use --recompute none, selective or full with it");
    // Cross-layer sharing: one stored block serves G layers.
    if (cfg.share_layers > 1) {
        const std::string with = L.pp > 1 ? "--pp" : r.lora.rank > 0 ? "LoRA" : "";
        if (!with.empty())
            return fmt::format("--share-layers {} with {}: shared blocks train with data and tensor parallelism "
                               "and ZeRO for now (a pipeline's stages are cut in layers, not in groups of shared "
                               "ones; LoRA's adapters are per layer); drop one of the two", cfg.share_layers, with);
    }
    // Distillation: the teacher runs whole beside each rank's student.
    if (!r.distill.teacher.empty() && (L.tp > 1 || L.pp > 1))
        return fmt::format("--teacher with --{} {}: the teacher runs whole on every rank and its logits meet the "
                           "student's whole vocabulary; distill with data parallelism (and ZeRO)",
                           L.tp > 1 ? "tp" : "pp", L.tp > 1 ? L.tp : L.pp);
    // N:M sparsity prunes whole-model weights on the host (every layout gathers them) and masks the
    // updates element by element, so it combines with every layout; not with LoRA's frozen base.
    if (std::string why = sparsity_refusal(cfg, r.sparsity, r.lora.rank > 0); !why.empty()) return why;
    if (std::optional<std::string> why = dora_refusal(r, cfg)) return why;
    // LoRA on the LM head: computed whole, on one rank's last stage, without dropout (for now).
    if (r.lora.rank > 0 && (L.tp > 1 || L.pp > 1 || r.lora.dropout > 0)) {
        bool head = false;
        try {
            for (const auto & t : parse_lora_targets(cfg, r.lora.targets)) head |= t == "lm_head" || t == "embed_tokens";
        } catch (const ConfigError & e) {
            return std::string(e.what());
        }
        if (head)
            return fmt::format("--lora-targets lm_head or embed_tokens with {}: their adapters run whole, undivided "
                               "and without dropout, for now; adapt the blocks only, or drop {}",
                               L.tp > 1 ? "--tp" : L.pp > 1 ? "--pp" : "--lora-dropout",
                               L.tp > 1 ? "--tp" : L.pp > 1 ? "--pp" : "--lora-dropout");
    }
    // Tensor (and sequence) parallelism.
    if (L.tp > 1) {
        if (const LlamaType * t = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr; t && t->fused && r.lora.rank > 0)
            return fmt::format("--tp {} with LoRA on {} ({}): the adapters of its fused qkv_proj and gate_up_proj are not "
                               "split over tensor ranks yet; use data parallelism (--zero 3 shards the base)", L.tp,
                               cfg.name, cfg.model_type);
        // A KV head several tensor ranks hold: its gradient is summed over them (step.h), its
        // adapter's is not.
        bool kv_adapted = false;
        if (r.lora.rank > 0 && L.tp > cfg.kv_heads()) try {
            for (const auto & t : parse_lora_targets(cfg, r.lora.targets)) kv_adapted |= t == "k" || t == "v" || t == "c_attn";
        } catch (const ConfigError & e) {
            return std::string(e.what());
        }
        if (kv_adapted)
            return fmt::format("--tp {} with LoRA on k or v: the model's {} KV heads are each held by several tensor "
                               "ranks; adapt q,o,gate,up,down, or use --tp {} or less", L.tp, cfg.kv_heads(),
                               cfg.kv_heads());
        try {
            ModelConfig sized = cfg;   // a small preset learns its vocabulary from the data, later
            if (sized.vocab_size == 0) sized.vocab_size = L.tp;
            tp_local_config(sized, L.tp);
        } catch (const ConfigError & e) {
            return std::string(e.what());
        }
    }
    if (r.mlp_chunk > 0 && r.lora.rank > 0)
        return fmt::format("--mlp-chunk {} with LoRA: the tiled MLP runs dense projections only (the adapters' "
                           "buffers hold whole micro-batches); drop --mlp-chunk (or use --recompute to save the MLP's "
                           "activations)", r.mlp_chunk);
    // The vocabulary-parallel embedding adds positions 0 .. T-1, not each document's.
    if (r.packing && L.tp > 1 && !cfg.llama())
        return fmt::format("--packing with --tp {}: model '{}' learns absolute positions, which the tensor-parallel "
                           "embedding does not restart at each document; drop --packing (one conversation per row) "
                           "or --tp, or use a LLaMA-family model (RoPE)", L.tp, cfg.name);
    if (auto why = context_parallel_refusal(r, cfg)) return why;
    if (L.sp && L.tp <= 1) return std::string("--sp splits the sequence over the tensor group: it needs --tp 2 or more");
    if (L.sp && (int64_t(r.micro_batch) * r.seq) % L.tp != 0)
        return fmt::format("--sp: the micro-batch's {} x {} = {} tokens do not divide over the {} tensor ranks; pick "
                           "--batch or --seq so that they do", r.micro_batch, r.seq, int64_t(r.micro_batch) * r.seq,
                           L.tp);
    // Pipeline parallelism.
    if (L.pp > 1) {
        if (L.schedule == PipeSchedule::interleaved && r.grad_accum % L.pp != 0)
            return fmt::format("--schedule interleaved:{} sends micro-batches through the stages {} at a time: "
                               "--grad-accum {} must be a multiple of --pp {}", L.virtual_stages, L.pp, r.grad_accum,
                               L.pp);
        try {
            check_pipeline(cfg, L.pp, L.schedule == PipeSchedule::interleaved ? L.virtual_stages : 1);
        } catch (const ConfigError & e) {
            return std::string(e.what());
        }
    }
    return std::nullopt;
}

ModelConfig run_model(const RunConfig & r) {
    ModelConfig cfg = resolve_model(r.model);
    if (r.share_layers > 1) {
        if (r.share_layers > cfg.n_layer)
            throw ConfigError(fmt::format("--share-layers {}: model '{}' has {} blocks; a group holds at most all of "
                                          "them", r.share_layers, cfg.name, cfg.n_layer));
        cfg.share_layers = r.share_layers;
    }
    for (const auto & [flag, v, coef] : {std::tuple{"--moe-aux-loss-coeff", r.moe_aux_loss_coeff, &cfg.moe.aux_coef},
                                         std::tuple{"--moe-z-loss-coeff", r.moe_z_loss_coeff, &cfg.moe.z_coef}}) {
        if (v < 0) continue;
        if (!cfg.moe.enabled())
            throw ConfigError(fmt::format("{} {:g}: model '{}' has no experts (a mixture of experts' router loss)", flag,
                                          v, cfg.name));
        *coef = v;
    }
    if (r.attention_window == 0) return cfg;
    if (r.attention_window < 0)
        throw ConfigError(fmt::format("--attention-window {}: must be positive (0: the model's own)", r.attention_window));
    const LlamaType * type = cfg.llama() ? find_llama_type(cfg.model_type) : nullptr;
    if (!type || !type->windowed_as)
        throw ConfigError(fmt::format("--attention-window {}: model '{}' ({}) has no sliding-window form that Hugging "
                                      "Face loads; use a llama, mistral or phi3 model",
                                      r.attention_window, cfg.name, cfg.llama() ? cfg.model_type : cfg.family));
    cfg.model_type = type->windowed_as;
    cfg.sliding_window = r.attention_window;
    return cfg;
}

void check_supported(const RunConfig & r, const ModelConfig & cfg, const Backend * backend) {
    if (auto why = unsupported(r, cfg, backend)) throw ConfigError(*why);
}

}  // namespace memfit
