// N:M structured sparsity of the block projections (`--sparsity N:M`, 2:4 by default): in every
// group of M consecutive input-dimension weights of an output row, at most N are nonzero.
//
// The recipe is NVIDIA ASP's (Mishra et al. 2021, "Accelerating Sparse Deep Neural Networks"):
// train dense, prune once by magnitude (keep the N largest |w| of each group), then train on with
// masked updates, so the pruned weights stay exactly zero. The mask is not stored: it is the set
// of exact zeros (OptimHyper::keep_zeros makes the optimizer kernels leave a zero weight at zero
// and zero its moments). SR-STE (Zhou et al. 2021), which lets pruned weights regrow, needs a
// dense copy of the weights beside the sparse ones the matmuls read (extra bytes per parameter in
// fp32 compute, where the fp32 weights are the only copy); memfit keeps the mask fixed from the
// prune on instead.
//
// Targets: every block's projection weights, GPT-2's attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj and LLaMA's q/k/v/o/gate/up/down; not embeddings, the LM head, norms or biases.
// GPT-2's Conv1D weights are stored [in, out], so a group there is M rows of one column.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/param_layout.h"

namespace memfit {

struct NmSparsity {
    int n = 0, m = 0;   // m == 0: dense
    int start = 0;      // optimizer updates applied before the prune (a dense warm-up)
    bool enabled() const { return m > 0; }
    std::string name() const;   // "2:4"
};

// "N:M" (1 <= N < M <= 64) -> the pattern; "" or "off" -> dense. ConfigError naming the input.
NmSparsity parse_sparsity(const std::string & s);

// Whether parameter `name` of a layout is a block projection weight (a pruning target).
bool sparse_target(const std::string & name);
// A target's input dimension (the one groups run along) given its shape in the family's layout.
int64_t sparse_in_dim(const ModelConfig & cfg, const ParamInfo & p);

// Why a run of `cfg` cannot train the pattern, or "": LoRA (the base it would prune is frozen),
// or M not dividing a projection's input dimension.
std::string sparsity_refusal(const ModelConfig & cfg, const NmSparsity & s, bool lora);

// Prunes every target of `layout` in `w` (the layout's flat fp32 weights) by magnitude: in each
// group the N largest |w| stay (ties: the lower index), the rest become 0. Returns the number of
// weights zeroed that were not zero already. Idempotent.
size_t prune_nm(const ModelConfig & cfg, const ParamLayout & layout, float * w, const NmSparsity & s);

// Groups of the targets in `w` with more than N nonzeros (0: the pattern holds everywhere).
size_t nm_violations(const ModelConfig & cfg, const ParamLayout & layout, const float * w, const NmSparsity & s);

}  // namespace memfit
