// The one line a diverged run ends with: what became non-finite, where in the schedule, and a
// hint for the likely cause (the weights and the data were checked finite when they were read,
// so what is left is the update: its learning rate, the gradients' size, or the precision).
#pragma once

#include <string>

#include "core/dtype.h"

namespace memfit {

struct DivergenceFacts {
    int    step = 0;
    int    first_step = 1;        // the first step this process ran (after a resume, the next one)
    float  lr = 0;                // this step's learning rate
    float  peak_lr = 0;           // --lr
    int    warmup = 0;            // --warmup steps
    float  clip = 0;              // --clip (0: off)
    double last_grad_norm = 0;    // the previous step's (0: none yet)
    DType  compute = DType::f32;
    float  lora_scale = 0;        // LoRA's alpha / rank (0: no LoRA)
    std::string weights_from;     // where the starting weights came from, for the first step
};

// "loss became nan at step 7 (lr 0.0003, warm-up step 7 of 100; gradient norm 2.1e+05 at step 6);
// hint: ..."
std::string divergence_message(const std::string & what, double value, const DivergenceFacts & f);

// After a resume, the loss should continue the checkpoint's. A state damaged in a way its digests
// cannot see (written so by a faulty build or host, or by another run) shows as a loss orders of
// magnitude above the recorded one, still finite: the run stops, naming the checkpoint and not
// the learning rate. Watched for the first kSteps steps after the resume.
struct ResumedLoss {
    static constexpr int kSteps = 10;
    static constexpr double kFactor = 10;   // and above twice the uniform guess's loss, ln(vocab)
    std::string dir;                        // the checkpoint resumed ("": no resume, nothing watched)
    int step = 0;                           // its step
    double loss = 0;                        // the loss it recorded (NaN: an older checkpoint's, none)
    double floor = 0;                       // 2 ln(vocab)
};
// "" while the loss continues the checkpoint's; else the one line to stop with.
std::string resumed_loss_check(const ResumedLoss & r, int step, double loss);

}  // namespace memfit
