// A training run's checkpoints: what they record besides the state (where the run is and what
// it is), restoring one into the engine and the loaders, writing one (sharded over the ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
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

// What a checkpoint of `bytes` costs in wall time, predicted from a probe file written (and
// fsynced) into `dir`, then digested: the write and digest rates it measured.
struct CheckpointCost {
    uint64_t bytes = 0;
    double seconds = 0, write_bytes_per_s = 0, digest_bytes_per_s = 0;
    std::string error;   // the probe could not be written (then the rest is 0)
};
CheckpointCost predict_checkpoint_cost(const std::string & dir, uint64_t bytes);
// The bytes this rank writes into a checkpoint: its range of the weights and both moments, fp32.
uint64_t checkpoint_bytes(const Engine & engine, int world);

// Preflight: `root`'s filesystem must have room for one checkpoint of `bytes` (ConfigError with
// the numbers), and should for keep + 1 (the new one is written before the oldest goes: `warn`).
void check_free_space(const std::string & root, uint64_t bytes, int keep,
                      const std::function<void(const std::string &)> & warn);

// Preflight of a checkpoint folder before the first step: it exists (or is made) and takes a
// file (IoError naming `flag`), and it holds no other run's checkpoints, which this run's
// pruning would delete (ConfigError saying how to continue that run).
void check_writable(const std::string & dir, const char * flag);
void check_own_checkpoints(const std::string & root, const std::string & run_id);
// The complete checkpoint folders under `root` that another run wrote (oldest first): the ones a
// final checkpoint by default (--save-final) replaces once it is written.
std::vector<std::string> other_runs_checkpoints(const std::string & root, const std::string & run_id);

// The batches a --spike-rollback left out, as a checkpoint records them ([[epoch, cursor], ...]).
std::set<std::pair<uint64_t, size_t>> read_skipped_batches(const std::string & dir);

// Writes a checkpoint under `root` (keeping the newest `keep`); returns its folder. Collective.
std::string write_checkpoint(const std::string & root, Engine & engine, nlohmann::json meta, int keep,
                             Communicator & comm);

}  // namespace memfit
