#include "report/html_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "memory/program.h"
#include "report/svg.h"

namespace memfit {
namespace {

using svg::escape;
using svg::num;

// Bottom to top: what stays for the whole step first, the step's transient bytes on top.
constexpr std::array<Category, kCategoryCount> kStackOrder = {
    Category::runtime,   Category::parameters,    Category::master_weights, Category::optimizer_states,
    Category::gradients, Category::communication, Category::workspace,      Category::activations};

std::string cat(Category c) { return std::string(category_name(c)); }

std::string swatch(Category c) {
    return fmt::format("<span class=\"sw\" style=\"background:{}\"></span>", svg::category_color(c));
}

std::string pct(uint64_t part, uint64_t whole) {
    if (whole == 0) return "0%";
    const double p = 100.0 * double(part) / double(whole);
    if (part > 0 && p < 1) return "<1%";
    return fmt::format("{:.0f}%", p);
}

// Index into r.timeline.events of the peak: the event whose op is r.peak_op, else the first
// event with the largest total; -1 if the timeline is empty (same rule as chrome_trace).
int peak_event(const ReportData & r) {
    const auto & ev = r.timeline.events;
    if (r.peak_op >= 0) {
        for (size_t i = 0; i < ev.size(); ++i)
            if (ev[i].op == r.peak_op) return int(i);
    }
    int best = -1;
    uint64_t best_bytes = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
        const uint64_t t = ev[i].live.total();
        if (best < 0 || t > best_bytes) best = int(i), best_bytes = t;
    }
    return best;
}

std::string op_description(const TimelineEvent & e) {
    std::string s = e.name ? e.name : "";
    if (e.layer >= 0) s += fmt::format(", layer {}", e.layer);
    return s + ", " + phase_name(e.phase);
}

struct View {
    const ReportData & r;
    int peak = -1;                              // index into events
    CategoryBytes at_peak;                      // live bytes per category at the peak
    std::array<bool, kCategoryCount> used{};    // non-zero at some op
    Category dominant = Category::activations;
};

View make_view(const ReportData & r) {
    View v{r};
    v.peak = peak_event(r);
    for (const auto & e : r.timeline.events)
        for (size_t c = 0; c < kCategoryCount; ++c) v.used[c] = v.used[c] || e.live.v[c] != 0;
    v.at_peak = v.peak >= 0 ? r.timeline.events[size_t(v.peak)].live : r.measured_peak;
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (v.at_peak.v[c] > v.at_peak[v.dominant]) v.dominant = Category(c);
    return v;
}

// ---------------------------------------------------------------------------------------------
// The stacked area chart.

std::string area_chart(const View & v) {
    const auto & ev = v.r.timeline.events;
    const size_t n = ev.size();
    const double W = 1060, H = 470, left = 78, right = 18, top = 60, bottom = 48;
    const double pw = W - left - right, ph = H - top - bottom, slot = pw / double(n);
    const uint64_t peak_total = ev[size_t(v.peak)].live.total();

    uint64_t ymax = 0;
    for (const auto & e : ev) ymax = std::max(ymax, e.live.total());
    const bool budget_in_range = v.r.budget > 0 && double(v.r.budget) <= 1.3 * double(ymax);
    if (budget_in_range) ymax = std::max(ymax, v.r.budget);
    const std::vector<uint64_t> ticks = svg::byte_ticks(ymax, 6);
    const double axis_top = double(ticks.back());
    auto X = [&](size_t i) { return left + double(i) * slot; };
    auto Y = [&](double b) { return top + ph - b / axis_top * ph; };

    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" "
        "height=\"{1}\" role=\"img\" data-peak-total=\"{2}\" data-peak-op=\"{3}\" data-num-ops=\"{4}\">\n"
        "<title>live bytes per category over one step; peak {5} at op {3}</title>\n",
        num(W), num(H), peak_total, ev[size_t(v.peak)].op, n, escape(format_bytes(peak_total)));

    // Phases: background bands in the plot and a labelled strip above it.
    s += "<g class=\"phases\">\n";
    for (size_t a = 0; a < n;) {
        size_t b = a;
        while (b + 1 < n && ev[b + 1].phase == ev[a].phase) ++b;
        const double x = X(a), w = X(b + 1) - X(a);
        const std::string_view fill = svg::phase_fill(ev[a].phase);
        const char * name = phase_name(ev[a].phase);
        s += fmt::format("<rect class=\"band\" data-phase=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
                         "fill=\"{}\"/><rect x=\"{}\" y=\"34\" width=\"{}\" height=\"20\" fill=\"{}\" "
                         "stroke=\"#ffffff\"/>",
                         name, num(x), num(top), num(w), num(ph), fill, num(x), num(w), fill);
        const double label_w = 7.0 * double(std::string_view(name).size()) + 8;
        if (w >= label_w) {
            s += fmt::format("<text x=\"{}\" y=\"48\" class=\"phase-label\" text-anchor=\"middle\">{}</text>",
                             num(x + w / 2), name);
        }
        s += "\n";
        a = b + 1;
    }
    s += "</g>\n";

