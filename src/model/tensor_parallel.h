// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): each of T ranks holds a slice of every
// block. Attention is split by heads (q|k|v column-parallel, the output projection
// row-parallel), the MLP by its hidden width (first matmul column-parallel, second
// row-parallel), and the token embedding and LM head by vocabulary rows (the last rank's slice
// padded to ceil(V/T) rows). Norms, GPT-2's position table and the row-parallel biases are
// replicated: every rank holds and updates the same copy (their gradients come from activations
// every rank has whole).
//
// A rank's slice is itself a model (tp_local_config): NH/T heads of the same head dimension,
// KVH/T KV heads, MLP width F/T, ceil(V/T) vocabulary rows. Its flat buffer is
// make_param_layout(local), and tp_runs maps it onto the whole model's.
#pragma once

#include <cstddef>
#include <vector>

#include "model/config.h"
#include "model/param_layout.h"

namespace memfit {

struct TensorParallel {
    int  ranks = 1, rank = 0;
    int  vocab = 0;          // the whole vocabulary (the local config holds the padded slice)
    bool sequence = false;   // sequence parallel (Korthikanti et al. 2022)
    bool enabled() const { return ranks > 1; }
    // The first vocabulary row this rank's embedding and head slice holds.
    int vocab_lo(const ModelConfig & local) const { return rank * local.vocab_size; }
};

// The model one of T ranks holds. ConfigError (one line, with the numbers) when the heads, the
// KV heads or the MLP width do not divide by T. T = 1: cfg itself.
ModelConfig tp_local_config(const ModelConfig & cfg, int T);

// Elements [local, local + n) of rank r's flat buffer are [full, full + n) of the whole
// model's. Every local element is covered exactly once except the padding rows of the last
// vocabulary slice (zero); replicated parameters are covered by every rank.
struct TpRun { size_t full, local, n; };
std::vector<TpRun> tp_runs(const ModelConfig & cfg, int T, int r);
// The same for any whole layout and its slice whose parameters follow the model's names: LoRA's
// adapters (make_lora_layout of cfg and of tp_local_config(cfg, T)) split with their projection.
std::vector<TpRun> tp_runs(const ParamLayout & whole, const ParamLayout & local, const ModelConfig & cfg, int T, int r);

// The ranges of a local layout (make_param_layout of the slice, or a pipeline stage's part of
// it) whose parameters every tensor rank holds whole and alike (replicated), as [a, b) element
// ranges, merged; the rest is split. T = 1: the whole layout.
struct TpRange { size_t a, b; };
std::vector<TpRange> tp_replicated(const ParamLayout & local, int T);

// Grouped-query attention with fewer KV heads than tensor ranks: each KV head is held whole by
// this many consecutive ranks (the ones whose query heads read it), else 1. Their gradients are
// each rank's own heads' share, summed over the replicas once per step.
int tp_kv_replicas(const ModelConfig & cfg, int T);
// The k and v projections' ranges of a local layout (merged; one per block).
std::vector<TpRange> tp_kv_ranges(const ParamLayout & local);

// Sequence parallel: the ranges of a local layout whose gradients each tensor rank computes from
// its own rows only (the norms' gains and biases), to be summed over the group once per step.
// The other replicated parameters' gradients come from whole gathered tensors.
std::vector<TpRange> sp_partial(const ParamLayout & local);
// LoRA under tensor parallelism: the replicated adapter matrices (a column-parallel projection's
// A, a row-parallel one's B), whose gradients each rank computes from its own slice of the
// projection's output (resp. input), to be summed over the group once per step.
std::vector<TpRange> tp_lora_partial(const ParamLayout & local);

// Rank r's slice taken from the whole model's weights (padding rows zero).
std::vector<float> tp_slice(const ModelConfig & cfg, int T, int r, const float * full);
// The whole model from every rank's slice, in rank order.
void tp_assemble(const ModelConfig & cfg, int T, const std::vector<const float *> & slices, float * full);
// The same over a whole layout and its slice (tp_runs above).
std::vector<float> tp_slice(const ParamLayout & whole, const ParamLayout & local, const ModelConfig & cfg, int T, int r,
                            const float * full);
void tp_assemble(const ParamLayout & whole, const ParamLayout & local, const ModelConfig & cfg, int T,
                 const std::vector<const float *> & slices, float * full);

}  // namespace memfit
