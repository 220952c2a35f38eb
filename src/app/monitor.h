// `memfit monitor RUN_DIR`: a live terminal view of a run, as nvidia-smi is of a GPU. It reads
// what the run writes into its --out folder: run.json (at start: the model, the steps, the
// budget, each rank's plan) and metrics.jsonl (at every log point: step, loss, tokens/s, and per
// rank the live and peak bytes by category). It redraws when a line arrives (a terminal: the
// screen in place; a pipe: one block per new step) and exits when the run's process is gone:
// 0 when the run wrote its summary.json, 1 when it ended without one (an error, a kill).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

struct MonitorOptions {
    std::string run_dir;
    double interval = 0.5;   // seconds between looks at the files
    double wait = 60;        // seconds to wait for run.json to appear (0: forever)
    bool   once = false;     // print the current view and exit
};

// The view of a run: `run` is run.json, `last` the newest metrics line (null: none yet), `val`
// the last validation loss logged (NaN: none), `state` a few words ("running", "done").
std::string render_monitor(const nlohmann::json & run, const nlohmann::json & last, double val,
                           const std::string & state);

// When the process `pid` started, in clock ticks since boot (/proc/PID/stat's starttime), or 0
// when it is not running or unknown. run.json records the run's own, so that a pid the system
// gave to another process since is not taken for the run.
uint64_t process_start_ticks(long pid);

// Watches until the run ends; returns the exit status (above). Throws IoError when RUN_DIR
// holds no run.json after `wait` seconds.
int run_monitor(const MonitorOptions & opt);

}  // namespace memfit
