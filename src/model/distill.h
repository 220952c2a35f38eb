// Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network";
// Sanh et al. 2019, DistilBERT): a frozen teacher's softened predictions as a second target.
// The teacher runs forward only inside the training step (train/step.h), keeping nothing for a
// backward; its weights are a flat buffer of their own (the `teacher` category), in the compute
// dtype or packed like a QLoRA base (model/lora.h). The loss of each token is
//     (1 - alpha) * CE(student, target) + alpha * T^2 * KL(softmax(t / T) || softmax(z / T)),
// computed chunk by chunk with the LM head (model/transformer.h's DistillHead), so that neither
// model's B*T*V logits exist whole. Validation reports the plain cross-entropy.
#pragma once

#include <optional>

#include "model/config.h"
#include "model/lora.h"

namespace memfit {

struct DistillOptions {
    std::optional<ModelConfig> teacher;   // none: no distillation
    float alpha = 0.5f;                   // the KL term's weight, [0, 1]
    float temperature = 1.0f;             // > 0
    BaseWeights weights = BaseWeights::compute;
    bool double_quant = true;             // nf4: the block absmaxes quantized too
    bool enabled() const { return teacher.has_value(); }
    bool quantized() const { return weights != BaseWeights::compute; }
    QuantFormat format() const { return quant_format(weights, double_quant); }
};

// Whether `teacher` can teach `student` at sequence length T: one vocabulary (the loss compares
// the two distributions token by token), T within the teacher's context and its attention window.
// ConfigError with the numbers otherwise.
void check_teacher(const ModelConfig & teacher, const ModelConfig & student, int T);

}  // namespace memfit
