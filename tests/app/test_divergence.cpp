// A diverged run's line names its likely cause: the LoRA scale, weights that overflow before
// any update, fp16, warm-up, or the learning rate (and clipping when it is off).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "app/divergence.h"

namespace memfit {
namespace {

DivergenceFacts facts(int step) {
    DivergenceFacts f;
    f.step = step;
    f.first_step = 1;
    f.lr = 0.002f;
    f.peak_lr = 0.003f;
    f.warmup = 100;
    f.clip = 1.0f;
    f.last_grad_norm = 12.5;
    f.weights_from = "models/x";
    return f;
}

bool has(const std::string & s, const std::string & needle) { return s.find(needle) != std::string::npos; }

TEST(Divergence, TheHintFollowsTheCause) {
    // After warm-up, with clipping on: the learning rate alone.
    std::string m = divergence_message("loss", NAN, facts(300));
    EXPECT_EQ(m, "loss became nan at step 300 (lr 0.002; gradient norm 12.5 at step 299); hint: lower --lr (now "
                 "0.003)");
    // Clipping off: offered.
    DivergenceFacts f = facts(300);
    f.clip = 0;
    EXPECT_TRUE(has(divergence_message("loss", NAN, f), "or clip the gradients (--clip 1.0)"));
    // In warm-up: says so, and offers a longer warm-up.
    m = divergence_message("gradient norm", INFINITY, facts(7));
    EXPECT_TRUE(has(m, "gradient norm became inf at step 7 (lr 0.002, warm-up step 7 of 100;")) << m;
    EXPECT_TRUE(has(m, "lower --lr (the peak, now 0.003) or lengthen --warmup (now 100)")) << m;
    EXPECT_FALSE(has(m, "clip")) << m;
    // Before any update of this process: not the learning rate but the starting weights.
    m = divergence_message("loss", NAN, facts(1));
    EXPECT_TRUE(has(m, "the starting weights (models/x) are finite but overflow the forward pass")) << m;
    EXPECT_FALSE(has(m, "--lr")) << m;
    EXPECT_FALSE(has(m, "gradient norm")) << m;   // no step before
    f = facts(41);
    f.first_step = 41;   // resumed at 41
    f.compute = DType::bf16;
    EXPECT_TRUE(has(divergence_message("loss", NAN, f), "overflow the forward pass in bf16; try --precision fp32"));
    // fp16: the precision first.
    f = facts(300);
    f.compute = DType::f16;
    EXPECT_TRUE(has(divergence_message("loss", INFINITY, f), "try --precision bf16"));
    // A LoRA scale far beyond the usual: named, whatever the step.
    f = facts(1);
    f.lora_scale = 2.5e29f;
    m = divergence_message("gradient norm", INFINITY, f);
    EXPECT_TRUE(has(m, "the LoRA scale (alpha / rank, or alpha / sqrt(rank) with --use-rslora) is 2.5e+29; lower --lora-alpha")) << m;
    f.lora_scale = 2;
    EXPECT_FALSE(has(divergence_message("gradient norm", INFINITY, f), "LoRA"));
}

}  // namespace
}  // namespace memfit
