// Preference tuning (DPO, Rafailov et al. 2023; the losses of backend/preference_loss.h): each
// micro-batch holds pairs of rows, 2i the chosen answer and 2i + 1 the rejected one to the same
// prompt (data/data_loader.h's pairs), and the loss compares the policy's log-probabilities of
// both answers with a frozen reference's. The reference is one of:
//   adapters_off  LoRA's base with the adapters switched off: the same model, run once more
//                 forward before the policy (TRL's and torchtune's default under PEFT); no bytes
//   precompute    the starting model's log-probabilities of every answer, computed once before
//                 the first step and stored beside the data (TRL's precompute_ref_log_probs);
//                 the step reads two floats per pair
//   copy          a frozen copy of the starting model (its own weights, category `reference`),
//                 stored in the compute dtype, bf16, int8 or nf4
// The step (train/step.h) runs the reference's forward and LM head first (its per-token losses
// summed per row), then the policy's forward and LM head (losses only), the pairs' loss and each
// row's gradient factor (Backend::dpo_loss), and the LM head once more with its backward, the
// factor scaling each row's cross-entropy gradient (Backend::xent_grad_rows): the B*T*V logits
// never exist whole, at the price of a second head forward.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/preference_loss.h"
#include "model/config.h"
#include "model/lora.h"

namespace memfit {

enum class Reference : uint8_t { adapters_off, precompute, copy };

// --reference-weights: the copy's storage. compute and bf16 dense (bf16 computes the reference in
// bf16 whatever the run's precision); int8 and nf4 pack the block projections as a QLoRA base.
enum class ReferenceWeights : uint8_t { compute, bf16, int8, nf4 };

struct PreferenceOptions {
    bool dpo = false;                     // --objective dpo
    DpoLoss loss = DpoLoss::sigmoid;      // --dpo-loss
    float beta = 0.1f;                    // --dpo-beta
    float label_smoothing = 0.0f;         // --dpo-label-smoothing
    Reference reference = Reference::adapters_off;
    ReferenceWeights weights = ReferenceWeights::compute;
    bool enabled() const { return dpo; }
    bool copy() const { return dpo && reference == Reference::copy; }
    bool quantized() const { return weights == ReferenceWeights::int8 || weights == ReferenceWeights::nf4; }
    BaseWeights base_weights() const {
        return weights == ReferenceWeights::int8 ? BaseWeights::int8
               : weights == ReferenceWeights::nf4 ? BaseWeights::nf4 : BaseWeights::compute;
    }
    // The dtype of the copy's dense weights and activations under a run computing in `compute`.
    DType dtype(DType compute) const { return weights == ReferenceWeights::bf16 ? DType::bf16 : compute; }
    DpoDesc desc(float dloss) const { return DpoDesc{loss, beta, label_smoothing, dloss}; }
};

// TRL's logged metrics, as sums over pairs (means: divide by pairs; add() sums micro-batches and
// ranks): the implicit rewards beta * (policy - reference) of each answer, the pairs whose chosen
// reward is above the rejected one, the policy's log-probabilities; IPO's are per-token means, as
// its loss compares them.
struct PreferenceMetrics {
    double pairs = 0, chosen = 0, rejected = 0, accurate = 0, logps_chosen = 0, logps_rejected = 0;
    void add(const PreferenceMetrics & o);
    double margin() const { return (chosen - rejected) / pairs; }   // rewards/margins (pairs > 0)
    double accuracy() const { return accurate / pairs; }            // rewards/accuracies
    // {"rewards/chosen", mean}, ... in TRL's names and order (empty without pairs).
    std::vector<std::pair<std::string, double>> means() const;
};
// The metrics of B rows of T targets (rows 2i, 2i + 1 a pair), from each row's log-probability
// under the policy and the reference (row sums, as Backend::dpo_loss leaves them).
PreferenceMetrics pair_metrics(const PreferenceOptions & o, const float * policy, const float * reference,
                               const int32_t * targets, int B, int T);

// The reference copy's bytes (category `reference`) for `cfg` in a run computing in `compute`:
// its dense weights in dtype(compute) and its packed projections (0 unless copy()).
uint64_t reference_bytes(const ModelConfig & cfg, const PreferenceOptions & o, DType compute);

// Names, as the flags take them (ConfigError naming the flag and the choices otherwise).
DpoLoss parse_dpo_loss(const std::string & s);
Reference parse_reference(const std::string & s);
ReferenceWeights parse_reference_weights(const std::string & s);
const char * dpo_loss_name(DpoLoss l);
const char * reference_name(Reference r);
const char * reference_weights_name(ReferenceWeights w);

}  // namespace memfit
