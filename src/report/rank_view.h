// report.html's "Memory per rank" section for a multi-process run (ReportData::ranks, more than
// one): per rank, a stacked bar of its measured peak live bytes by category (svg::kStackOrder and
// the category colours of the main chart; `offloaded` is not device memory and stays out of the
// stack) with a tick at its planned peak, its label, totals and peak RSS; and, when at least two
// ranks recorded a timeline, their total live bytes over the step on one chart (x: milliseconds
// since each rank's first op), one line per rank.
//
// Every fragment is well-formed XML. The numbers are on the elements: each bar is a
// <g class="rank" data-rank="N" data-total="BYTES" data-planned="BYTES" data-peak-rss="BYTES">
// (device bytes: CategoryBytes::total()), each line a <g class="rank-line" data-rank="N"
// data-points="K"> inside <svg class="rank-timeline">.
#pragma once

#include <string>
#include <vector>

#include "report/report_data.h"

namespace memfit {

// The whole <section>, or "" when r.ranks has fewer than two ranks.
std::string rank_view_section(const ReportData & r);

// The <svg class="ranks"> of the per-rank bars; "" for no ranks.
std::string rank_peak_bars(const std::vector<RankView> & ranks);

// The <svg class="rank-timeline"> of each rank's total live bytes over its step; "" when fewer
// than two ranks have timeline events.
std::string rank_timelines(const std::vector<RankView> & ranks);

}  // namespace memfit
