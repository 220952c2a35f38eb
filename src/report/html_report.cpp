#include "report/html_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "memory/program.h"
#include "report/rank_view.h"
#include "report/svg.h"

namespace memfit {
namespace {

using svg::escape;
using svg::kStackOrder;
using svg::num;

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

// Index in tl.events of the failed op's event (the last one), -1 when none failed.
int failed_event(const Timeline & tl) {
    if (tl.failed_op < 0) return -1;
    for (size_t i = tl.events.size(); i-- > 0;)
        if (tl.events[i].op == tl.failed_op) return int(i);
    return -1;
}

struct View {
    const ReportData & r;
    int peak = -1;                              // index into events (the failed op's when one failed)
    bool failed = false;                        // r.failure: the "peak" is where the allocation failed
    CategoryBytes at_peak;                      // live bytes per category at the peak
    std::array<bool, kCategoryCount> used{};    // non-zero at some op
    Category dominant = Category::activations;
};

View make_view(const ReportData & r) {
    View v{r, -1, !r.failure.empty(), {}, {}, Category::activations};
    v.peak = peak_event(r);
    if (const int f = failed_event(r.timeline); v.failed && f >= 0) v.peak = f;
    for (const auto & e : r.timeline.events)
        for (size_t c = 0; c < kCategoryCount; ++c) v.used[c] = v.used[c] || e.live.v[c] != 0;
    v.at_peak = v.peak >= 0 ? r.timeline.events[size_t(v.peak)].live : r.measured_peak;
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (Category(c) != Category::offloaded && v.at_peak.v[c] > v.at_peak[v.dominant]) v.dominant = Category(c);
    return v;
}

// Legend with each category's bytes at the peak (top of the stack first), and the buffers
// live at the peak.
std::string legend_and_live(const View & v) {
    std::string s = fmt::format("<div class=\"row\"><div class=\"col\"><h3>{}, by category</h3>\n"
                                "<table class=\"legend\"><tr><th>category</th><th class=\"n\">{}</th>"
                                "<th class=\"n\">share</th><th class=\"n\">max over the step</th></tr>\n",
                                v.failed ? "When the allocation failed" : "At the peak",
                                v.failed ? "live at the failure" : "live at peak");
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
    s += fmt::format("<div class=\"col\"><h3>Buffers live {} ({}, {})</h3>\n<table class=\"live\">"
                     "<tr><th>buffer</th><th>category</th><th class=\"n\">bytes</th></tr>\n",
                     v.failed ? "when the allocation failed" : "at the peak", live.size(),
                     escape(format_bytes(live_sum)));
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

// The peak's bytes as one 100% bar split by category, labelled where a segment is wide enough.
std::string share_bar(const CategoryBytes & at_peak) {
    const uint64_t total = at_peak.total();
    std::string s = "<div class=\"share\">";
    for (Category c : kStackOrder) {
        if (total == 0 || at_peak[c] == 0) continue;
        const double share = 100.0 * double(at_peak[c]) / double(total);
        // About 8.5 px per percent at the page's width; the full label, else the share, else none.
        std::string label = fmt::format("{} {:.0f}%", category_name(c), share);
        if (share * 8.5 < 7.0 * double(label.size()) + 8) label = fmt::format("{:.0f}%", share);
        if (share * 8.5 < 7.0 * double(label.size()) + 8) label.clear();
        s += fmt::format("<span style=\"width:{:.3f}%;background:{}\" title=\"{}: {} ({:.1f}%)\">{}</span>", share,
                         svg::category_color(c), cat(c), escape(format_bytes(at_peak[c])), share, escape(label));
    }
    return s + "</div>\n";
}

// Per category with bytes: a light bar (plan) and a solid one (measured) for peak live and for
// reserved bytes, the numbers beside them, "≠ ±X" where they differ. Rows carry the numbers.
std::string plan_vs_measured(const ReportData & r) {
    struct Row { Category c; uint64_t v[4]; };  // planned peak, measured peak, planned rsv, measured rsv
    std::vector<Row> rows;
    uint64_t mx = 1;
    for (size_t c = 0; c < kCategoryCount; ++c) {
        Row row{Category(c), {r.planned_peak.v[c], r.measured_peak.v[c], r.planned_reserved.v[c], r.measured_reserved.v[c]}};
        if (!(row.v[0] | row.v[1] | row.v[2] | row.v[3])) continue;
        for (uint64_t x : row.v) mx = std::max(mx, x);
        rows.push_back(row);
    }
    if (rows.empty()) return "<p class=\"note\">No planned or measured bytes recorded.</p>\n";
    const double W = 1060, label_w = 140, panel_w = (W - label_w) / 2, bar_max = panel_w - 250, row_h = 38;
    const double H = 30 + row_h * double(rows.size());
    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"pvm\" viewBox=\"0 0 {0} {1}\" "
                                "width=\"{0}\" height=\"{1}\" role=\"img\">\n",
                                num(W), num(H));
    s += fmt::format("<text x=\"{}\" y=\"16\" class=\"panel-title\">peak live bytes</text>"
                     "<text x=\"{}\" y=\"16\" class=\"panel-title\">reserved bytes (regions obtained)</text>\n",
                     num(label_w), num(label_w + panel_w));
    double y = 28;
    for (const auto & row : rows) {
        const std::string_view color = svg::category_color(row.c);
        s += fmt::format("<g class=\"pvm-row\" data-category=\"{}\" data-planned-peak=\"{}\" data-measured-peak=\"{}\" "
                         "data-planned-reserved=\"{}\" data-measured-reserved=\"{}\">",
                         category_name(row.c), row.v[0], row.v[1], row.v[2], row.v[3]);
        s += fmt::format("<text x=\"0\" y=\"{}\" class=\"row-label\">{}</text>", num(y + 20), category_name(row.c));
        for (int p = 0; p < 2; ++p) {
            const uint64_t plan = row.v[2 * p], meas = row.v[2 * p + 1];
            const double x0 = label_w + p * panel_w;
            const double wp = double(plan) / double(mx) * bar_max, wm = double(meas) / double(mx) * bar_max;
            const std::string plan_text = format_bytes(plan) + " planned", meas_text = format_bytes(meas) + " measured";
            s += fmt::format("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"12\" fill=\"{3}\" fill-opacity=\"0.35\" "
                             "stroke=\"{3}\"/><text x=\"{4}\" y=\"{5}\" class=\"bar-num\">{6}</text>",
                             num(x0), num(y + 3), num(std::max(wp, 0.5)), color, num(x0 + wp + 6), num(y + 13),
                             escape(plan_text));
            s += fmt::format("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"12\" fill=\"{3}\"/>"
                             "<text x=\"{4}\" y=\"{5}\" class=\"bar-num\">{6}</text>",
                             num(x0), num(y + 18), num(std::max(wm, 0.5)), color, num(x0 + wm + 6), num(y + 28),
                             escape(meas_text));
            if (plan != meas) {
                const bool more = meas > plan;
                const double dx = x0 + wm + 12 + 7.2 * double(meas_text.size());
                s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"differs\">\u2260 {}{}</text>", num(dx), num(y + 28),
                                 more ? "+" : "\u2212", escape(format_bytes(more ? meas - plan : plan - meas)));
            }
        }
        s += "</g>\n";
        y += row_h;
    }
    return s + "</svg>\n";
}

// ---------------------------------------------------------------------------------------------
// The other sections.

std::string card(std::string_view label, const std::string & value_html, const std::string & sub_html,
                 std::string_view extra_class = "") {
    return fmt::format("<div class=\"card{}{}\"><div class=\"label\">{}</div><div class=\"value\">{}</div>"
                       "<div class=\"sub\">{}</div></div>\n",
                       extra_class.empty() ? "" : " ", extra_class, label, value_html, sub_html);
}

std::string headline(const View & v) {
    const ReportData & r = v.r;
    const uint64_t plan = r.planned_peak.total(), meas = r.measured_peak.total();
    std::string s = "<div class=\"cards\">\n";
    s += card("planned peak", escape(format_bytes(plan)), "sum of each category's planned peak live bytes");
    std::string diff = "matches the plan";
    if (meas != plan)
        diff = fmt::format("\u2260 plan by {}{}", meas > plan ? "+" : "\u2212",
                           escape(format_bytes(meas > plan ? meas - plan : plan - meas)));
    s += card("measured peak", escape(format_bytes(meas)), diff, meas != plan ? "warn" : "");
    if (r.budget > 0) {
        const bool over = meas > r.budget;
        s += card("budget", escape(format_bytes(r.budget)),
                  over ? "exceeded by " + escape(format_bytes(meas - r.budget))
                       : escape(pct(meas, r.budget)) + " used at the peak",
                  over ? "warn" : "");
    }
    s += card("peak RSS", escape(format_bytes(r.peak_rss)), "resident set of the whole process");
    const uint64_t total = v.at_peak.total();
    std::string where = "the peak";
    if (v.peak >= 0) {
        const auto & e = r.timeline.events[size_t(v.peak)];
        where = fmt::format("op {} ({})", e.op, escape(svg::op_label(e)));
    }
    const std::string_view dominates = v.failed ? "dominates at the failure" : "dominates the peak";
    if (total == 0)
        s += card(dominates, "no bytes recorded", "", "wide");
    else
        s += card(dominates,
                  fmt::format("{}{}: {} of {}", swatch(v.dominant), cat(v.dominant),
                              escape(pct(v.at_peak[v.dominant], total)), v.failed ? "the live bytes" : "the peak"),
                  fmt::format("{} of {} at {}", escape(format_bytes(v.at_peak[v.dominant])),
                              escape(format_bytes(total)), where),
                  "wide");
    s += "</div>\n";
    s += share_bar(v.at_peak);
    return s;
}

// The red banner of a step that failed out of memory: what failed and at which op.
std::string failure_banner(const ReportData & r) {
    const int f = failed_event(r.timeline);
    std::string at;
    if (f >= 0) {
        const auto & e = r.timeline.events[size_t(f)];
        at = fmt::format(" at op {} ({})", e.op, escape(svg::op_label(e)));
    } else if (r.timeline.failed_op >= 0) {
        at = fmt::format(" at op {}", r.timeline.failed_op);
    }
    return fmt::format("<div class=\"failure\" data-failed-op=\"{}\">This step failed: {}{}</div>\n",
                       r.timeline.failed_op, escape(r.failure), at);
}

std::string config_table(const nlohmann::json & config) {
    if (config.is_null() || (config.is_object() && config.empty())) return "";
    std::string s = "<table class=\"config\"><tr><th colspan=\"2\">configuration</th></tr>\n";
    auto text = [](const nlohmann::json & j) {
        return j.is_string() ? j.get<std::string>() : j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    if (!config.is_object()) return s + "<tr><td colspan=\"2\">" + escape(text(config)) + "</td></tr></table>\n";
    for (const auto & [key, value] : config.items())
        s += fmt::format("<tr><td class=\"key\">{}</td><td>{}</td></tr>\n", escape(key), escape(text(value)));
    return s + "</table>\n";
}

std::string largest_buffers(const View & v) {
    const ReportData & r = v.r;
    const int nops = r.num_ops > 0 ? r.num_ops : int(r.timeline.events.size());
    const int peak_op = v.peak >= 0 ? r.timeline.events[size_t(v.peak)].op : r.peak_op;
    std::string s = fmt::format("<table class=\"largest\"><tr><th class=\"n\">#</th><th>buffer</th><th>category</th>"
                                "<th class=\"n\">bytes</th><th>lifetime (ops)</th><th>over the step (red: {})</th>"
                                "</tr>\n",
                                v.failed ? "the failed op" : "the peak");
    for (size_t i = 0; i < r.largest.size() && i < 10; ++i) {
        const auto & b = r.largest[i];
        const int first = b.persistent ? 0 : b.first_op, last = b.persistent ? nops - 1 : b.last_op;
        const std::string span = b.persistent ? "persistent" : fmt::format("{}\u2013{}", b.first_op, b.last_op);
        s += fmt::format("<tr><td class=\"n\">{}</td><td class=\"name\">{}</td><td>{}{}</td><td class=\"n\">{}</td>"
                         "<td>{}</td><td>{}</td></tr>\n",
                         i + 1, escape(b.name), swatch(b.category), cat(b.category), escape(format_bytes(b.bytes)),
                         escape(span), svg::lifetime_strip(first, last, nops, peak_op, svg::category_color(b.category)));
    }
    return s + "</table>\n";
}

// The last step's tokens per expert, a row per sparse layer, each cell shaded by its share of
// the busiest expert's.
std::string expert_table(const std::vector<std::vector<double>> & t) {
    if (t.empty()) return "";
    std::string s = "<p>tokens per expert in the last step (a row per sparse layer; moe/max_load: the busiest "
                    "expert's over the mean)</p><table class=\"experts\">\n";
    for (size_t l = 0; l < t.size(); ++l) {
        double most = 1;
        for (double v : t[l]) most = std::max(most, v);
        s += fmt::format("<tr><td class=\"n\">{}</td>", l);
        for (double v : t[l])
            s += fmt::format("<td class=\"n\" style=\"background: rgba(78,121,167,{:.2f})\">{:g}</td>", v / most * 0.6, v);
        s += "</tr>\n";
    }
    return s + "</table>\n";
}

std::string curves(const ReportData & r) {
    auto pts = [](const std::vector<CurvePoint> & c) {
        std::vector<svg::LinePoint> p;
        for (const auto & x : c) p.push_back({double(x.step), x.value});
        return p;
    };
    std::string s = "<div class=\"row\">\n";
    std::vector<svg::LineSeries> loss = {{"train loss", "#4e79a7", pts(r.loss), false}};
    if (!r.val_loss.empty()) loss.push_back({"val loss", "#f28e2b", pts(r.val_loss), true});
    s += "<div class=\"col\"><h3>Loss</h3>" + svg::line_chart(loss, "loss", false) + "</div>\n";
    if (!r.tokens_per_s.empty())
        s += "<div class=\"col\"><h3>Throughput</h3>" +
             svg::line_chart({{"tokens/s", "#59a14f", pts(r.tokens_per_s), false}}, "tokens/s", true) + "</div>\n";
    if (!r.margins.empty())
        s += "<div class=\"col\"><h3>Preference (DPO)</h3>" +
             svg::line_chart({{"rewards/margins", "#e15759", pts(r.margins), false},
                              {"rewards/accuracies", "#b07aa1", pts(r.accuracies), true}},
                             "reward", false) +
             "</div>\n";
    if (!r.aux_loss.empty())
        s += "<div class=\"col\"><h3>Routing (mixture of experts)</h3>" +
             svg::line_chart({{"moe/aux_loss", "#76b7b2", pts(r.aux_loss), false},
                              {"moe/max_load", "#edc948", pts(r.max_load), true}},
                             "loss", false) +
             expert_table(r.expert_tokens) + "</div>\n";
    return s + "</div>\n";
}

constexpr const char * kStyle = R"(
body { margin: 0; background: #f4f5f7; color: #1f2328; font-size: 14px;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
.wrap { max-width: 1120px; margin: 0 auto; padding: 12px 20px 40px; }
h1 { font-size: 22px; margin: 10px 0 2px; } h2 { font-size: 17px; margin: 0 0 8px; }
h3 { font-size: 14px; margin: 4px 0 6px; color: #444c56; }
.subtitle { color: #57606a; margin: 0 0 10px; }
section { background: #ffffff; border: 1px solid #dfe2e6; border-radius: 6px; padding: 12px 16px; margin: 12px 0; }
.top { display: flex; gap: 16px; align-items: flex-start; } .top .main { flex: 1; min-width: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 8px; margin-bottom: 10px; }
.card { border: 1px solid #dfe2e6; border-radius: 6px; padding: 6px 10px; min-width: 120px; background: #fafbfc; }
.card.wide { flex: 1; min-width: 260px; } .card.warn .sub { color: #b42318; }
.card .label { font-size: 12px; color: #57606a; text-transform: uppercase; letter-spacing: 0.03em; }
.card .value { font-size: 19px; font-weight: 600; margin: 2px 0; } .card .sub { font-size: 12px; color: #57606a; }
.share { display: flex; height: 24px; border-radius: 4px; overflow: hidden; }
.share span { color: #ffffff; font-size: 12px; font-weight: 600; line-height: 24px; text-align: center;
  white-space: nowrap; overflow: hidden; border-right: 1px solid #ffffff; }
table { border-collapse: collapse; }
th, td { padding: 2px 8px; text-align: left; vertical-align: middle; }
th { font-weight: 600; color: #444c56; border-bottom: 1px solid #dfe2e6; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
td.name, td.key { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
tr.total td { border-top: 1px solid #dfe2e6; font-weight: 600; } tr.more td { color: #57606a; font-style: italic; }
table.config { font-size: 12px; background: #fafbfc; border: 1px solid #dfe2e6; } table.config td { padding: 1px 8px; }
.sw { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 6px; vertical-align: -1px; }
.row { display: flex; flex-wrap: wrap; gap: 24px; } .col { flex: 1; min-width: 320px; }
svg.chart, svg.pvm { width: 100%; height: auto; display: block; }
svg.linechart { width: 100%; height: auto; max-width: 540px; } svg.strip { vertical-align: middle; }
svg text { font-family: inherit; font-size: 12px; fill: #1f2328; }
svg .tick, svg .axis-title, svg .panel-title { fill: #444c56; } svg .grid { stroke: #000000; stroke-opacity: 0.12; }
svg .phase-label, svg .panel-title, svg .row-label, svg .budget-label { font-weight: 600; }
svg .layer-label { font-size: 12.5px; font-weight: 600; paint-order: stroke; stroke: #ffffff; stroke-width: 3px;
  stroke-opacity: 0.8; }
svg .peak-line { stroke: #c62828; stroke-width: 1.6; stroke-dasharray: 5 3; }
svg .peak-dot { fill: #c62828; stroke: #ffffff; stroke-width: 1.5; }
svg .peak-label { fill: #c62828; font-weight: 700; font-size: 13.5px; }
svg .budget { stroke: #6a1b9a; stroke-width: 1.5; stroke-dasharray: 8 4; } svg .budget-label { fill: #6a1b9a; }
svg .differs { fill: #b42318; font-weight: 700; }
.failure { background: #fdecea; border: 1px solid #d93025; border-left: 6px solid #c62828; border-radius: 6px;
  color: #8a1c12; padding: 10px 14px; margin: 12px 0 4px; font-size: 15px; }
svg.ranks, svg.rank-timeline { width: 100%; height: auto; display: block; }
svg .planned-tick { stroke: #1f2328; stroke-width: 2.5; } svg .legend-text { fill: #444c56; }
ul.hints li { margin: 4px 0; } .note { color: #57606a; font-size: 12.5px; margin: 6px 0 0; }
footer { color: #8b949e; font-size: 12px; margin-top: 16px; }
)";

}  // namespace

std::string render_html_report(const ReportData & r) {
    const View v = make_view(r);
    const std::string title = r.title.empty() ? "memfit memory report" : r.title;
    std::string s = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n";
    s += "<title>" + escape(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<div class=\"wrap\">\n";
    if (!r.failure.empty()) s += failure_banner(r);
    s += "<h1>" + escape(title) + "</h1>\n";
    s += fmt::format("<p class=\"subtitle\">Where the bytes of one {} step go: {} ops, memory per category as the "
                     "ledger measured it.</p>\n",
                     escape(r.timeline.program.empty() ? "training" : r.timeline.program),
                     r.num_ops > 0 ? r.num_ops : int(r.timeline.events.size()));

    s += "<section class=\"top\"><div class=\"main\">\n" + headline(v) + "</div>\n" + config_table(r.config) +
         "</section>\n";

    s += "<section><h2>Live memory over the step</h2>\n";
    if (v.peak >= 0) {
        s += svg::area_chart(r.timeline.events, v.peak, r.budget, r.timeline.program,
                             v.failed ? "allocation failed with" : "peak");
        if (r.budget > 0 && double(r.budget) > 1.3 * double(r.timeline.events[size_t(v.peak)].live.total()))
            s += fmt::format("<p class=\"note\">The budget ({}) is above the chart's range.</p>\n",
                             escape(format_bytes(r.budget)));
        if (v.failed)
            s += fmt::format("<p class=\"note\">The step ended at op {}, where an allocation failed: the marker is that "
                             "op, with the bytes held when it failed.</p>\n",
                             r.timeline.events[size_t(v.peak)].op);
        s += legend_and_live(v);
    } else {
        s += "<p class=\"note\">No timeline was recorded for this report.</p>\n";
    }
    s += "</section>\n";

    s += "<section><h2>Planned vs measured, per category</h2>\n" +
         plan_vs_measured(r) +
         fmt::format("<p class=\"note\">Totals: peak live planned {} / measured {}; reserved planned {} / measured "
                     "{}. Light bars: the plan; solid bars: the ledger's measurement; \u2260 marks a difference.</p>\n",
                     escape(format_bytes(r.planned_peak.total())), escape(format_bytes(r.measured_peak.total())),
                     escape(format_bytes(r.planned_reserved.total())), escape(format_bytes(r.measured_reserved.total()))) +
         "</section>\n";

    s += rank_view_section(r);

    if (!r.largest.empty())
        s += "<section><h2>The largest buffers</h2>\n" + largest_buffers(v) + "</section>\n";

    if (!r.hints.empty()) {
        s += "<section><h2>Hints</h2>\n<ul class=\"hints\">\n";
        for (const auto & h : r.hints) s += "<li>" + escape(h) + "</li>\n";
        s += "</ul></section>\n";
    }

    if (!r.loss.empty()) s += "<section><h2>Training</h2>\n" + curves(r) + "</section>\n";

    s += "<footer>memfit report: a self-contained page (no scripts, nothing loaded from the network).</footer>\n";
    return s + "</div>\n</body>\n</html>\n";
}

void write_html_report(const std::string & path, const ReportData & r) {
    const std::string text = render_html_report(r);
    write_file_atomic(path, text);
}

}  // namespace memfit