    // Y grid and ticks (binary units), X ticks every ~n/10 ops.
    for (uint64_t t : ticks) {
        const double y = Y(double(t));
        s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"grid\"/>"
                         "<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{}</text>\n",
                         num(left), num(y), num(left + pw), num(y), num(left - 6), num(y + 4),
                         escape(svg::short_bytes(t)));
    }
    const int xstep = svg::nice_int_step(int(n), 10);
    for (size_t i = 0; i < n; i += size_t(xstep)) {
        const double x = X(i) + slot / 2;
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#666666\"/>"
                         "<text x=\"{0}\" y=\"{3}\" class=\"tick\" text-anchor=\"middle\">{4}</text>\n",
                         num(x), num(top + ph), num(top + ph + 5), num(top + ph + 18), ev[i].op);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis-title\" text-anchor=\"middle\">op index (one {} "
                     "step, {} ops)</text>\n",
                     num(left + pw / 2), num(H - 8), escape(v.r.timeline.program.empty() ? "training"
                                                                                        : v.r.timeline.program),
                     n);
    s += fmt::format("<text x=\"14\" y=\"{0}\" class=\"axis-title\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 14 {0})\">live bytes</text>\n",
                     num(top + ph / 2));

    // The stacked layers, one per category with bytes.
    std::vector<uint64_t> lo(n, 0), hi(n, 0);
    std::string labels;
    for (Category c : kStackOrder) {
        if (!v.used[size_t(c)]) continue;
        std::string values;
        for (size_t i = 0; i < n; ++i) {
            hi[i] = lo[i] + ev[i].live[c];
            if (i) values += ',';
            values += std::to_string(ev[i].live[c]);
        }
        std::string d = "M" + num(X(0)) + "," + num(Y(double(hi[0])));
        for (size_t i = 1; i < n; ++i)
            if (hi[i] != hi[i - 1]) d += "H" + num(X(i)) + "V" + num(Y(double(hi[i])));
        d += "H" + num(X(n)) + "V" + num(Y(double(lo[n - 1])));
        for (size_t i = n - 1; i >= 1; --i)
            if (lo[i - 1] != lo[i]) d += "H" + num(X(i)) + "V" + num(Y(double(lo[i - 1])));
        d += "H" + num(X(0)) + "Z";
        s += fmt::format("<g class=\"series\" data-category=\"{0}\" data-values=\"{1}\"><title>{0}: {2} at the "
                         "peak</title><path data-category=\"{0}\" d=\"{3}\" fill=\"{4}\" stroke=\"#ffffff\" "
                         "stroke-width=\"0.6\"/></g>\n",
                         cat(c), values, escape(format_bytes(v.at_peak[c])), d, svg::category_color(c));

        // Label the layer where it stays thickest over the width of its name.
        const double label_px = 7.0 * double(category_name(c).size()) + 10;
        const size_t half = size_t(std::ceil(label_px / 2 / slot));
        uint64_t best = 0;
        size_t best_i = 0;
        for (size_t i = 0; i < n; ++i) {
            uint64_t m = UINT64_MAX;
            for (size_t k = i >= half ? i - half : 0; k <= std::min(n - 1, i + half); ++k)
                m = std::min(m, ev[k].live[c]);
            const bool closer = std::abs(double(i) - double(n) / 2) < std::abs(double(best_i) - double(n) / 2);
            if (m > best || (m == best && closer)) best = m, best_i = i;
        }
        if (double(best) / axis_top * ph >= 15) {
            const double x = std::clamp(X(best_i) + slot / 2, left + label_px / 2, left + pw - label_px / 2);
            const double y = Y(double(lo[best_i]) + double(ev[best_i].live[c]) / 2) + 4;
            labels += fmt::format("<text x=\"{}\" y=\"{}\" class=\"layer-label\" text-anchor=\"middle\">{}</text>\n",
                                  num(x), num(y), cat(c));
        }
        lo = hi;
    }
    s += labels;

    if (budget_in_range) {
        const double y = Y(double(v.r.budget));
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"budget\"/><text x=\"{3}\" "
                         "y=\"{4}\" class=\"budget-label\" text-anchor=\"end\">budget {5}</text>\n",
                         num(left), num(y), num(left + pw), num(left + pw - 4), num(y - 5),
                         escape(format_bytes(v.r.budget)));
    }

    // Hover targets: one transparent column per op with its description.
    if (n <= 5000) {
        s += "<g class=\"hover\" fill=\"#000000\" fill-opacity=\"0\">";
        for (size_t i = 0; i < n; ++i) {
            s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"><title>op {} ({}): {}",
                             num(X(i)), num(top), num(std::max(slot, 0.1)), num(ph), ev[i].op,
                             escape(op_description(ev[i])), escape(format_bytes(ev[i].live.total())));
            for (Category c : kStackOrder)
                if (ev[i].live[c]) s += fmt::format("&#10;{}: {}", cat(c), escape(format_bytes(ev[i].live[c])));
            s += "</title></rect>";
        }
        s += "</g>\n";
    }

    // The peak: a vertical line, a dot on top of the stack, and its label.
    const auto & pe = ev[size_t(v.peak)];
    const double px = X(size_t(v.peak)) + slot / 2, py = Y(double(peak_total));
    const bool right_side = px > left + pw * 0.62;
    s += fmt::format("<g class=\"peak\"><line x1=\"{0}\" y1=\"20\" x2=\"{0}\" y2=\"{1}\" class=\"peak-line\"/>"
                     "<circle cx=\"{0}\" cy=\"{2}\" r=\"5\" class=\"peak-dot\"/>"
                     "<text x=\"{3}\" y=\"18\" class=\"peak-label\" text-anchor=\"{4}\">peak {5} at op {6} ({7})</text>"
                     "</g>\n",
                     num(px), num(top + ph), num(py), num(right_side ? px - 6 : px + 6), right_side ? "end" : "start",
                     escape(format_bytes(peak_total)), pe.op, escape(op_description(pe)));
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999999\"/>\n",
                     num(left), num(top), num(pw), num(ph));
    return s + "</svg>\n";
}

