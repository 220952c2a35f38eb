// trace.json: one training step as a Chrome trace (JSON Object Format), which Perfetto
// (ui.perfetto.dev) and chrome://tracing open. Each op is a complete event ("X") coloured by
// phase, memory is a stacked counter track per category ("C" "memory") plus a total
// ("memory.total"), and the peak is a global instant event. otherData carries the planned vs
// measured peaks per category and the run's configuration.
//
// One process (pid 1, "memfit step") for one process's run. With ReportData::ranks (more than
// one), one process per rank instead: pid rank + 1 named by the rank's label, its ops and
// counters from its own timeline, shifted by the difference of its origin from rank 0's so the
// ranks of one host line up (not shifted when that exceeds 60 s: another host's clock); the peak
// stays on rank 0's process and otherData.ranks lists each rank's pid, shift and peaks. A step
// that failed out of memory (ReportData::failure) adds a global instant event "out of memory:
// <failure>" at the failed op, and otherData.failure / otherData.failed_op.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "report/report_data.h"

namespace memfit {

// The trace as JSON. Timestamps are the timeline's microseconds (the format's unit).
nlohmann::json chrome_trace(const ReportData & r);

// Writes chrome_trace(r) to path + ".tmp" and renames it over path, so readers never see a
// partial file. Throws IoError when the file cannot be written or renamed.
void write_chrome_trace(const std::string & path, const ReportData & r);

}  // namespace memfit
