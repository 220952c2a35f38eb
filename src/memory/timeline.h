// Timeline: what the executing step did, op by op: phase, layer, and the ledger's live bytes per
// category while the op ran (after its buffers were acquired, before any was released), plus
// wall-clock begin/end. Filled only when a Timeline is attached to the executing graph; with
// none attached the engine does no extra work.
#pragma once

#include <string>
#include <vector>

#include "memory/category.h"
#include "memory/program.h"

namespace memfit {

struct TimelineEvent {
    int           op = 0;          // index in the program
    const char *  name = "";       // op name (static string)
    Phase         phase = Phase::other;
    int           layer = -1;
    CategoryBytes live;            // ledger live bytes during the op
    double        begin_us = 0;    // since the timeline's origin
    double        end_us = 0;
};

struct Timeline {
    std::string                program;   // "train", "eval", ...
    std::vector<TimelineEvent> events;
    double                     origin_s = 0;   // steady-clock seconds of the first event's origin
    // The op whose buffers could not be acquired (out of memory): its event is the last, with
    // the live bytes held when the acquisition failed and end_us = begin_us. -1: none failed.
    int                        failed_op = -1;
};

}  // namespace memfit

namespace memfit {

// The leak check: compares the live bytes per category at every op of two recordings of the
// same program. Returns an empty string when they are identical, else one line naming the
// first op and category that differ, with both numbers.
std::string compare_live_bytes(const Timeline & a, const Timeline & b);

}  // namespace memfit
