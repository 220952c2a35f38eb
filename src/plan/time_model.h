// The step-time model of `memfit plan`: seconds per optimizer step of one candidate on one kind of
// device, from FLOPs, bytes and collective volumes. Pure and O(1) in the layer count (no program
// is recorded), so that the search can evaluate tens of thousands of candidates per second.
//
// Everything is for the busiest device: the last pipeline stage, which holds ceil(L/pp) layers
// (interleaved: v chunks of ceil(L/(pp v)) layers) plus the LM head and the loss (the first
// stage's embedding lookup does no math). Tensor parallelism divides every matmul, the attention
// core (by heads) and the head (vocabulary-parallel) by tp. b = micro_batch, T = seq, C = n_embd,
// m = accum (micro-batches per step per rank; in flight for a pipeline), s = compute dtype bytes.
//
//   compute       forward matmuls 2 (C qkv_dim + C C + C fc_dim + ffn_dim C) FLOPs per token per
//                 layer and 2 C V for the head, backward twice that, at the hardware's matmul_eff of
//                 the peak. The attention core does what the kernels do: causal, 2 (T+1) C FLOPs per
//                 token forward (QK^T and AV over the lower triangle, as model/recompute.h counts
//                 it; with a sliding window W < T, 4 (W(W+1)/2 + (T-W) W) C per sequence: O(T W)), backward 2x (naive) or 2.5x (flash: 5 matmuls for the forward's 2, Dao
//                 2023); flash at attention_eff, naive at matmul_eff.
//   recompute     layer_keep_cost's FLOPs for the policy's keep mask (none: all kept; selective:
//                 kKeepSelective; full: only the layer input), per layer per micro-batch; its
//                 attention part at the attention efficiency. memfit's full policy keeps the layer
//                 output (the next layer's input), so it re-runs the forward except the MLP's down
//                 projection: +2/9 of the matmul FLOPs for GPT-2, not Megatron's +1/3.
//   memory_bound  elementwise traffic at bandwidth_eff x mem_bw, in elements of s bytes
//                 per token per layer: per norm 2C forward + 3C backward, per residual add 3C + 3C
//                 (both replicated over tp unless sp), GELU 2A + 3A or SwiGLU 3A + 5A (A =
//                 ffn_dim), RoPE 2R + 2R (R = (NH + KVH) head_dim), naive attention's T x T
//                 probabilities NH T (4 + 5) (scores, softmax, AV; dprobs, softmax backward);
//                 recomputed units add their forward traffic again; the loss reads and writes
//                 fp32 logits, kLossBytesPerLogit per vocabulary entry per token (split by tp).
//                 Plus the optimizer update on the device: per parameter of the shard, read and
//                 write the fp32 weights (master or the parameter itself) and the states (AdamW
//                 8, 8-bit AdamW 2, SGD momentum 4 bytes), read the gradient, write the s-byte
//                 weight when there is a master copy: 28 bytes for bf16 AdamW.
//   comm          ring collectives (Patarasuk & Yuan 2009): all-reduce moves 2 (n-1)/n of the
//                 payload per device in 2 (n-1) steps, reduce-scatter and all-gather (n-1)/n in n-1
//                 steps; time = volume / (kLinkEfficiency x link bandwidth) + steps x latency, per
//                 collective (gradient collectives go in kBucketBytes buckets, each paying its
//                 latency). Ranks are placed tp innermost, then dp, then pp, filling nodes of
//                 r = min(ceil(devices / nodes), per_node) devices; a group uses the inter-node
//                 link when it spans nodes (tp > r; tp dp > r; pp > 1 and devices > r). A group spanning
//                 nodes with k members per node crosses them at min(intra_bw, k inter_bw): NCCL
//                 runs one ring per NIC, so the node's k NICs carry the ring's flow in parallel
//                 (k = r for tp, r / tp for dp; 1 for a pipeline's point-to-point).
//     dp (ZeRO paper, Rajbhandari et al. 2020), payload Ψ = this device's parameters (the
//        busiest stage's, / tp; param_split as the memory model), gradients in g bytes (4 when
//        micro-batches accumulate in fp32, as the engine does, else s):
//        ZeRO-0 one all-reduce of Ψ g per step; ZeRO-1 a reduce-scatter of Ψ g per step, and an
//        all-gather of the updated Ψ s after the optimizer; ZeRO-2 a reduce-scatter of each
//        micro-batch's Ψ s gradients, and the all-gather; ZeRO-3 per micro-batch an all-gather of
//        Ψ s in forward and again in backward plus the reduce-scatter (1.5x ZeRO-0's volume). ZeRO-3
//        collectives go per layer (FSDP's unit) plus one for the embeddings and head, each paying
//        its latency per ring step.
//     tp (Megatron, Shoeybi et al. 2019): per layer per micro-batch 2 all-reduces of b T C s in
//        forward and 2 in backward, 2 more when full recompute re-runs the forward; with sp the
//        same volume as reduce-scatter + all-gather pairs (Korthikanti et al. 2022). Not hidden.
//     pp point-to-point: per micro-batch the stage's output activation forward and its input
//        gradient backward, b T C s each (/ tp with sp), v times as many when interleaved
//        (Narayanan et al. 2021). Not hidden.
//   comm_exposed  tp + pp + what dp leaves uncovered: a gradient reduction overlaps the backward
//                 it follows up to kOverlapFraction of that backward's math (ZeRO-0/1: once per
//                 step, under the last micro-batch's backward; ZeRO-2/3: each micro-batch's under
//                 its own backward); ZeRO-3's forward all-gather overlaps forward the same way;
//                 ZeRO-1/2's all-gather after the optimizer is exposed.
//   bubble        a pipeline step is m + p - 1 slots of which p - 1 idle (GPipe, Huang et al.
//                 2019; 1F1B has the same bubble, Narayanan et al. 2021), or (p-1)/v slots of v m
//                 chunk slots when interleaved: the bubble fraction f of the step is
//                 (p-1)/(m+p-1), resp. (p-1)/(v m + p - 1), so bubble = f / (1 - f) x the stage's
//                 busy time (compute + its memory-bound layer traffic + tp + pp communication):
//                 (p-1)/m, resp. (p-1)/(v m), of it.
//   offload       optimizer: what memfit's engine runs (train/step.h): the offloaded fp32 master
//                 weights (mixed precision) and moments of --offload-fraction of the shard (Ψ / dp
//                 with ZeRO >= 1, else Ψ) go up to the device and back over host_bw, unit by unit
//                 (the cpu entry's host_bw: the calibrated --offload-dir round trip), and the device
//                 updates them (the update stays in memory_bound). optimizer_params (ZeRO-3):
//                 all of the states as above, plus the weight shard: written by the update (s
//                 bytes a parameter; read too where it is the fp32 truth) and each layer's part of
//                 it read up before its gather, forward and backward, each micro-batch (2 m x
//                 weights / dp). Not overlapped (the engine overlaps the reads with the layer
//                 before: an upper bound).
//   total         compute + memory_bound + comm_exposed + bubble + offload (recompute is inside
//                 compute).
//   mfu           train_flops_per_token x seq x global batch / (total x devices x peak), with
//                 train_flops_per_token = 6 N + 12 L H T (H = n_embd, T = seq: attention's QK^T
//                 and AV over the full T x T, forward and backward; PaLM, Chowdhery et al. 2022),
//                 N = parameters that multiply (bench's rule: not GPT-2's position table nor an
//                 untied LLaMA input embedding).
//
// LoRA / QLoRA (Candidate::lora): the frozen base does its forward (2 Ψ FLOPs per token) and, in
// backward, only its data gradient (2 Ψ, none for the weights: a third less matmul work than a
// full run's 6 Ψ); the adapters add 2 Ψ_A forward and 4 Ψ_A backward per token (their own small
// gemms, counted at the same efficiency), and again for the projections a recomputation re-runs.
// Their column adds (add_columns 3, take_columns 2 elements per output column of a site) join
// the elementwise traffic, and with dropout 9 elements per input column of a site (forward 2,
// backward's regeneration 2, masking 2, accumulation 3). A packed base is dequantized by every matmul that reads it: its packed
// bytes at memory bandwidth per use (forward, backward, recomputation), as memory_bound. The
// optimizer updates, data parallelism reduces and offload moves only the adapters (Ψ_A in place
// of Ψ); ZeRO-3 gathers the base (as stored) and the adapters. MFU counts 4 N + 6 Ψ_A + 12 L H T
// model FLOPs per token (no weight gradients for the base).
//
// Calibration (docs/plan.md): each hardware entry states the fractions of its peaks that
// training reaches: matmul_eff, attention_eff (flash, on the causal FLOPs it performs) and
// bandwidth_eff. They were fitted, minimizing the worst ratio, on the published runs of
// tests/data/published_runs.json (llm-foundry's MPT table under FSDP, torchtitan's Llama 3.1 8B):
// H100 0.53 / 0.16 / 0.40, A100 0.64 (its runs do not pin attention, 6% of their step; it keeps
// H100's attention-to-matmul ratio: 0.19) / 0.40; every run predicted within 0.86x-1.16x
// (TimeCalibration.*). Kinds without published runs take H100's. The cpu entry's are this
// machine's, measured against `memfit train` (bench/plan_vs_train.sh).
#pragma once

