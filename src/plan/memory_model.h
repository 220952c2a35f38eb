// The per-device memory model of `memfit plan`.
//
// Exact, for what memfit's engine runs (data parallelism with any ZeRO stage; no tensor or
// pipeline parallelism, no offload): one rank's step program is recorded symbolically and placed by the same arena planner as `memfit train`
// (exact_memory; the caller passes the backend whose workspace sizes apply). For every layout,
// analytic (predict_memory, O(1) in the layer count, for the search), with the engine's own
// sizing functions where they exist:
//
//   model states  Ψ = parameters on the most loaded device: the busiest pipeline stage's
//                 (ceil(L/pp) layers, plus the embedding on the first stage and the head and final
//                 norm on the last, a tied head keeping its own copy there), divided by tp (norm
//                 gains are counted split too: they are < 0.1% of a layer). Bytes per parameter:
//                 weights s (the compute dtype), fp32 master weights 4 when s < 4, optimizer
//                 states 8 (AdamW), 2 (8-bit AdamW), 4 (SGD with momentum), gradients s (4 when
//                 micro-batches accumulate in fp32, as the engine does). ZeRO-1 divides master
//                 weights and optimizer states by dp, ZeRO-2 also gradients, ZeRO-3 also the
//                 weights, and adds two layers' gathered weights (in use and prefetched) to
//                 `communication`. Optimizer offload (memfit's engine, train/step.h) moves the
//                 master weights and optimizer states to the host (reported as host bytes; three
//                 units of 2^18 elements or more staged on the device; the gradients stay);
//                 optimizer+params (ZeRO-3) also the weights' shard (two layers' parts of it
//                 staged ahead of their gathers, and each unit's s bytes an element).
//   activations   per layer and micro-batch, the engine's kept units (layer_keep_cost) for the
//                 recompute policy plus the layer's input (and Gemma 3's output norms' inputs
//                 and rstd, kept under every policy); tensor parallelism divides the units
//                 that are split by heads or by the MLP width (qkv, attention output and
//                 probabilities, fc, activation), sequence parallelism also the rest (norm
//                 outputs, residuals, layer inputs) — Korthikanti et al. 2022. The first
//                 pipeline stage holds m micro-batches in flight under GPipe, min(m, pp) under
//                 1F1B, and min(m, pp) (1 + (pp-1)/(pp v)) under interleaving (Narayanan et al.
//                 2021). On top: one layer's backward working set, the recomputed units of one
//                 layer, the fp32 logits of one micro-batch or of one --loss-chunk (split by tp:
//                 vocabulary-parallel); with --mlp-chunk (TiledMLP) the MLP keeps nothing and its
//                 working set is one chunk's intermediates and their gradients,
//                 the token ids, targets and losses (12 bytes a token; a pipeline holds all m
//                 micro-batches'), and under interleaving the boundary activations and
//                 gradients a stage has sent and not completed (interleaved_pending_sends).
//   workspace     32 MiB of GEMM workspace (cuBLASLt's recommendation for Hopper) on GPUs.
//   communication gradient buckets: two of 25 MB (compute dtype) when dp > 1, plus ZeRO-3's
//                 gathered layers; pipeline send/receive buffers of one micro-batch's boundary
//                 activation each way.
//   runtime       memory - usable (the hardware entry's context and handles).
//
// LoRA / QLoRA (Candidate::lora, plan/lora_plan.h), what the engine's step declares
// (train/step.cpp):
//   model states  parameters = the frozen base on the device (as above: the busiest stage, / tp,
//                 / dp under ZeRO-3): per layer the dense part (norms, biases) in s bytes plus the
//                 four projections in s bytes, or packed (int8: out*in + 4 out, nf4 with double
//                 quantization: n/2 + n/64 + 4 ceil(n/16384) + 4, each matrix padded to 64 bytes);
//                 embeddings and head in s bytes; plus the adapters Ψ_A (the stage's layers' share of
//                 lora_param_count, / tp) in s bytes. Master weights (4, mixed precision), optimizer
//                 states and gradients exist only for Ψ_A, with the same ZeRO divisions as above.
//                 ZeRO-3 and optimizer+params offload of a packed (int8/nf4) base are not modelled
//                 (ConfigError): memfit neither shards nor streams packed weights.
//   activations   the frozen projections keep no input for a weight gradient: a kept unit that is
//                 only a projection's input is not kept unless that projection has an adapter
//                 (ln_1's and ln_2's outputs keep only their f32 statistics, the MLP activation
//                 nothing, and the attention output nothing under naive attention; flash attention's
//                 backward reads it anyway). Every adapter keeps u = x A^T [b T, r] (replicated over
//                 tp); the backward working set adds one site's dd [b T, cols] and du [b T, r], and
//                 with --lora-dropout the regenerated dropped input and its gradient [b T, in] (the
//                 mask is a counter hash, regenerated: nothing extra is kept).
//   workspace     a packed base on a GPU adds one dequantized tile of the largest (fused)
//                 projection in the compute dtype: the whole projection (/ tp) up to 4 Mi elements
//                 (the CUDA qgemm's tile, cuda_qgemm_tile_rows; the CPU's tiles are its exact plan).
//   communication gradient buckets only as large as the adapters' gradients; ZeRO-3 gathers two
//                 layers of base + adapters.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "memory/category.h"
#include "model/config.h"
#include "plan/plan_types.h"

