// Preemption: signals that ask a training run to stop cleanly. The first one sets a flag the
// run reads at its step boundaries (and, in one process, between the ops of the step in flight,
// when the grace time left would not let it finish); the run then writes a checkpoint, its
// summary and report, and exits 0. A second one ends the process at once: the newest complete
// checkpoint (they are written atomically) is what a restart resumes.
#pragma once

#include <string>
#include <vector>

namespace memfit {

// "TERM,INT,USR1" -> the signal numbers; "none" -> none. ConfigError names an unknown one.
std::vector<int> parse_stop_signals(const std::string & csv);

// "TERM,INT" -> "SIGTERM, SIGINT" (for messages).
std::string stop_signal_list(const std::string & csv);

// Installs the handlers for `signals` (the others keep their actions), blocks them in the calling
// thread and the threads it starts, and takes them in a thread that waits for them: the flag is
// set shortly after a process-directed signal (kill; raise() in a blocking thread stays pending).
void install_stop_handlers(const std::vector<int> & signals);

// Whether a stop was requested, by which signal ("SIGTERM"), and how long ago (seconds).
bool stop_requested();
std::string stop_signal_name();
double seconds_since_stop_request();

// Tests: forget a request.
void reset_stop_request();

}  // namespace memfit