#include "model/config.h"
#include "plan/plan_types.h"
#include "train/engine.h"

namespace memfit {

// The per-kind efficiencies (Hardware::matmul_eff, attention_eff, bandwidth_eff) are fitted on
// published runs (above). These are assumptions the published runs do not pin down (their
// collectives hide under compute at any value near these):
constexpr double kLinkEfficiency = 0.80;        // NCCL bus bandwidth, of the link's line rate
constexpr double kOverlapFraction = 0.80;       // share of a backward that gradient collectives can hide under
constexpr double kLossBytesPerLogit = 12;       // fp32 logits: read for max/sum, read again, write the gradient

// train_flops_per_token (6 N + 12 L H T) is in model/config.h.

// Collective volumes: bytes each device sends (= receives) for a payload of `bytes` over n ranks.
double ring_allreduce_bytes(double bytes, int n);   // 2 (n-1)/n bytes
double reduce_scatter_bytes(double bytes, int n);   // (n-1)/n bytes
double all_gather_bytes(double bytes, int n);       // (n-1)/n bytes

// The pipeline bubble as a fraction of the step: (p-1)/(m+p-1) for GPipe and 1F1B,
// (p-1)/(v m + p - 1) interleaved with v model chunks per device; 0 when p <= 1.
double bubble_fraction(PipeSchedule s, int p, int m, int v);

struct StepTime {
    double compute = 0;       // seconds of forward + backward math per step on the busiest device (incl. recompute)
    double recompute = 0;     // of which recomputation
    double memory_bound = 0;  // elementwise/norm/attention-softmax traffic and the optimizer update at memory bandwidth
    double comm = 0;          // total communication time (before overlap)
    double comm_exposed = 0;  // the part not hidden behind forward/backward
    double bubble = 0;        // pipeline idle time
    double offload = 0;       // host <-> device traffic and the host's optimizer update
    double total = 0;         // the step's wall time
    double tokens_per_s = 0;  // seq x global batch / total
    double mfu = 0;           // train_flops_per_token x tokens / (total x devices x peak)
};

// seq: tokens per sequence; the global batch is dp x micro_batch x accum sequences; nodes: how
// many nodes the layout spans. Throws ConfigError for a recompute policy other than none,
// selective or full, or when the hardware lacks a rate the candidate needs.
StepTime predict_step_time(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq, int nodes);

// The op-level time model of one device's recorded programs (`--fit auto` ranks its
// configurations with it; the analytic model above ranks a cluster's): each op costs max(FLOPs / (flops_rate x the op
// kind's efficiency), bytes / byte_rate) plus a fixed overhead; a step is the sum over its micro-steps' programs.
// The efficiencies are this CPU's, measured with `memfit profile` (gpt2-6l, B=2, T=512, per-op
// times in trace.json): gemms ~100 GFLOP/s, flash attention 0.8 of that, naive attention 0.2,
// the exp-bound cross-entropy 0.015, other elementwise kernels 0.15; gemms on bf16/fp16 storage
// run at lowp_gemm of the fp32 rate: `--fit auto` sets it to the backend's (on a CPU measured on
// its cores, backend/cpu/bf16_path.h: 2.0 where oneDNN's native bf16 matmul is twice as fast,
// about 0.95 on the convert path); 0.9 otherwise.
struct TimeModel {
    double flops_rate = 100e9;   // FLOP/s of the gemms
    double byte_rate = 20e9;     // bytes/s of memory traffic
    double lowp_gemm = 0.9;      // gemm rate factor when weights and activations are 16-bit (Backend::lowp_gemm_speed)
    double op_overhead = 20e-6;  // seconds per op (dispatch, threads' fork/join): favours fewer micro-steps
    // --offload optimizer's copies (offload_read / offload_write: half their bytes are the store's
    // side) move at the store's rate: 3.7 GB/s is `memfit bench --calibrate`'s offload_gbs for a
    // file under the page cache on the 2-core Zen 4 VM.
    double offload_rate = 3.7e9;
    double op_seconds(const OpRecord & op, bool lowp) const;
    double step_seconds(const StepPlans & plans, int grad_accum) const;
};

}  // namespace memfit
