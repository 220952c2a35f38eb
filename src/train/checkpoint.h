// Training checkpoints: everything an optimizer step carries forward (fp32 weights, AdamW
// moments, step count, loss scale) plus where the run is (data loaders' epoch and cursor, which
// with the seed fix every later batch; the schedule is a function of the step) and what it is
// (model shape, batch shape, precision), so `--resume` continues bit for bit.
//
// Layout: ROOT/step-000005/{state.safetensors, meta.json}. A checkpoint is written into
// ROOT/.step-000005.tmp, every file fsynced, then the folder is renamed into place and ROOT
// fsynced: a crash at any moment leaves the previous checkpoints intact and the new one either
// complete or absent (a leftover .tmp folder is ignored and removed by the next save). Only the
// newest `keep` checkpoints are kept.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "train/engine.h"

namespace memfit {

struct Checkpoint {
    TrainState state;
    nlohmann::json meta;   // step, shape, data positions, ... (the caller's fields)
};

// Writes `ckpt` as ROOT/step-<meta.step>; removes all but the newest `keep` (>= 1).
// `between_files` (tests only) runs after the first file is written. Returns the folder.
std::string save_checkpoint(const std::string & root, const Checkpoint & ckpt, int keep,
                            const std::function<void()> & between_files = {});

// Loads a checkpoint folder, or the newest complete one under a root. IoError / FormatError with
// the path and the reason (missing file, bad JSON, tensor sizes that disagree).
Checkpoint load_checkpoint(const std::string & path);

}  // namespace memfit