// Legend with each category's bytes at the peak (top of the stack first), and the buffers
// live at the peak.
std::string legend_and_live(const View & v) {
    std::string s = "<div class=\"row\"><div class=\"col\"><h3>At the peak, by category</h3>\n"
                    "<table class=\"legend\"><tr><th>category</th><th class=\"n\">live at peak</th>"
                    "<th class=\"n\">share</th><th class=\"n\">max over the step</th></tr>\n";
    const uint64_t total = v.at_peak.total();
    for (auto it = kStackOrder.rbegin(); it != kStackOrder.rend(); ++it) {
        const Category c = *it;
        if (!v.used[size_t(c)]) continue;
        uint64_t mx = 0;
        for (const auto & e : v.r.timeline.events) mx = std::max(mx, e.live[c]);
        s += fmt::format("<tr data-category=\"{0}\"><td>{1}{0}</td><td class=\"n\">{2}</td><td class=\"n\">{3}</td>"
                         "<td class=\"n\">{4}</td></tr>\n",
                         cat(c), swatch(c), escape(format_bytes(v.at_peak[c])), escape(pct(v.at_peak[c], total)),
                         escape(format_bytes(mx)));
    }
    s += fmt::format("<tr class=\"total\"><td>total</td><td class=\"n\">{}</td><td class=\"n\">100%</td><td></td>"
                     "</tr></table></div>\n",
                     escape(format_bytes(total)));

    const auto & live = v.r.live_at_peak;
    uint64_t live_sum = 0;
    for (const auto & b : live) live_sum += b.bytes;
    s += fmt::format("<div class=\"col\"><h3>Buffers live at the peak ({}, {})</h3>\n<table class=\"live\">"
                     "<tr><th>buffer</th><th>category</th><th class=\"n\">bytes</th></tr>\n",
                     live.size(), escape(format_bytes(live_sum)));
    const size_t shown = std::min<size_t>(live.size(), 12);
    for (size_t i = 0; i < shown; ++i) {
        s += fmt::format("<tr><td class=\"name\">{}</td><td>{}{}</td><td class=\"n\">{}</td></tr>\n",
                         escape(live[i].name), swatch(live[i].category), cat(live[i].category),
                         escape(format_bytes(live[i].bytes)));
    }
    if (live.size() > shown) {
        uint64_t rest = 0;
        for (size_t i = shown; i < live.size(); ++i) rest += live[i].bytes;
        s += fmt::format("<tr class=\"more\"><td colspan=\"2\">+{} more</td><td class=\"n\">{}</td></tr>\n",
                         live.size() - shown, escape(format_bytes(rest)));
    }
    return s + "</table></div></div>\n";
}