namespace memfit {

struct DeviceMemory {
    CategoryBytes device;      // bytes per category on the most loaded device (runtime included)
    uint64_t host = 0;         // bytes offloaded to host memory, per device
    std::string loaded;        // which device that is ("the only device", "first pipeline stage", ...)
    bool exact = false;        // from the engine's own recorded program
    uint64_t frozen = 0;       // LoRA: bytes of `parameters` that are the frozen base (packed part included)
    // Exact plans of a pipeline: every stage's peak live bytes (runtime not included), stage order.
    std::vector<CategoryBytes> stages;
    uint64_t total() const { return device.total(); }
};

// The analytic model (predict_memory) against the engine's recorded program (exact_memory): on
// every configuration PlanMemory.AnalyticModelIsWithinTheSlack sweeps, analytic / exact stays
// below this (1.32 at most there). The search's filter lets a recordable candidate through up to
// this factor over the device, so it never rejects what the program fits; the program decides.
constexpr double kAnalyticSlack = 1.40;

// Parameters per layer, before the layers (embeddings), and after them (final norm, head).
// width: the model's hidden size, the matrices' side the per-matrix optimizer states (Adafactor's
// statistics, GaLore's projections) are counted with (optimizer_state_bytes()).
// targets: the shapes of one layer's projection matrices, GaLore's targets (model/sparsity.h's
// sparse_target()), whose states the planner counts matrix by matrix.
struct ParamSplit {
    int64_t per_layer = 0, embed = 0, head = 0, width = 1024;
    int64_t experts = 0;   // of per_layer, a sparse layer's experts' (expert parallelism divides them)
    std::vector<std::array<int64_t, 2>> targets;
};
ParamSplit param_split(const ModelConfig & cfg);

// The run a candidate is, as run/compat.h judges it: at `seq` tokens, LoRA from its plan.
RunConfig candidate_run(const Candidate & c, int seq);

// Model-state bytes per device, [parameters, master_weights, optimizer_states, gradients].
// `params` is Ψ, the parameters this device holds before ZeRO partitioning.
// `ranks`: the group ZeRO shards them over (0: the data ranks; an expert's: data ranks / ep).
CategoryBytes model_state_bytes(int64_t params, const Candidate & c, int64_t width = 1024, int ranks = 0);
// LoRA: `base` bytes of frozen base and `adapters` trainable parameters on this device (before
// ZeRO partitioning); master weights, optimizer states and gradients for the adapters only.
CategoryBytes lora_state_bytes(uint64_t base, int64_t adapters, const Candidate & c);

// --offload activations: the bytes one micro-batch's forward writes to the store (and its
// backward reads back) on a device of candidate c, as predict_memory counts them (0 without it).
uint64_t activation_offload_bytes(const ModelConfig & cfg, const Candidate & c, int seq);

// Activation bytes one transformer layer keeps for backward under Korthikanti et al. 2022's
// accounting (16-bit activations, naive attention, no norm statistics, and the dropout memfit's
// model does not have: a 1-byte mask after attention and after the MLP, and the attention
// probabilities' mask and dropped-out copy), for tensor parallel degree t with or without
// sequence parallelism. policy: none, attention (their selective: the attention core is
// recomputed) or full. Their Table 2: sbh(34 + 5as/h) for t = 1, sbh(10 + 24/t + 5as/(ht)),
// sbh/t (34 + 5as/h) with sp, sbh(10 + 24/t) and 34 sbh/t selective, 2sbh full.
uint64_t megatron_layer_activation_bytes(const ModelConfig & cfg, int b, int s, int t, bool sp,
                                         const std::string & policy);

// ConfigError for a LoRA candidate the model does not cover: a packed (int8/nf4) base with ZeRO-3
// or with optimizer+params offload.
void check_lora_layout(const Candidate & c);

// ConfigError for what the model does not cover (a packed LoRA base with ZeRO-3 or parameter
// offload, an unknown recompute policy).
DeviceMemory predict_memory(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq);

// The engine's own program for a candidate it runs (data parallelism with any ZeRO stage, tensor
// and sequence parallelism, pipelines with ZeRO 0-1; AdamW, no offload), recorded and placed,
// nothing allocated: the peak live bytes per category each rank of `mpirun -np N memfit train`
// measures on the most loaded device (every data and tensor rank's shards and slices are
// equal; pipeline stages differ: all are in `stages`), plus the hardware's runtime. `sizing`
// answers the backend's workspace queries. With `extrapolate`, a pipeline of more micro-batches
// than pipeline_samples() names is recorded at those two counts and extrapolated along their
// line (exact: the program is periodic in m there; the tests check it against full recordings,
// which extrapolate = false gives).
DeviceMemory exact_memory(const ModelConfig & cfg, const Hardware & hw, const Candidate & c, int seq,
                          const Backend & sizing, bool extrapolate = true);

// The micro-batch counts a pipeline stage's recording is extrapolated from: `from` and
// `from + step` (stage 0's are the largest).
struct PipelineSamples { int from = 2, step = 1; };
PipelineSamples pipeline_samples(const Layout & L, int stage = 0);

}  // namespace memfit
