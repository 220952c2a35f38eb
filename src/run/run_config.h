// The run's configuration, one typed vocabulary for `memfit train`, `profile`, `bench` and
// `plan` (and `--config FILE`): what runs, on how many devices, with which memory techniques.
// Every field has its default and one line of what it costs in memory. The flags and config
// keys are the fields' names (cli/run_flags.cpp); compat.h says which combinations run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backend/optimizer.h"
#include "core/dtype.h"
#include "model/pipeline.h"
#include "model/recompute.h"
#include "model/sparsity.h"

namespace memfit {

enum class Attention { auto_, flash, naive };
enum class Offload { none, optimizer, optimizer_params };
enum class MasterWeights { fp32, bf16_sr };

// How N = dp x tp x pp devices split the run (tensor parallel innermost: the ranks of one node
// share a tensor group).
struct Layout {
    int dp = 1;                    // data-parallel copies: activations / dp per device at a fixed global batch
    int tp = 1;                    // tensor parallel: weights, gradients, states and most activations / tp
    int pp = 1;                    // pipeline stages: model states / pp; in-flight micro-batches' activations
    int zero = 0;                  // 0..3: 1 shards master weights + optimizer states / dp, 2 + gradients, 3 + weights
    Offload offload = Offload::none;  // optimizer (+ params): those bytes move to host memory
    bool sp = false;               // sequence parallel (with tp > 1): norm and residual activations / tp
    PipeSchedule schedule = PipeSchedule::one_f_one_b;  // gpipe holds all m micro-batches, 1F1B at most pp
    int virtual_stages = 1;        // interleaved: model chunks per device (smaller bubble, more sends)
    // --offload activations (with or beside optimizer): each layer's saved activations wait on
    // the host between its forward and its backward (model/activation_offload.h).
    bool offload_acts = false;
    // Context parallel (model/context_parallel.h): each sequence split over cp ranks, which share
    // it (dp counts groups of sequences: world = tp x cp x dp x pp).
    int cp = 1;
    // Expert parallel (a mixture of experts; Megatron-Core's --expert-model-parallel-size): each
    // group of ep consecutive data ranks holds each expert once, E / ep on a rank, and exchanges the
    // routed tokens all-to-all; ep divides the data ranks (not a factor of devices()). Planned only:
    // memfit train keeps every expert on every rank (run/compat.cpp).
    int ep = 1;
    int devices() const { return dp * cp * tp * pp; }
    int data_ranks() const { return dp * cp; }   // the gradients' group (ZeRO shards over it)
};

// LoRA / QLoRA (model/lora.h): only rank-r adapters train.
struct LoraConfig {
    int rank = 0;                       // 0: every parameter trains (states for all of them)
    float alpha = 16;
    std::string targets;                // "": the family's default (q,v | c_attn)
    std::string base_weights = "compute";  // frozen base storage: compute | fp32 | bf16 | fp16 | int8 | nf4 (1/8 of fp32) | sparse24 (0.5625 of bf16) | gptq
    // nf4 (the base's and the teacher's): the blocks' absmaxes quantized too (QLoRA's double
    // quantization: 0.127 instead of 0.5 bits per parameter); false keeps them fp32, the default of
    // bitsandbytes and transformers (bnb_4bit_use_double_quant=False).
    bool nf4_double_quant = true;
    float dropout = 0;
    // lora | dora (PEFT's use_dora: a trainable magnitude per output row, model/lora.h).
    std::string variant = "lora";
    bool rslora = false;   // --use-rslora: scale alpha / sqrt(rank) (PEFT's use_rslora)
    // base_weights gptq: bits and group size (a GPTQ folder's own replace them; else the Hub's usual).
    int gptq_bits = 4, gptq_group = 128;
};

// Knowledge distillation (model/distill.h): a frozen teacher's softened predictions as a second
// target, loss (1 - alpha) * CE + alpha * T^2 * KL.
struct DistillConfig {
    std::string teacher;                     // a --model folder with weights; "": no distillation
    float alpha = 0.5f;                      // the KL term's weight, [0, 1]
    float temperature = 1.0f;                // softens both distributions, > 0
    std::string weights = "compute";         // teacher storage: compute | fp32 | bf16 | fp16 | int8 | nf4
};

// Preference tuning (model/preference.h): --objective dpo, its loss and its reference.
struct PreferenceConfig {
    std::string objective = "lm";            // lm (next-token cross-entropy) | dpo
    float beta = 0.1f;                       // --dpo-beta, > 0
    std::string loss = "sigmoid";            // --dpo-loss: sigmoid | ipo | hinge (TRL's loss_type)
    float label_smoothing = 0.0f;            // --dpo-label-smoothing, [0, 0.5)
    std::string reference = "auto";          // auto | adapters-off | precompute | copy
    std::string weights = "compute";         // --reference-weights (copy): compute | bf16 | int8 | nf4
    bool dpo() const { return objective == "dpo"; }
};

struct RunConfig {
    std::string model = "micro";   // preset, Hugging Face config.json, or a folder with weights
    std::string device = "cpu";    // cpu | cuda
    int seq = 128;                 // tokens per sequence: activations grow with it (naive attention: squared)
    // Instruction data (documents with loss masks): several documents packed into each row, each
    // attending only within itself and with its own positions (a doc_start index per token, 4
    // bytes); false: one document per row, padded.
    bool packing = false;
    // The batch: any two of micro_batch, grad_accum and global_batch (0: unset) give the third
    // (resolve_batch). batch: the older --batch, sequences per micro-step over all data-parallel ranks.
    int micro_batch = 0;           // sequences per forward/backward per data-parallel rank: activations grow with it
    int grad_accum = 0;            // micro-batches per optimizer step: fp32 gradients when > 1, no activations
    int global_batch = 0;          // sequences per optimizer step = micro_batch x grad_accum x dp
    int batch = 0;
    DType compute = DType::f32;    // fp32 | bf16 | fp16: 16-bit halves weights and activations, adds fp32 masters
    bool precision_auto = false;   // --precision auto: --fit auto chooses
    Attention attention = Attention::auto_;  // flash: no T x T probabilities kept (one log-sum-exp per query)
    Recompute recompute;           // what the layers keep for backward (model/recompute.h)
    // Tokens per LM-head + loss chunk: the B x T x V logits never whole (0: off; -1: auto, chunked
    // when the logits would be a large share of the step's memory, plan/fit.h).
    int loss_chunk = -1;
    // Sliding-window attention: each query attends to its last W keys (Mistral's sliding_window;
    // 0: the model's own). A llama model trained with it is a mistral one (run_model).
    int attention_window = 0;
    // A mixture of experts' router losses (Megatron-LM's --moe-aux-loss-coeff, --moe-z-loss-coeff):
    // the coefficients of the load-balancing loss and the z-loss in the training loss (negative:
    // the model's own, config.json's router_aux_loss_coef when output_router_logits is true).
    float moe_aux_loss_coeff = -1, moe_z_loss_coeff = -1;
    // --moe-capacity-factor (Megatron-LM's): under expert parallelism a rank sends each expert at
    // most this factor times its even share of its routed rows, the rest dropped; 0: the default
    // (model/expert_parallel.h's kDefaultCapacityFactor).
    float moe_capacity_factor = 0;
    // --moe-token-drop-policy (Megatron-LM's): which of an expert's rows past the capacity go:
    // "probs" (the least probable; Megatron's default) or "position" (the last in token order).
    std::string moe_token_drop_policy = "probs";
    // ALBERT's cross-layer sharing: groups of this many consecutive blocks share one set of
    // weights, so the blocks' parameters, gradients and optimizer states divide by it (0 or 1:
    // none; the model's own when it was trained shared). A run_model change, like the window.
    int share_layers = 0;
    // N:M structured sparsity of the block projections (model/sparsity.h): pruned by magnitude
    // once sparsity.start updates are in, and kept so by every update after. No memory: the mask
    // is the zeros themselves.
    NmSparsity sparsity;
    // TiledMLP: tokens per MLP chunk; the [tokens, 4C] intermediates exist one chunk at a time and
    // are recomputed in backward (0: untiled).
    int mlp_chunk = 0;
    Optimizer optimizer = Optimizer::adamw;  // adamw: 8 bytes of moments per trainable parameter
    // The optimizer step fused into the backward (torchtune's optimizer_in_bwd): each layer's
    // parameters updated as soon as its gradients are whole, and those freed: the gradients'
    // bytes drop from the model's to about one layer's plus the embedding's and head's.
    bool optimizer_in_backward = false;
    // --galore-rank: GaLore's rank (--optimizer galore-adamw[-8bit]): each projection matrix's
    // moments are r x its longer side, its projector r x its shorter (backend/optimizer.h).
    int galore_rank = 128;
    // --adafactor-beta1: Adafactor's first moment (transformers' beta1), 0: none (its default).
    float adafactor_beta1 = 0.0f;
    // bf16 compute: fp32 master weights (4 bytes per parameter), or none: the bf16 weights updated
    // with stochastic rounding (bf16-sr)
    MasterWeights master_weights = MasterWeights::fp32;
    float clip = 0;                // global gradient-norm clipping (0: off): no memory
    // fp16 loss scaling (no memory): a static scale, or dynamic from initial_loss_scale, halved on
    // overflow (not below min_loss_scale) and doubled after loss_scale_window clean steps.
    float loss_scale = 0;          // 0: dynamic
    float initial_loss_scale = 65536;
    int loss_scale_window = 2000;
    float min_loss_scale = 1;
    Layout layout;                 // dp comes from the world size (mpirun -np N / (tp x pp))
    // --offload optimizer: the share of each rank's master weights and moments that leaves the
    // device (Megatron's --optimizer-offload-fraction), and where it goes: files under
    // offload_dir (ZeRO-Infinity's NVMe offload; the only place on the CPU backend), else pinned
    // host memory (CUDA).
    double offload_fraction = 1;
    std::string offload_dir;
    // --offload-activations-layers: with --offload activations, how many layers from the first
    // offload theirs (0: all; torchtune offloads all, Megatron's --cpu-offloading-num-layers some).
    int offload_activation_layers = 0;
    // --cp-comm-type (Megatron-Core's): all_gather (each layer's keys and values gathered whole)
    // or p2p (passed around the context group as a ring, a block at a time).
    std::string cp_comm_type = "all_gather";
    double bucket_mb = 0;          // data parallel: gradient bucket size, MiB (0: one per block)
    uint64_t budget = 0;           // bytes the plan must fit (0: the memory available)
    bool fit_auto = false;         // --fit auto: search micro-batch x accumulation x techniques within the budget
    LoraConfig lora;
    DistillConfig distill;
    PreferenceConfig pref;
    uint64_t seed = 1337;
    int threads = 0;               // 0: OpenMP's default
};

// Fills micro_batch, grad_accum and global_batch from the ones given for `dp` data-parallel
// ranks (defaults: micro-batch 8, accumulation 1). ConfigError (one line, the numbers and what
// would divide) when they disagree or do not divide.
void resolve_batch(RunConfig & r, int dp);

// The configuration as flags: {flag name without dashes: value}, what `--config` reads back
// (summary.json holds it under kRunConfigKey, resolved). Unset batch sizes are left out.
nlohmann::json run_config_json(const RunConfig & r);
inline constexpr const char * kRunConfigKey = "run_config";

// The names users write, one table each, for the flags, the config files and the reports.
// parse_*: ConfigError naming the choices.
DType parse_precision(std::string_view p);
std::string precision_name(DType compute);
Attention parse_attention(std::string_view a);
const char * attention_name(Attention a);
int parse_loss_chunk(std::string_view v);        // "auto" -> -1, else a count of tokens, 0 or more
Offload parse_offload(std::string_view o);
// --offload's whole value: the optimizer part (Layout::offload) and "activations" joined with '+'
// (activations, optimizer+activations, optimizer+params+activations); offload_flag writes it back.
void parse_offload_flag(std::string_view v, Layout & L);
std::string offload_flag(const Layout & L);
MasterWeights parse_master_weights(std::string_view m);
const char * master_weights_name(MasterWeights m);
const char * offload_name(Offload o);
// "gpipe" | "1f1b" | "interleaved:V", as --schedule takes it (model/pipeline.h parses it).
std::string schedule_spelling(const Layout & l);

}  // namespace memfit
