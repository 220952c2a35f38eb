// `--config FILE` for memfit train, profile, bench and plan: a JSON file of flags, memfit's own
// (the flag names without dashes as keys, e.g. {"micro-batch": 4}; summary.json, whose
// run_config reruns a run) or DeepSpeed's (run/deepspeed.h), read into the same flags the
// command line sets, so one parser serves both. Flags on the command line win.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace memfit::cli {

// The arguments with `--config FILE` replaced by the file's flags, placed before the command
// line's (which are not repeated from the file). Throws ConfigError for a key that is no flag,
// IoError / FormatError for an unreadable or malformed file. Prints one warning line for the
// DeepSpeed keys memfit does not implement and one note for `memfit train` flags this command
// does not take.
std::vector<std::string> expand_config(CLI::App & app, const std::vector<std::string> & args);

// Registers --config on a command (the value is read by expand_config before parsing).
void add_config_flag(CLI::App * c);

}  // namespace memfit::cli
