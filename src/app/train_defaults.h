// The values `memfit train` fills in where the user gave none (TrainOptions' 0 and -1), by what the
// run is. One table row per kind:
//
//   kind             when                                       lr     warmup            LoRA targets
//   pretraining      a preset or a bare config.json             3e-3   100 steps         q,v | c_attn
//   full fine-tune   --model DIR holding weights                2e-5   3% of the steps   -
//   LoRA fine-tune   the same with --lora-rank (LoRA or QLoRA)  2e-4   3% of the steps   every projection
//
// (2e-5 and 2e-4 with a 3% warmup are Hugging Face's SFT and PEFT recipes' values, also Unsloth's
// notebooks'; torchtune's LoRA recipes adapt all seven projections.) The LoRA targets are filled in
// by plan/fit.cpp's lora_options, which memfit plan shares. Explicit flags always win: --warmup
// over --warmup-ratio over the kind's default; --steps and --epochs are one or the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/trainer.h"

namespace memfit {

struct TrainKind {
    const char * name;        // "pretraining", "full fine-tune", "LoRA fine-tune"
    float        lr;
    int          warmup_steps;   // -1: warmup_ratio of the steps
    double       warmup_ratio;
};
const TrainKind & train_kind(const TrainOptions & opt);

// Before the data is read: the learning rate (and ConfigError for --steps with --epochs).
void fill_lr(TrainOptions & opt);

// Once the loader knows the rows of an epoch: steps from --epochs (rows_per_epoch rows, rows_per_step
// a step), then the warmup. Returns the lines that say what was chosen and why, and a warning when
// the warmup is not shorter than the run.
struct ScheduleChoice {
    std::string line;      // "schedule: 80 steps (--epochs 2 of 1000 rows, 25 a step), lr 2e-4 (...)"
    std::string warning;   // "" or why the learning rate never reaches its peak
};
ScheduleChoice fill_schedule(TrainOptions & opt, uint64_t rows_per_epoch, int64_t rows_per_step);

}  // namespace memfit
