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

// `base_digest`: LoRA's base weights as loaded (bytes_digest of their fp32 values; "" when the
// base is the seed's initialisation), so a resume or a merge with another base is refused.
nlohmann::json checkpoint_meta(int step, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                               const DataLoader & train, const DataLoader * val, const LoraOptions & lora,
                               const std::string & base_digest);

// Restores a checkpoint into the engine and the loaders; returns its step. Every rank reads the
// shard files overlapping its own range (whatever the number of ranks that wrote them).
// ConfigError when the checkpoint is of another model, --seq, global batch, --seed, LoRA or base.
int resume_from(const std::string & path, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                Engine & engine, DataLoader & train, DataLoader * val, const std::string & base_digest);

// Writes a checkpoint under `root` (keeping the newest `keep`); returns its folder. Collective.
std::string write_checkpoint(const std::string & root, Engine & engine, nlohmann::json meta, int keep,
                             Communicator & comm);

}  // namespace memfit
