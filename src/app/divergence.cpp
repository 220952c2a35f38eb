#include "app/divergence.h"

#include <cmath>

#include <fmt/format.h>

#include "run/run_config.h"

namespace memfit {

namespace {

// Above this alpha / rank the adapters' gradients grow with the scale squared (LoRA papers and
// PEFT's defaults use 1 to 2).
constexpr float kLargeLoraScale = 64;

std::string hint(const std::string & what, const DivergenceFacts & f) {
    if (f.lora_scale > kLargeLoraScale)
        return fmt::format("the LoRA scale (alpha / rank, or alpha / sqrt(rank) with --use-rslora) is {:g}; lower "
                           "--lora-alpha (commonly 1 to 2 times --lora-rank)", f.lora_scale);
    if (f.step == f.first_step && what == "loss") {
        // No update has run in this process: the starting weights overflow the forward pass.
        const std::string from = fmt::format("the starting weights ({}) are finite but overflow the forward pass",
                                             f.weights_from);
        return f.compute == DType::f32 ? from : fmt::format("{} in {}; try --precision fp32", from,
                                                            precision_name(f.compute));
    }
    if (f.compute == DType::f16) return "fp16 overflowed; try --precision bf16, or lower --lr";
    std::string h = f.step <= f.warmup
                        ? fmt::format("lower --lr (the peak, now {:g}) or lengthen --warmup (now {})", f.peak_lr,
                                      f.warmup)
                        : fmt::format("lower --lr (now {:g})", f.peak_lr);
    if (f.clip <= 0) h += " or clip the gradients (--clip 1.0)";
    return h;
}

}  // namespace

std::string divergence_message(const std::string & what, double value, const DivergenceFacts & f) {
    std::string where = fmt::format("lr {:g}", f.lr);
    if (f.step <= f.warmup) where += fmt::format(", warm-up step {} of {}", f.step, f.warmup);
    if (f.step > f.first_step) where += fmt::format("; gradient norm {:.3g} at step {}", f.last_grad_norm, f.step - 1);
    return fmt::format("{} became {} at step {} ({}); hint: {}", what, value, f.step, where, hint(what, f));
}

std::string resumed_loss_check(const ResumedLoss & r, int step, double loss) {
    if (r.dir.empty() || !std::isfinite(r.loss) || !std::isfinite(loss) || step > r.step + ResumedLoss::kSteps)
        return "";
    if (loss <= ResumedLoss::kFactor * r.loss || loss <= r.floor) return "";
    return fmt::format("loss {:.4g} at step {}, {:.0f}x the {:.4g} that the checkpoint {} recorded at step {}: the "
                       "resumed state does not continue its run; hint: it is damaged in a way its digests cannot see "
                       "(written by a faulty host or build) or is another run's: resume from an earlier checkpoint",
                       loss, step, loss / r.loss, r.loss, r.dir, r.step);
}

}  // namespace memfit
