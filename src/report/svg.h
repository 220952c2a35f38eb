// SVG pieces of the self-contained HTML report (html_report.h): XML escaping, coordinates, fixed
// colours per category and phase, axis ticks in binary byte units, the stacked area chart of a
// step's timeline, a line chart for training curves, and a buffer-lifetime strip. Everything
// returned is well-formed XML, so the whole page can be checked by a strict parser.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/category.h"
#include "memory/program.h"
#include "memory/timeline.h"

namespace memfit::svg {

// Escapes & < > " ' for XML text and attribute values. Control characters other than tab,
// newline and carriage return (not XML 1.0 characters) and invalid UTF-8 become U+FFFD.
std::string escape(std::string_view text);

// A coordinate with at most one decimal ("12.5", "3", never "-0").
std::string num(double v);

// Fixed, distinct fill colour per category ("#4e79a7") and a light background per phase.
std::string_view category_color(Category c);
std::string_view phase_fill(Phase p);

// Stacking order, bottom to top: what lives for the whole step first, the step's transient
// bytes (workspace, activations) on top where their rise and fall is visible.
// The device's categories (not `offloaded`, which lives in host memory or files).
inline constexpr std::array<Category, kCategoryCount - 1> kStackOrder = {
    Category::runtime,   Category::parameters,    Category::teacher,   Category::reference,
    Category::master_weights,
    Category::optimizer_states, Category::gradients, Category::communication, Category::workspace,
    Category::activations};

// format_bytes without trailing zero decimals: "2 GiB", "1.5 GiB", "768 MiB", "12 B".
std::string short_bytes(uint64_t bytes);

// Y ticks in binary units for [0, max]: 0, step, 2*step, ... up to the first multiple >= max, with
// a power-of-two step giving at most `max_ticks` intervals. max == 0 gives {0, 1}.
std::vector<uint64_t> byte_ticks(uint64_t max, int max_ticks = 6);

// A 1-2-5 step giving about `target` intervals over `span` (> 0); integer version for op indexes.
double nice_step(double span, int target);
int nice_int_step(int n, int target);

// "matmul_bwd, layer 3, backward" ("crossentropy_fwd, forward" outside the blocks).
std::string op_label(const TimelineEvent & e);

// The stacked area chart of live bytes per category over `events` (x: position in `events`,
// labelled with each event's op), phases shaded as bands, the peak (index into `events`) marked
// and labelled, the budget drawn when it is within 1.3x of the top. The <svg class="chart"> has
// data-peak-total / data-peak-op; each category with bytes is a <g class="series"
// data-category=".." data-values="v0,v1,..."> holding its <path data-category="..">.
// The marker's label reads "<mark> 1.5 GiB at op 7 (...)". Requires a non-empty `events` and
// 0 <= peak < events.size().
std::string area_chart(const std::vector<TimelineEvent> & events, int peak, uint64_t budget,
                       std::string_view program, std::string_view mark = "peak");

struct LinePoint { double x = 0, y = 0; };
struct LineSeries {
    std::string            label;
    std::string            color;      // "#4e79a7"
    std::vector<LinePoint> points;     // non-finite points are skipped
    bool                   markers = false;
};
// A line chart (axes, 1-2-5 ticks, a legend, one polyline per series), 540 x 260.
std::string line_chart(const std::vector<LineSeries> & series, std::string_view y_label, bool y_from_zero);

// A thin strip over ops 0..num_ops-1 with the bar [first_op, last_op] in `color` and a red tick
// at `mark_op` (-1: none).
std::string lifetime_strip(int first_op, int last_op, int num_ops, int mark_op, std::string_view color);

}  // namespace memfit::svg
