#include "report/rank_view.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "core/units.h"
#include "report/svg.h"

namespace memfit {
namespace {

using svg::escape;
using svg::num;

constexpr double kCharPx = 7.0;  // average width of a 12px character, as in svg.cpp

// One colour per rank line (Tableau 10, cycled).
std::string_view rank_color(size_t i) {
    static constexpr std::array<std::string_view, 10> colors = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
    return colors[i % colors.size()];
}

std::string rank_name(const RankView & rv) {
    return rv.label.empty() ? fmt::format("rank {}", rv.rank) : rv.label;
}

// The numbers beside a rank's bar.
std::string bar_numbers(const RankView & rv) {
    std::string s = fmt::format("{} \u00b7 plan {} \u00b7 RSS {}", svg::short_bytes(rv.measured_peak.total()),
                                svg::short_bytes(rv.planned_peak.total()), svg::short_bytes(rv.peak_rss));
    if (rv.measured_peak[Category::offloaded] != 0)
        s += fmt::format(" \u00b7 +{} offloaded", svg::short_bytes(rv.measured_peak[Category::offloaded]));
    return s;
}

// Decimals that show a tick step of `step` exactly enough (0 for steps of 1 and above).
int decimals(double step) {
    if (!(step > 0) || step >= 1) return 0;
    return std::clamp(int(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
}

}  // namespace

std::string rank_peak_bars(const std::vector<RankView> & ranks) {
    if (ranks.empty()) return "";
    uint64_t mx = 1;
    size_t longest = 0, longest_numbers = 0;
    std::array<bool, kCategoryCount> used{};
    for (const auto & rv : ranks) {
        mx = std::max({mx, rv.measured_peak.total(), rv.planned_peak.total()});
        longest = std::max(longest, rank_name(rv).size());
        longest_numbers = std::max(longest_numbers, bar_numbers(rv).size());
        for (Category c : svg::kStackOrder) used[size_t(c)] = used[size_t(c)] || rv.measured_peak[c] != 0;
    }
    const double W = 1060, row_h = 30, top = 34, bar_h = 16;
    const double label_w = std::clamp(kCharPx * double(longest) + 14, 80.0, 320.0);
    const double text_w = std::clamp(6.8 * double(longest_numbers) + 24, 200.0, 420.0);
    const double bar_max = W - label_w - text_w, text_x = label_w + bar_max + 14;
    const double H = top + row_h * double(ranks.size()) + 6;
    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"ranks\" viewBox=\"0 0 {0} {1}\" "
                                "width=\"{0}\" height=\"{1}\" role=\"img\" data-num-ranks=\"{2}\">\n"
                                "<title>measured peak live bytes per rank, by category; ticks: planned peaks</title>\n",
                                num(W), num(H), ranks.size());

    // Legend: the categories in the bars, bottom of the stack first, then the planned tick.
    double lx = label_w;
    for (Category c : svg::kStackOrder) {
        if (!used[size_t(c)]) continue;
        s += fmt::format("<rect x=\"{}\" y=\"6\" width=\"11\" height=\"11\" fill=\"{}\"/><text x=\"{}\" y=\"16\" "
                         "class=\"legend-text\">{}</text>",
                         num(lx), svg::category_color(c), num(lx + 15), category_name(c));
        lx += 30 + kCharPx * double(category_name(c).size());
    }
    s += fmt::format("<line x1=\"{0}\" y1=\"4\" x2=\"{0}\" y2=\"19\" class=\"planned-tick\"/><text x=\"{1}\" y=\"16\" "
                     "class=\"legend-text\">planned peak</text>\n",
                     num(lx + 4), num(lx + 10));

    double y = top;
    for (const auto & rv : ranks) {
        const uint64_t meas = rv.measured_peak.total(), plan = rv.planned_peak.total();
        const std::string name = rank_name(rv);
        s += fmt::format("<g class=\"rank\" data-rank=\"{}\" data-total=\"{}\" data-planned=\"{}\" "
                         "data-peak-rss=\"{}\"><title>{}: measured peak {}, planned {}, peak RSS {}</title>",
                         rv.rank, meas, plan, rv.peak_rss, escape(name), escape(format_bytes(meas)),
                         escape(format_bytes(plan)), escape(format_bytes(rv.peak_rss)));
        s += fmt::format("<text x=\"0\" y=\"{}\" class=\"row-label\">{}</text>", num(y + bar_h - 3), escape(name));
        double x = label_w;
        for (Category c : svg::kStackOrder) {
            if (rv.measured_peak[c] == 0) continue;
            const double w = double(rv.measured_peak[c]) / double(mx) * bar_max;
            s += fmt::format("<rect data-category=\"{0}\" x=\"{1}\" y=\"{2}\" width=\"{3}\" height=\"{4}\" fill=\"{5}\" "
                             "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>{0}: {6}</title></rect>",
                             category_name(c), num(x), num(y), num(std::max(w, 0.5)), num(bar_h),
                             svg::category_color(c), escape(format_bytes(rv.measured_peak[c])));
            x += w;
        }
        const double px = label_w + double(plan) / double(mx) * bar_max;
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" class=\"planned-tick\"><title>planned peak "
                         "{3}</title></line>",
                         num(px), num(y - 4), num(y + bar_h + 4), escape(format_bytes(plan)));
        s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"bar-num\">{}</text></g>\n", num(text_x), num(y + bar_h - 3),
                         escape(bar_numbers(rv)));
        y += row_h;
    }
    return s + "</svg>\n";
}

