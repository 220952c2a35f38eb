// A training run's checkpoints: what they record besides the state (where the run is and what
// it is), restoring one into the engine and the loaders, writing one (sharded over the ranks).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "app/trainer.h"
#include "comm/communicator.h"
#include "data/data_loader.h"
#include "model/config.h"
#include "model/lora.h"
#include "train/engine.h"

namespace memfit {

nlohmann::json checkpoint_meta(int step, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                               const DataLoader & train, const DataLoader * val, const LoraOptions & lora);

// Restores a checkpoint into the engine and the loaders; returns its step. Every rank reads the
// shard files overlapping its own range (whatever the number of ranks that wrote them).
// ConfigError when the checkpoint is of another model, --seq, global batch, --seed or LoRA.
int resume_from(const std::string & path, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                Engine & engine, DataLoader & train, DataLoader * val);

// Writes a checkpoint under `root` (keeping the newest `keep`); returns its folder. Collective.
std::string write_checkpoint(const std::string & root, Engine & engine, nlohmann::json meta, int keep,
                             Communicator & comm);

}  // namespace memfit
