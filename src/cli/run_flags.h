// The RunConfig's flags (run/run_config.h), registered by one function for `memfit train`,
// `profile`, `bench` and `plan`: the same names, choices, checks and help everywhere, and the
// same keys in a `--config` file (cli/config_file.h).
#pragma once

#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "run/run_config.h"

namespace memfit::cli {

// Which flags a command takes: every command the model, shape, batch, precision, techniques and
// LoRA; `execution` the ones that run something (device, memory budget, --fit, loss chunk,
// clipping, seed, threads); `layout` the parallel layout (ZeRO, tensor, pipeline, sequence
// parallel, offload, gradient buckets).
struct RunFlagSet {
    bool execution = true;
    bool layout = true;
};

// The registered options, to ask which were given (on the command line or in a config file).
struct RunFlags {
    std::map<std::string, CLI::Option *> options;   // by long name without dashes ("micro-batch")
    bool given(const std::string & name) const;
};

// Registers the flags on `c`, bound to `r` (whose values are the defaults shown).
RunFlags add_run_flags(CLI::App * c, RunConfig & r, RunFlagSet which = {});

}  // namespace memfit::cli
