// Training checkpoints: everything an optimizer step carries forward (fp32 weights, AdamW
// moments, step count, loss scale) plus where the run is (data loaders' epoch and cursor, which
// with the seed fix every later batch; the schedule is a function of the step) and what it is
// (model shape, batch shape, precision), so `--resume` continues bit for bit.
//
// Layout, one process: ROOT/step-000005/{state.safetensors, meta.json}. A checkpoint is written
// into ROOT/.step-000005.tmp, every file fsynced, then the folder is renamed into place and ROOT
// fsynced: a crash at any moment leaves the previous checkpoints intact and the new one either
// complete or absent (a leftover .tmp folder is ignored and removed by the next save). Only the
// newest `keep` checkpoints are kept.
//
// Layout, N data-parallel ranks: ROOT/step-000005/{state-rank-00000-of-00004.safetensors, ...,
// meta.json}. Each rank writes the file of its range [offset, offset + count) of the flat
// trainable buffer of `total` elements (params, adamw.m, adamw.v; the safetensors metadata holds
// rank, world, offset and total): under ZeRO its shard, without ZeRO (every rank holds the whole
// state) an even split, so the ranks share the writing. The ranges tile [0, total). meta.json,
// written by rank 0 after every rank's file is fsynced, records "world_size", "zero", "total"
// and "shards" ([{rank, offset, count, file}]); then rank 0 renames the folder into place.
// Loading takes any range: the shard files overlapping it are read (re-sharding to another
// number of ranks, or to one process), and the old one-file layout reads the same way.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/engine.h"

namespace memfit {

class Communicator;

struct Checkpoint {
    TrainState state;
    nlohmann::json meta;   // step, shape, data positions, ... (the caller's fields)
};

// Writes `ckpt` as ROOT/step-<meta.step> (one file, the whole state); removes all but the newest
// `keep` (>= 1). `between_files` (tests only) runs after the first file is written. Returns the folder.
std::string save_checkpoint(const std::string & root, const Checkpoint & ckpt, int keep,
                            const std::function<void()> & between_files = {});
// The same from a state read in place (Engine::state_view): no copy of it is made.
std::string save_checkpoint(const std::string & root, const TrainStateView & state, const nlohmann::json & meta,
                            int keep, const std::function<void()> & between_files = {});

// Loads a checkpoint folder, or the newest complete one under a root, as one whole state
// (a sharded checkpoint's shards are concatenated). IoError / FormatError with the path and the
// reason (missing file, bad JSON, tensor sizes that disagree).
Checkpoint load_checkpoint(const std::string & path);

// ---- sharded checkpoints (data parallel) ----

// One rank's range of the flat trainable buffer in a sharded checkpoint.
struct ShardRange {
    int    rank = 0;
    size_t offset = 0, count = 0;
};

// "state-rank-00001-of-00004.safetensors".
std::string state_shard_file(int rank, int world);
// Rank r's part of an even, contiguous split of `total` elements over `world` ranks (the first
// total % world ranks hold one element more).
ShardRange even_shard(size_t total, int rank, int world);

// The pieces of a sharded save, for one rank at a time (save_checkpoint_sharded calls them
// between collectives; tests call them directly with explicit ranks):
//   begin_checkpoint   rank 0: removes a leftover ROOT/.step-NNNNNN.tmp and creates it; returns it.
//   write_state_shard  every rank: its shard file into the temporary folder, fsynced. The state
//                      holds elements [s.offset, s.offset + s.params.size()) of s.total.
//   commit_checkpoint  rank 0, after every rank's write_state_shard returned: checks that the
//                      ranges tile [0, total) and that every file is there, writes meta.json
//                      (ckpt.meta plus the step count and loss scaler of ckpt.state and the shard
//                      table), fsyncs, renames the folder into place, keeps the newest `keep`.
std::string begin_checkpoint(const std::string & root, long step);
void write_state_shard(const std::string & tmp_dir, const TrainState & s, int rank, int world);
std::string commit_checkpoint(const std::string & root, const std::string & tmp_dir, const Checkpoint & ckpt,
                              const std::vector<ShardRange> & shards, int world, int zero, int keep);

// Collective over `comm` (every rank calls it with its own state, the same meta and keep): the
// whole sharded save. ckpt.state.total must be set (0 is read as params.size(), offset 0).
// Returns the folder on every rank once it is in place.
std::string save_checkpoint_sharded(const std::string & root, const Checkpoint & ckpt, int keep, int zero,
                                    Communicator & comm);

// The checkpoint folder `path` names: itself when it holds meta.json, else the newest complete
// checkpoint under it (IoError when there is none).
std::string find_checkpoint(const std::string & path);
// The newest complete checkpoint under `root` ("" when there is none, or no such folder).
std::string newest_checkpoint(const std::string & root);
// A checkpoint folder's meta.json, checked for the format and against its own digest
// ("meta_digest", over the rest of the file): FormatError naming the file when either fails, or
// when it records no digests at all (written by an older memfit, or edited: its files cannot be
// checked) unless unverified checkpoints are allowed, which warns once.
nlohmann::json load_checkpoint_meta(const std::string & dir);

// --allow-unverified: load checkpoints that record no digests (a warning instead of a refusal).
void set_unverified_checkpoints_allowed(bool allowed);
bool unverified_checkpoints_allowed();

// The digest meta.json records of itself: over its dump without "meta_digest".
std::string meta_digest(const nlohmann::json & meta);
// The trainable elements the checkpoint holds (sharded: meta's total; one file: its size).
size_t checkpoint_total(const std::string & dir, const nlohmann::json & meta);
// Elements [lo, hi) of the checkpoint's params and AdamW moments, with its step count and loss
// scaler: state.offset = lo, state.total = the checkpoint's total. Reads only the shard files
// that overlap the range. IoError naming a missing shard file, FormatError naming a corrupt one
// (or one whose range disagrees with meta.json).
TrainState load_state_range(const std::string & dir, const nlohmann::json & meta, size_t lo, size_t hi);

}  // namespace memfit
