// Small helpers for the self-contained HTML report (html_report.h): XML escaping, number
// formatting for coordinates, fixed colours per memory category and phase, "nice" axis ticks
// (binary byte units and decimal), and a plain SVG line chart. Everything returns text that is
// well-formed XML, so the whole page can be checked by a strict parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/category.h"
#include "memory/program.h"

namespace memfit::svg {

// Escapes & < > " ' for use in XML text and attribute values. Control characters other than
// tab/newline/carriage return (not allowed in XML 1.0) and invalid UTF-8 become U+FFFD.
std::string escape(std::string_view text);

// A coordinate with one decimal ("12.5", "3", never "-0").
std::string num(double v);

// Fixed, distinct fill colour per category ("#4e79a7") and a light background per phase.
std::string_view category_color(Category c);
std::string_view phase_fill(Phase p);

// format_bytes without trailing zero decimals: "2 GiB", "1.5 GiB", "768 MiB", "12 B".
std::string short_bytes(uint64_t bytes);

// Y axis ticks in binary units for values in [0, max]: the step is a power of two (bytes), chosen
// so that there are at most `max_ticks` intervals; returns 0, step, 2*step, ... up to the first
// multiple >= max (so the last tick is the axis top). max == 0 gives {0, 1}.
std::vector<uint64_t> byte_ticks(uint64_t max, int max_ticks = 6);

// A 1-2-5 step so that [0, span] has about `target` intervals (span > 0).
double nice_step(double span, int target);
// Integer version for op indexes: 1, 2, 5, 10, 20, 50, ... with about `target` intervals in [0, n).
int nice_int_step(int n, int target);

// Decimal places needed to print multiples of `step` without losing digits (0..6).
int decimals_for(double step);

struct LinePoint {
    double x = 0, y = 0;
};
struct LineSeries {
    std::string            label;
    std::string            color;      // "#1f77b4"
    std::vector<LinePoint> points;     // non-finite points are skipped
    bool                   markers = false;
};
struct LineChartOptions {
    double      width = 540, height = 260;
    std::string x_label = "step";
    std::string y_label;
    bool        y_from_zero = false;
    std::string css_class = "linechart";
};
// A line chart with axes, ticks, a legend and one polyline per series.
std::string line_chart(const std::vector<LineSeries> & series, const LineChartOptions & opt);

// Planned vs measured bars per category with bytes in any of the four: for each, a light bar (plan)
// and a solid one (measured) for peak live and for reserved, the numbers printed beside them and
// a "≠ +X" mark where they differ. Each row is a <g class="pvm-row" data-category=...> carrying
// the four numbers as data attributes.
std::string plan_vs_measured_bars(const CategoryBytes & plan_live, const CategoryBytes & meas_live,
                                  const CategoryBytes & plan_reserved, const CategoryBytes & meas_reserved);

// A thin strip over ops 0..num_ops-1 with the bar [first_op, last_op] in `color` and a red tick at
// `mark_op` (-1: none).
std::string lifetime_strip(int first_op, int last_op, int num_ops, int mark_op, std::string_view color,
                           double width = 240);

// One horizontal 100% bar split by category (stack order given), labelled where wide enough.
std::string share_bar(const CategoryBytes & bytes, const Category * order, size_t count, double width = 1060);

}  // namespace memfit::svg
