#include "app/train_defaults.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "model/hf_weights.h"

namespace memfit {

namespace {

constexpr TrainKind kPretraining{"pretraining", 3e-3f, 100, 0.0};
constexpr TrainKind kFullFineTune{"full fine-tune", 2e-5f, -1, 0.03};
constexpr TrainKind kLoraFineTune{"LoRA fine-tune", 2e-4f, -1, 0.03};
// TRL's DPOConfig: learning_rate 1e-6, whether or not PEFT adapts the model.
constexpr TrainKind kDpo{"DPO", 1e-6f, -1, 0.03};
constexpr int kDefaultSteps = 1500;

std::string why_kind(const TrainOptions & opt) {
    if (!has_hf_weights(opt.model)) return "a fresh model";
    return fmt::format("{} holds weights{}{}", opt.model, opt.lora.rank > 0 ? " and --lora-rank is set" : "",
                       opt.pref.dpo() ? " and --objective dpo" : "");
}

}  // namespace

const TrainKind & train_kind(const TrainOptions & opt) {
    if (!has_hf_weights(opt.model)) return kPretraining;
    if (opt.pref.dpo()) return kDpo;
    return opt.lora.rank > 0 ? kLoraFineTune : kFullFineTune;
}

void fill_lr(TrainOptions & opt) {
    if (opt.steps > 0 && opt.epochs > 0)
        throw ConfigError(fmt::format("--steps {} and --epochs {:g}: give one (the steps of --epochs N follow from the "
                                      "data's rows and the global batch)", opt.steps, opt.epochs));
    if (opt.epochs < 0 || !std::isfinite(opt.epochs))
        throw ConfigError(fmt::format("--epochs {:g}: must be positive", opt.epochs));
    if (opt.steps == 0 && opt.epochs == 0) opt.steps = kDefaultSteps;
    if (!(opt.lr > 0)) opt.lr = train_kind(opt).lr;
}

ScheduleChoice fill_schedule(TrainOptions & opt, uint64_t rows_per_epoch, int64_t rows_per_step) {
    const TrainKind & kind = train_kind(opt);
    std::string steps_why = "--steps";
    if (opt.steps == 0) {
        const double want = std::ceil(opt.epochs * double(rows_per_epoch) / double(std::max<int64_t>(rows_per_step, 1)));
        if (!(want >= 1) || want > double(1 << 30))
            throw ConfigError(fmt::format("--epochs {:g} of {} rows at {} rows a step is {:g} steps: give --steps",
                                          opt.epochs, rows_per_epoch, rows_per_step, want));
        opt.steps = int(want);
        steps_why = fmt::format("--epochs {:g} of {} rows, {} a step", opt.epochs, rows_per_epoch, rows_per_step);
    }
    std::string warmup_why = "--warmup";
    // A pretraining run's default warmup longer than a short run (a test, a demo) is no news; a
    // fine-tune's, or one the user chose, is.
    const bool chosen = opt.warmup >= 0 || opt.warmup_ratio >= 0 || kind.warmup_steps < 0;
    if (opt.warmup < 0) {
        const double ratio = opt.warmup_ratio >= 0 ? opt.warmup_ratio : kind.warmup_ratio;
        if (opt.warmup_ratio >= 0 || kind.warmup_steps < 0) {
            opt.warmup = int(std::ceil(ratio * opt.steps));
            warmup_why = fmt::format("{:g}% of the steps{}", ratio * 100,
                                     opt.warmup_ratio >= 0 ? "" : fmt::format(", the {} default", kind.name));
        } else {
            opt.warmup = kind.warmup_steps;
            warmup_why = fmt::format("the {} default", kind.name);
        }
    }
    ScheduleChoice c;
    c.line = fmt::format("  schedule ({}: {}): {} steps ({}), lr {:g}{}, warmup {} step{} ({}), {} decay to {:g} x lr",
                         kind.name, why_kind(opt), opt.steps, steps_why, double(opt.lr),
                         opt.lr == kind.lr ? fmt::format(" (the {} default)", kind.name) : "", opt.warmup,
                         opt.warmup == 1 ? "" : "s", warmup_why,
                         lr_decay_name(opt.lr_decay), double(opt.min_lr_ratio));
    if (chosen && opt.warmup >= opt.steps && opt.warmup > 0)
        c.warning = fmt::format("the warmup ({} steps) is not shorter than the run ({} steps): the learning rate never "
                                "reaches --lr {:g}; lower --warmup, or give --warmup-ratio (e.g. 0.03)",
                                opt.warmup, opt.steps, double(opt.lr));
    return c;
}

}  // namespace memfit
