// From a planned row to a running job: the flags `memfit train` takes for it, the command line
// that starts it on the planned devices, memfit's config file (what `train --config` reads) and
// the DeepSpeed config of the same run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/search.h"

namespace memfit {

// The run's flags (run_config_json's names) that differ from `memfit train`'s defaults, plus
// the ones that say what the row is whatever the defaults (model, seq, the batch, precision,
// attention, recompute, the layout). What `--emit-config` writes.
nlohmann::ordered_json train_flags(const PlanRequest & r, const PlanResult & p);

// The command that starts the row: `memfit train ...` on one device, `mpirun -np N memfit train
// ...` on one node (or this machine, for the `cpu` hardware), `srun --nodes K --ntasks-per-node
// D --gpus-per-node D memfit train ...` on Slurm nodes. One line, flags from train_flags.
std::string launch_command(const PlanRequest & r, const PlanResult & p);

// The DeepSpeed config of the row (deepspeed.ai/docs/config-json): batch sizes, precision, ZeRO
// stage and offload, AdamW, full activation checkpointing, AutoTP's tensor_parallel.autotp_size.
// `unexpressed` gets what DeepSpeed's file cannot say (pipeline stages, sequence parallelism,
// selective recomputation, ...), each with where DeepSpeed sets it instead.
nlohmann::ordered_json deepspeed_config(const PlanResult & p, std::vector<std::string> * unexpressed);

}  // namespace memfit
