// report.html: one self-contained page (inline CSS and SVG, no script, nothing fetched from the
// network) that shows where the bytes of one training step go:
//   - the configuration and the headline numbers (planned and measured peaks, budget, peak RSS,
//     the category that dominates the peak and its share);
//   - a stacked area chart of live bytes per category over the step's ops, phases shaded in the
//     background, the peak marked with its op, and the buffers live at the peak;
//   - planned vs measured bars per category, the ten largest buffers with their lifetimes, the
//     planner's hints, and loss / throughput curves when the report comes from training;
//   - for a multi-process run (ReportData::ranks), a "Memory per rank" section (rank_view.h):
//     each rank's measured peak by category against its planned peak, and the ranks' total live
//     bytes over the step on one chart;
//   - for a step that failed out of memory (ReportData::failure), a red banner at the top naming
//     what failed and the op; the chart's marker is that op and the buffer list is of those live
//     when the allocation failed.
//
// The page is well-formed XML after its <!DOCTYPE html> line. The chart carries its raw numbers
// for tools and tests: the chart <svg> has data-peak-total and data-peak-op, and each category's
// layer is a <g class="series" data-category="..." data-values="v0,v1,..."> (ledger bytes per op)
// holding a <path data-category="...">. The failure banner is <div class="failure"
// data-failed-op="N">; each rank's bar is <g class="rank" data-rank="N" data-total="BYTES"
// data-planned="BYTES">.
#pragma once

#include <string>

#include "report/report_data.h"

namespace memfit {

std::string render_html_report(const ReportData & r);

// Writes render_html_report(r) to path + ".tmp" and renames it over path, so readers never see a
// partial file. Throws IoError when the file cannot be written or renamed.
void write_html_report(const std::string & path, const ReportData & r);

}  // namespace memfit
