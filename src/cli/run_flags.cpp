#include "cli/run_flags.h"

#include <fmt/format.h>

#include "cli/config_file.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/units.h"
#include "model/config.h"

namespace memfit::cli {

bool RunFlags::given(const std::string & name) const {
    const auto it = options.find(name);
    return it != options.end() && it->second->count() > 0;
}

namespace {

// A typed flag: the text goes through `parse` (one of run_config.h's) into the field.
template <class F>
CLI::Option * typed(CLI::App * c, const std::string & flag, F parse, const std::string & shown,
                    const std::string & help) {
    return c->add_option_function<std::string>(flag, parse, help)->default_str(shown)->type_name("TEXT");
}

}  // namespace

RunFlags add_run_flags(CLI::App * c, RunConfig & r, RunFlagSet which) {
    RunFlags f;
    add_config_flag(c);
    auto keep = [&](CLI::Option * o) {
        f.options[o->get_lnames().front()] = o;   // "sp" for "--sp,!--no-sp"
        return o;
    };
    keep(c->add_option("--model", r.model,
                       "preset (" + fmt::format("{}", fmt::join(preset_names(), ", ")) +
                           "), a Hugging Face config.json (GPT-2 or LLaMA), or a folder holding one and its weights")
             ->capture_default_str());
    keep(c->add_option("--seq", r.seq, "tokens per sequence (activations grow with it; naive attention's with its "
                                       "square)")
             ->capture_default_str()->check(kPositive));
    keep(c->add_flag("--packing,!--no-packing", r.packing,
                     "instruction data (memfit prepare --format jsonl): pack several conversations into each --seq "
                     "row, none attending to another and each with positions from 0 (TRL's packing; 4 bytes per "
                     "token of document starts); default: one conversation per row, padded"));
    // The batch: any two of the three give the third.
    keep(c->add_option("--micro-batch", r.micro_batch,
                       "sequences per forward/backward on each data-parallel rank (DeepSpeed's "
                       "train_micro_batch_size_per_gpu); activations grow with it")
             ->default_str("8")->check(kPositive));
    keep(c->add_option("--grad-accum", r.grad_accum,
                       "micro-batches accumulated per optimizer step (gradients in fp32 when > 1: under --zero 2/3 "
                       "the shard, each micro-batch reduce-scattered into it; no extra activations)")
             ->default_str("1")->check(kPositive));
    keep(c->add_option("--global-batch", r.global_batch,
                       "sequences per optimizer step: micro-batch x grad-accum x data-parallel ranks (give any two of "
                       "the three)")
             ->check(kPositive));
    keep(c->add_option("--batch", r.batch,
                       "sequences per micro-step over all data-parallel ranks, split evenly (the same as "
                       "--micro-batch in one process)")
             ->check(kPositive));
    keep(typed(c, "--precision",
               [&r](const std::string & v) {
                   r.precision_auto = v == "auto";
                   if (!r.precision_auto) r.compute = parse_precision(v);
               },
               precision_name(r.compute),
               "fp32, bf16 or fp16 (16-bit weights and activations, fp32 master weights and AdamW moments; fp16 adds "
               "dynamic loss scaling); auto lets --fit auto choose"));
    keep(typed(c, "--attention", [&r](const std::string & v) { r.attention = parse_attention(v); },
               attention_name(r.attention),
               "flash (tiled, saves one log-sum-exp per query), naive (saves the T x T probabilities), or auto: flash "
               "where the device's kernels take the model's head dimension (the CUDA ones: 32, 64, 96, 128)"));
    keep(c->add_option("--attention-window", r.attention_window,
                       "sliding-window attention: each query attends to its last W keys (Mistral's sliding_window; "
                       "flash skips the tiles outside it, attention FLOPs grow as T x W); a llama model trained with "
                       "it exports as MistralForCausalLM (0: the model's own)")
             ->capture_default_str()->check(kNonNegative));
    keep(c->add_option("--moe-aux-loss-coeff", r.moe_aux_loss_coeff,
                       "a mixture of experts: the load-balancing loss's coefficient in the training loss (Megatron-LM's "
                       "flag; transformers' router_aux_loss_coef); default: the model's own (its router_aux_loss_coef "
                       "when its config.json has output_router_logits true, else 0)"));
    keep(c->add_option("--moe-z-loss-coeff", r.moe_z_loss_coeff,
                       "a mixture of experts: the router z-loss's coefficient (ST-MoE's mean squared log-sum-exp of "
                       "the router logits; Megatron-LM's flag); default: the model's own router_z_loss_coef, else 0"));
    keep(c->add_option("--share-layers", r.share_layers,
                       "cross-layer parameter sharing (ALBERT): groups of G consecutive blocks share one set of "
                       "weights, dividing the blocks' parameters, gradients and optimizer states by G (compute is "
                       "unchanged); export writes the blocks expanded (0: none)")
             ->capture_default_str()->check(kNonNegative));
    keep(typed(c, "--sparsity",
               [&r](const std::string & v) {
                   const int start = r.sparsity.start;
                   // Given alone, CLI11 hands a value-optional option its default string: empty, so the
                   // bare flag is the 2:4 pattern (the default, off, is in the help).
                   r.sparsity = parse_sparsity(v.empty() ? "2:4" : v);
                   r.sparsity.start = start;
               },
               "",
               "N:M structured sparsity (2:4 when given alone; default off): once --sparsity-start updates are in, "
               "every block projection keeps the N largest-magnitude weights of each M consecutive inputs, and "
               "every later update keeps the rest at zero (no memory: the zeros are the mask)")
             ->expected(0, 1));
    keep(c->add_option("--sparsity-start", r.sparsity.start,
                       "with --sparsity: dense optimizer updates before the prune (0: prune the starting weights)")
             ->capture_default_str()->check(kNonNegative));
    keep(typed(c, "--loss-chunk", [&r](const std::string & v) { r.loss_chunk = parse_loss_chunk(v); },
               r.loss_chunk < 0 ? "auto" : std::to_string(r.loss_chunk),
               "tokens per LM-head + cross-entropy chunk: the B*T*V logits are never stored whole; 0: unchunked; "
               "auto: chunked (an eighth of the tokens, at least 512) when the fp32 logits would take 64 MiB and a "
               "quarter of the step's planned peak, the choice printed"));
    keep(c->add_option("--mlp-chunk", r.mlp_chunk,
                       "TiledMLP: tokens per MLP chunk; the MLP's [B*T, 4C] intermediates exist one chunk at a time "
                       "and are recomputed in backward (one more MLP up-projection and activation per step; for long "
                       "sequences: pair with --attention flash, --recompute full and --loss-chunk) (0: untiled)")
             ->capture_default_str()->check(kNonNegative));
    keep(typed(c, "--recompute", [&r](const std::string & v) { r.recompute = Recompute(v); }, r.recompute.name(),
               "activation recomputation: " + recompute_help()));
    keep(typed(c, "--optimizer", [&r](const std::string & v) { r.optimizer = parse_optimizer(v); },
               optimizer_name(r.optimizer),
               "the optimizer, one of " + optimizer_choices() +
                   ": adamw, 8 bytes of moments per trainable parameter; adamw-bf16, 4: the moments stored in "
                   "bf16; adamw-8bit, 2.03: one byte per moment in blocks of 256 with a scale each (the moments "
                   "are updated in fp32); adafactor, a row and a column statistic per matrix (Shazeer & Stern; "
                   "a first moment only with --adafactor-beta1, --lr fixed by the schedule; --zero 0 only); sgd, 4: PyTorch's SGD with "
                   "--momentum; galore-adamw and galore-adamw-8bit: AdamW (fp32 or 8-bit moments) on the blocks' "
                   "projection matrices' gradients projected to rank --galore-rank (Zhao et al. 2024; the CPU "
                   "backend, --zero 0 only), the other parameters plain AdamW"));
    keep(c->add_option("--adafactor-beta1", r.adafactor_beta1,
                       "--optimizer adafactor: its first moment's decay (transformers' beta1: an average of the "
                       "clipped updates, 4 bytes per parameter more); 0: none, the default")
             ->capture_default_str()->check(finite_range(0.0, 0.999999)));
    keep(c->add_option("--galore-rank", r.galore_rank,
                       "--optimizer galore-adamw[-8bit]: the rank r of the projected gradients; a projection matrix "
                       "whose shorter side is below 2r keeps full AdamW moments")
             ->capture_default_str()->check(kPositive));
    keep(c->add_flag("--optimizer-in-backward,!--no-optimizer-in-backward", r.optimizer_in_backward,
                     "fuse the optimizer step into the backward (torchtune's optimizer_in_bwd): each layer is updated "
                     "as soon as its gradients are whole and they are freed, so the gradients take about one layer's "
                     "bytes plus the embedding's and head's instead of the model's; no gradient clipping (--clip 0), "
                     "accumulation (--grad-accum 1), fp16, --tp, --pp or --offload"));
    // LoRA (model/lora.h).
    keep(c->add_option("--lora-rank", r.lora.rank,
                       "LoRA: freeze the base and train rank-R adapters on --lora-targets (0: train every parameter)")
             ->capture_default_str()->check(kNonNegative));
    keep(c->add_option("--lora-alpha", r.lora.alpha, "LoRA: the adapters' output is scaled by alpha / rank")
             ->capture_default_str()->check(kPositive));
    keep(c->add_option("--lora-targets", r.lora.targets,
                       "LoRA: modules to adapt, q,k,v,o,gate,up,down or all (GPT-2: c_attn, c_proj, c_fc), and "
                       "lm_head, embed_tokens for an untied model (embed_tokens,all,lm_head: everything; default: all "
                       "when --model is a folder with weights, else q,v | c_attn)"));
    keep(c->add_option("--lora-dropout", r.lora.dropout,
                       "LoRA: dropout probability on the adapters' input while training (0: none)")
             ->capture_default_str()->check(finite_range(0, 0.999999)));
    keep(c->add_option("--lora-variant", r.lora.variant,
                       "LoRA: lora, or dora (DoRA, PEFT's use_dora: each adapted output row renormalised and scaled "
                       "by a trained magnitude, the norm detached; block projections, no dropout; QDoRA with "
                       "--base-weights nf4)")
             ->capture_default_str()->check(CLI::IsMember({"lora", "dora"})));
    keep(c->add_flag("--use-rslora,!--no-use-rslora", r.lora.rslora,
                     "LoRA: rank-stabilized scaling alpha / sqrt(rank) instead of alpha / rank (PEFT's and Unsloth's "
                     "use_rslora; Kalajdzievski 2023); default off"));
    keep(c->add_option("--base-weights", r.lora.base_weights,
                       "LoRA: storage of the frozen base: the compute precision (bf16, fp16, fp32), int8 "
                       "(per-channel), nf4 (4-bit NormalFloat, blocks of 64, double-quantized scales as QLoRA: see --nf4-double-quant) or "
                       "sparse24 (2:4 structured sparse: the 2 largest of every 4 inputs as bf16 with 2-bit "
                       "positions, 0.5625x of bf16; lossless for a --sparsity 2:4 model); gptq is implied by a GPTQ folder "
                       "(memfit quantize) and plans 4-bit groups of 128 elsewhere")
             ->capture_default_str());
    keep(c->add_option("--nf4-double-quant", r.lora.nf4_double_quant,
                       "nf4 (--base-weights, --teacher-weights): quantize the blocks' absmaxes too, QLoRA's double "
                       "quantization: 0.127 instead of 0.5 bits per parameter; false keeps them fp32, as bitsandbytes' "
                       "bnb_4bit_use_double_quant=False")
             ->capture_default_str());
    // Knowledge distillation (model/distill.h).
    keep(c->add_option("--teacher", r.distill.teacher,
                       "knowledge distillation: a frozen teacher (a folder with weights, as --model takes, with the "
                       "student's vocabulary) runs forward on every batch; the loss becomes (1 - alpha) * "
                       "cross-entropy + alpha * T^2 * KL(teacher || student) at temperature T, chunked with the LM "
                       "head; validation reports the plain cross-entropy"));
    keep(c->add_option("--distill-alpha", r.distill.alpha, "distillation: the KL term's weight alpha, 0 to 1")
             ->capture_default_str()->check(kFraction));
    keep(c->add_option("--distill-temperature", r.distill.temperature,
                       "distillation: the temperature T that softens both models' distributions (> 0)")
             ->capture_default_str()->check(kPositive));
    keep(c->add_option("--teacher-weights", r.distill.weights,
                       "distillation: storage of the teacher's weights: the compute precision, int8 (per-channel), "
                       "nf4 (4-bit NormalFloat, as a QLoRA base) or sparse24 (2:4 sparse, bf16 values)")
             ->capture_default_str());
    // Preference tuning (model/preference.h).
    keep(c->add_option("--objective", r.pref.objective,
                       "what the run minimises: lm (the next token's cross-entropy: pretraining and SFT) or dpo "
                       "(Direct Preference Optimization on `memfit prepare --format preference` data: rows 2i and "
                       "2i+1 of a batch are a prompt's chosen and rejected answers, so batches hold an even number "
                       "of rows)")
             ->capture_default_str()->check(CLI::IsMember({"lm", "dpo"})));
    keep(c->add_option("--dpo-beta", r.pref.beta,
                       "dpo: beta, how far the policy may move from the reference (TRL's default 0.1)")
             ->capture_default_str()->check(kPositive));
    keep(c->add_option("--dpo-loss", r.pref.loss,
                       "dpo: the loss over each pair's margin, TRL's loss_type: sigmoid (DPO), ipo (on the answers' "
                       "mean log-probabilities) or hinge (SLiC)")
             ->capture_default_str()->check(CLI::IsMember({"sigmoid", "ipo", "hinge"})));
    keep(c->add_option("--dpo-label-smoothing", r.pref.label_smoothing,
                       "dpo, sigmoid loss: the share of pairs assumed mislabelled (cDPO), 0 to below 0.5")
             ->capture_default_str());
    keep(c->add_option("--reference", r.pref.reference,
                       "dpo: the frozen reference the policy is compared with: adapters-off (LoRA's base with the "
                       "adapters switched off: no extra weights, a second forward), precompute (the starting model's "
                       "log-probabilities computed once before training and kept beside the data: no extra "
                       "weights or forward), copy (a frozen copy of the starting model, see --reference-weights); "
                       "auto: adapters-off under LoRA, else copy")
             ->capture_default_str()->check(CLI::IsMember({"auto", "adapters-off", "precompute", "copy"})));
    keep(c->add_option("--reference-weights", r.pref.weights,
                       "dpo, --reference copy: the copy's storage: compute (the run's precision), bf16, int8 "
                       "(per-channel) or nf4 (4-bit, as a QLoRA base)")
             ->capture_default_str()->check(CLI::IsMember({"compute", "bf16", "int8", "nf4"})));
    if (which.layout) {
        keep(c->add_option("--zero", r.layout.zero,
                           "data parallel (mpirun -np N): ZeRO stage 0 (every rank holds everything), 1 (shard fp32 "
                           "master weights and optimizer states over the ranks), 2 (also gradients), 3 (also the "
                           "parameters)")
                 ->capture_default_str()->check(kNonNegative));
        keep(c->add_option("--tp", r.layout.tp,
                           "tensor parallel (Megatron-LM): split every block's heads and MLP width, the embedding "
                           "and the LM head over groups of this many consecutive ranks; the heads, KV heads and MLP "
                           "width must divide by it")
                 ->capture_default_str());
        keep(c->add_option("--cp", r.layout.cp,
                           "context parallel (Megatron-Core's --context-parallel-size): split every sequence over "
                           "groups of this many ranks, each holding two mirrored chunks of it; attention gathers the "
                           "group's keys and values (--seq a multiple of 2 x cp; world = tp x cp x dp x pp)")
                 ->capture_default_str());
        keep(c->add_option("--ep", r.layout.ep,
                           "expert parallel (a mixture of experts; Megatron-Core's --expert-model-parallel-size): "
                           "each group of this many consecutive data-parallel ranks holds every expert once (each "
                           "rank 1/ep of them) and exchanges the routed tokens all-to-all; divides the "
                           "data-parallel ranks and the experts")
                 ->capture_default_str());
        keep(c->add_option("--moe-capacity-factor", r.moe_capacity_factor,
                           "with --ep: the most routed rows a rank sends each expert, as a factor of its even share "
                           "(Megatron-LM's flag); rows past it are dropped and counted (moe/dropped); 0: 1.25")
                 ->capture_default_str()->check(kNonNegative));
        keep(c->add_option("--moe-token-drop-policy", r.moe_token_drop_policy,
                           "with --ep: which of an expert's rows past the capacity are dropped: probs (its least "
                           "probable, by routing weight) or position (its last in token order); Megatron-LM's flag")
                 ->capture_default_str());
        keep(c->add_option("--cp-comm-type", r.cp_comm_type,
                           "with --cp: all_gather (each layer gathers the group's keys and values whole, Llama 3's "
                           "way) or p2p (they pass around the group as a ring, a block at a time, each merged into "
                           "the running softmax: two blocks held instead of the whole sequence's)")
                 ->capture_default_str());
        keep(c->add_flag("--sp,!--no-sp", r.layout.sp,
                         "sequence parallel (with --tp): norms and residual adds run on 1/tp of the tokens, with "
                         "all-gathers and reduce-scatters in place of the all-reduces (Korthikanti et al. 2022)"));
        keep(c->add_option("--pp", r.layout.pp,
                           "pipeline parallel: split the blocks into this many stages (embedding with the first, LM "
                           "head with the last, balanced by cost); each step's --grad-accum micro-batches flow "
                           "through them")
                 ->capture_default_str());
        keep(typed(c, "--schedule",
                   [&r](const std::string & v) { r.layout.schedule = parse_schedule(v, &r.layout.virtual_stages); },
                   schedule_spelling(r.layout),
                   "pipeline schedule: gpipe (every forward, then every backward: all micro-batches' activations "
                   "live at once), 1f1b (at most P - s micro-batches in flight on stage s) or interleaved:V (V model "
                   "chunks per stage, a smaller bubble; --grad-accum a multiple of --pp)"));
        keep(typed(c, "--offload", [&r](const std::string & v) { parse_offload_flag(v, r.layout); },
                   offload_flag(r.layout),
                   "none, optimizer (fp32 master weights and optimizer states off the device: pinned host "
                   "memory on a GPU, files under --offload-dir; staged through the device for the update), "
                   "optimizer+params (also the weights' ZeRO-3 shard, read a layer ahead of each gather and written "
                   "by the update: needs --zero 3; the gradient shard stays on the device), activations (each "
                   "layer's saved activations leave the device after its forward and come back a layer ahead of "
                   "its backward: torchtune's activation offloading), or either optimizer value +activations"));
        keep(c->add_option("--offload-activations-layers", r.offload_activation_layers,
                           "with --offload activations: offload the saved activations of the first N layers only "
                           "(0: every layer's)")
                 ->capture_default_str());
        keep(typed(c, "--master-weights", [&r](const std::string & v) { r.master_weights = parse_master_weights(v); },
                   master_weights_name(r.master_weights),
                   "with --precision bf16: fp32 (an fp32 master copy of the weights, 4 bytes per parameter) or "
                   "bf16-sr (none: AdamW updates the bf16 weights in place with stochastic rounding, so small "
                   "updates are kept in expectation)"));
        keep(c->add_option("--offload-fraction", r.offload_fraction,
                           "with --offload optimizer: the share of each rank's master weights and moments offloaded, "
                           "from the first parameter on in whole units (2^18 elements; past a shard of 64 Mi elements about "
                           "a 256th of it, at most 4 Mi), so slightly more than F (Megatron's "
                           "--optimizer-offload-fraction)")
                 ->capture_default_str());
        keep(c->add_option("--offload-dir", r.offload_dir,
                           "with --offload: keep the offloaded states (weights, activations) in a file under this "
                           "directory (created there, unlinked at once, its blocks allocated at start), read and "
                           "written by an I/O thread: ZeRO-Infinity's NVMe offload; the CPU backend's only place"));
    }
    if (which.execution) {
        keep(c->add_option("--device", r.device,
                           "cpu, or cuda (NVIDIA GPU; under mpirun each rank takes the GPU of its local rank, and "
                           "gradients move over NCCL)")
                 ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"})));
        keep(typed(c, "--memory-budget",
                   [&r](const std::string & v) {
                       r.budget = parse_bytes(v);
                       if (r.budget == 0)
                           throw ConfigError(fmt::format("--memory-budget {}: must be more than 0 bytes (leave it out "
                                                         "for the memory available)", v));
                   },
                   "",
                   "refuse to start unless the plan fits in this many bytes (e.g. 512MiB, 2GiB; default: the memory "
                   "available)"));
        keep(typed(c, "--fit",
                   [&r](const std::string & v) {
                       if (v != "off" && v != "auto")
                           throw ConfigError(fmt::format("--fit '{}': expected off or auto", v));
                       r.fit_auto = v == "auto";
                   },
                   r.fit_auto ? "auto" : "off",
                   "auto: choose micro-batch, accumulation (keeping the global batch), attention, recomputation, "
                   "loss chunk and (with --precision auto) precision for the highest predicted throughput that fits "
                   "--memory-budget"));
        keep(c->add_option("--loss-scale", r.loss_scale,
                           "fp16: a static loss scale (0: dynamic, halved on overflow and doubled after "
                           "--loss-scale-window clean steps; DeepSpeed's fp16.loss_scale)")
                 ->capture_default_str()->check(kNonNegative));
        keep(c->add_option("--initial-loss-scale", r.initial_loss_scale,
                           "fp16: the dynamic scale's start (DeepSpeed: 2^initial_scale_power)")
                 ->capture_default_str()->check(kPositive));
        keep(c->add_option("--loss-scale-window", r.loss_scale_window,
                           "fp16: clean steps before the dynamic scale doubles")
                 ->capture_default_str()->check(kPositive));
        keep(c->add_option("--min-loss-scale", r.min_loss_scale, "fp16: the dynamic scale is never halved below this")
                 ->capture_default_str()->check(kPositive));
        keep(c->add_option("--clip", r.clip, "clip gradients to this global L2 norm before the update (0: off)")
                 ->capture_default_str()->check(kNonNegative));
        keep(typed(c, "--seed",
                   [&r](const std::string & v) {
                       if (!is_seed(v))
                           throw ConfigError(fmt::format("--seed {}: expected a whole number from 0 to "
                                                         "9999999999999999999", v));
                       r.seed = std::stoull(v);
                   },
                   std::to_string(r.seed), "random seed"));
        keep(c->add_option("--threads", r.threads, "CPU threads (0: all cores)")->check(kNonNegative));
        if (which.layout)
            keep(c->add_option("--bucket-mb", r.bucket_mb,
                               "data parallel: gradients are reduced in buckets of at least this many MiB of "
                               "adjacent blocks (0: one bucket per transformer block)")
                     ->capture_default_str()->check(kNonNegative));
    }
    return f;
}

}  // namespace memfit::cli