std::string rank_timelines(const std::vector<RankView> & ranks) {
    std::vector<const RankView *> with;
    for (const auto & rv : ranks)
        if (!rv.timeline.events.empty()) with.push_back(&rv);
    if (with.size() < 2) return "";

    // Each rank's x origin: its first event's begin.
    double xmax = 0;
    uint64_t ymax = 0;
    std::vector<double> t0(with.size());
    for (size_t k = 0; k < with.size(); ++k) {
        const auto & ev = with[k]->timeline.events;
        t0[k] = ev.front().begin_us;
        for (const auto & e : ev) t0[k] = std::min(t0[k], e.begin_us);
        for (const auto & e : ev) {
            xmax = std::max(xmax, (std::max(e.end_us, e.begin_us) - t0[k]) / 1000.0);
            ymax = std::max(ymax, e.live.total());
        }
    }
    if (!(xmax > 0) || !std::isfinite(xmax)) xmax = 1;

    const double W = 1060, left = 78, right = 18, top = 16, plot_h = 250, item_w = 250;
    const double pw = W - left - right;
    const size_t per_row = std::max<size_t>(1, size_t(pw / item_w)), rows = (with.size() + per_row - 1) / per_row;
    const double legend_y = top + plot_h + 50, H = legend_y + 18 * double(rows);
    const std::vector<uint64_t> ticks = svg::byte_ticks(ymax, 5);
    const double ytop = double(ticks.back()), xstep = svg::nice_step(xmax, 8);
    const double xtop = std::ceil(xmax / xstep - 1e-9) * xstep;
    auto X = [&](double ms) { return left + ms / xtop * pw; };
    auto Y = [&](double b) { return top + plot_h - b / ytop * plot_h; };

    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"rank-timeline\" viewBox=\"0 0 {0} "
                                "{1}\" width=\"{0}\" height=\"{1}\" role=\"img\" data-num-ranks=\"{2}\">\n<title>total "
                                "live bytes over the step, one line per rank</title>\n",
                                num(W), num(H), with.size());
    for (uint64_t t : ticks)
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"grid\"/><text x=\"{3}\" y=\"{4}\" "
                         "class=\"tick\" text-anchor=\"end\">{5}</text>\n",
                         num(left), num(Y(double(t))), num(left + pw), num(left - 6), num(Y(double(t)) + 4),
                         escape(svg::short_bytes(t)));
    for (double v = 0; v <= xtop + xstep * 1e-6; v += xstep)
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#888888\"/><text x=\"{0}\" "
                         "y=\"{3}\" class=\"tick\" text-anchor=\"middle\">{4:.{5}f}</text>\n",
                         num(X(v)), num(top + plot_h), num(top + plot_h + 4), num(top + plot_h + 17), v,
                         decimals(xstep));
    s += fmt::format("<text x=\"{0}\" y=\"{1}\" class=\"axis-title\" text-anchor=\"middle\">milliseconds since the "
                     "rank's first op</text>\n<text x=\"14\" y=\"{2}\" class=\"axis-title\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 14 {2})\">live bytes</text>\n",
                     num(left + pw / 2), num(top + plot_h + 34), num(top + plot_h / 2));

    for (size_t k = 0; k < with.size(); ++k) {
        const RankView & rv = *with[k];
        const auto & ev = rv.timeline.events;
        // A step line: each op's total holds from its begin to the next op's begin (its own end
        // for the last).
        std::string pts;
        size_t n = 0;
        uint64_t peak = 0;
        auto point = [&](double us, uint64_t bytes) {
            if (n++) pts += ' ';
            pts += num(X((us - t0[k]) / 1000.0)), pts += ',', pts += num(Y(double(bytes)));
        };
        for (size_t i = 0; i < ev.size(); ++i) {
            const uint64_t total = ev[i].live.total();
            peak = std::max(peak, total);
            const double until = i + 1 < ev.size() ? ev[i + 1].begin_us : std::max(ev[i].end_us, ev[i].begin_us);
            point(ev[i].begin_us, total);
            point(until, total);
        }
        const std::string_view color = rank_color(k);
        const std::string name = rank_name(rv);
        s += fmt::format("<g class=\"rank-line\" data-rank=\"{}\" data-points=\"{}\" data-max=\"{}\"><title>{}: peak {}"
                         "</title><polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"/></g>\n",
                         rv.rank, ev.size(), peak, escape(name), escape(format_bytes(peak)), pts, color);
        const double lx = left + item_w * double(k % per_row), ly = legend_y + 18 * double(k / per_row);
        s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\"/><text x=\"{}\" "
                         "y=\"{}\" class=\"legend-text\">{}</text>\n",
                         num(lx), num(ly - 4), num(lx + 18), num(ly - 4), color, num(lx + 24), num(ly),
                         escape(name));
    }
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999999\"/>\n",
                     num(left), num(top), num(pw), num(plot_h));
    return s + "</svg>\n";
}

std::string rank_view_section(const ReportData & r) {
    if (r.ranks.size() < 2) return "";
    const RankView * hi = &r.ranks.front();
    const RankView * lo = hi;
    bool offloaded = false;
    for (const auto & rv : r.ranks) {
        if (rv.measured_peak.total() > hi->measured_peak.total()) hi = &rv;
        if (rv.measured_peak.total() < lo->measured_peak.total()) lo = &rv;
        offloaded = offloaded || rv.measured_peak[Category::offloaded] != 0;
    }
    std::string s = "<section class=\"per-rank\"><h2>Memory per rank</h2>\n";
    s += fmt::format("<p class=\"note\">{} ranks. Each bar is a rank's measured peak live bytes by category, the dark "
                     "tick its planned peak{}. Largest: {} ({}); smallest: {} ({}).</p>\n",
                     r.ranks.size(), offloaded ? "; offloaded bytes (host memory or files) are not in the bars" : "",
                     escape(rank_name(*hi)), escape(format_bytes(hi->measured_peak.total())), escape(rank_name(*lo)),
                     escape(format_bytes(lo->measured_peak.total())));
    s += rank_peak_bars(r.ranks);
    const std::string lines = rank_timelines(r.ranks);
    if (!lines.empty()) s += "<h3>Total live bytes over the step, per rank</h3>\n" + lines;
    return s + "</section>\n";
}

}  // namespace memfit
