#include "report/svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/units.h"

namespace memfit::svg {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at s[i] that is an XML 1.0 character, or 0 if invalid.
size_t xml_char_len(std::string_view s, size_t i) {
    const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = u(i);
    if (c < 0x80) return (c >= 0x20 || c == '\t' || c == '\n' || c == '\r') ? 1 : 0;
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (i + len > s.size()) return 0;
    for (size_t k = 1; k < len; ++k) {
        if ((u(i + k) & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (u(i + k) & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF) return 0;
    return len;
}

}  // namespace

std::string escape(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 16);
    for (size_t i = 0; i < text.size();) {
        const size_t len = xml_char_len(text, i);
        if (len == 0) {
            out += kReplacement;
            ++i;
            continue;
        }
        if (len == 1) {
            switch (text[i]) {
                case '&': out += "&amp;"; break;
                case '<': out += "&lt;"; break;
                case '>': out += "&gt;"; break;
                case '"': out += "&quot;"; break;
                case '\'': out += "&#39;"; break;
                default: out += text[i];
            }
        } else {
            out.append(text.substr(i, len));
        }
        i += len;
    }
    return out;
}

std::string num(double v) {
    if (!std::isfinite(v)) return "0";
    std::string s = fmt::format("{:.1f}", v);
    if (s.ends_with(".0")) s.resize(s.size() - 2);
    if (s == "-0") s = "0";
    return s;
}

std::string_view category_color(Category c) {
    // Tableau 10: distinct hues that stay distinguishable when stacked.
    static constexpr std::array<std::string_view, kCategoryCount> colors = {
        "#4e79a7",  // parameters: blue
        "#76b7b2",  // master_weights: teal
        "#f28e2b",  // optimizer_states: orange
        "#e15759",  // gradients: red
        "#59a14f",  // activations: green
        "#edc948",  // workspace: yellow
        "#b07aa1",  // communication: purple
        "#9c755f",  // runtime: brown
    };
    return colors[size_t(c)];
}

std::string_view phase_fill(Phase p) {
    switch (p) {
        case Phase::forward: return "#e3edf9";
        case Phase::backward: return "#fbe9dc";
        case Phase::recompute: return "#efe4f5";
        case Phase::communication: return "#f5f1d8";
        case Phase::optimizer: return "#e2f2dc";
        case Phase::other: return "#eeeeee";
    }
    return "#eeeeee";
}

std::string short_bytes(uint64_t bytes) {
    std::string s = format_bytes(bytes);
    const size_t space = s.find(' ');
    const size_t dot = s.find('.');
    if (dot != std::string::npos && space != std::string::npos && dot < space) {
        size_t end = space;
        while (end > dot + 1 && s[end - 1] == '0') --end;
        if (end == dot + 1) end = dot;
        s.erase(end, space - end);
    }
    return s;
}

std::vector<uint64_t> byte_ticks(uint64_t max, int max_ticks) {
    if (max == 0) return {0, 1};
    max_ticks = std::max(max_ticks, 1);
    uint64_t step = 1;
    while ((max + step - 1) / step > uint64_t(max_ticks) && step < (uint64_t(1) << 62)) step *= 2;
    std::vector<uint64_t> ticks;
    for (uint64_t t = 0;; t += step) {
        ticks.push_back(t);
        if (t >= max) break;
    }
    return ticks;
}

double nice_step(double span, int target) {
    if (!(span > 0) || !std::isfinite(span)) return 1;
    const double raw = span / std::max(target, 1);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        if (m * mag >= raw * (1 - 1e-9)) return m * mag;
    }
    return 10 * mag;
}

int nice_int_step(int n, int target) {
    if (n <= 1) return 1;
    const double s = nice_step(double(n), target);
    return std::max(1, int(std::lround(s)));
}

int decimals_for(double step) {
    if (!(step > 0) || step >= 1) return 0;
    return std::clamp(int(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
}

std::string line_chart(const std::vector<LineSeries> & series, const LineChartOptions & opt) {
    const double W = opt.width, H = opt.height;
    const double left = 64, right = 16, top = 30, bottom = 44;
    const double pw = W - left - right, ph = H - top - bottom;

    double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
    for (const auto & s : series) {
        for (const auto & p : s.points) {
            if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
            xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
            ylo = std::min(ylo, p.y), yhi = std::max(yhi, p.y);
        }
    }
    if (!std::isfinite(xlo)) xlo = 0, xhi = 1, ylo = 0, yhi = 1;
    if (xhi == xlo) xlo -= 1, xhi += 1;
    if (opt.y_from_zero) ylo = std::min(0.0, ylo);
    if (yhi == ylo) ylo -= 1, yhi += 1;
    const double ystep = nice_step(yhi - ylo, 5);
    ylo = std::floor(ylo / ystep) * ystep;
    yhi = std::ceil(yhi / ystep) * ystep;
    const double xstep = std::max(nice_step(xhi - xlo, 6), 1.0);

    auto X = [&](double x) { return left + (x - xlo) / (xhi - xlo) * pw; };
    auto Y = [&](double y) { return top + ph - (y - ylo) / (yhi - ylo) * ph; };
    auto label = [](double v, double step) {
        if (step >= 1000) {
            return fmt::format("{:.{}f}k", v / 1000, decimals_for(step / 1000));
        }
        return fmt::format("{:.{}f}", v, decimals_for(step));
    };

    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"{}\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" "
        "role=\"img\">\n",
        escape(opt.css_class), num(W), num(H), num(W), num(H));
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#ffffff\" stroke=\"#cccccc\"/>\n",
                     num(left), num(top), num(pw), num(ph));
    // Y grid and labels.
    for (int k = 0;; ++k) {
        const double v = ylo + k * ystep;
        if (v > yhi + ystep * 1e-6) break;
        const double y = Y(v);
        s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"grid\"/>", num(left), num(y),
                         num(left + pw), num(y));
        s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", num(left - 6),
                         num(y + 4), escape(label(v, ystep)));
    }
    // X ticks.
    for (double v = std::ceil(xlo / xstep) * xstep; v <= xhi + xstep * 1e-6; v += xstep) {
        const double x = X(v);
        s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#888888\"/>", num(x), num(top + ph),
                         num(x), num(top + ph + 4));
        s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", num(x),
                         num(top + ph + 17), escape(label(v, xstep)));
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis-title\" text-anchor=\"middle\">{}</text>\n",
                     num(left + pw / 2), num(H - 6), escape(opt.x_label));
    s += fmt::format("<text x=\"12\" y=\"{}\" class=\"axis-title\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 12 {})\">{}</text>\n",
                     num(top + ph / 2), num(top + ph / 2), escape(opt.y_label));

    double lx = left;
    for (const auto & ser : series) {
        std::string pts;
        std::string marks;
        size_t n = 0;
        for (const auto & p : ser.points) {
            if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
            if (!pts.empty()) pts += ' ';
            pts += num(X(p.x)) + "," + num(Y(p.y));
            marks += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.5\"/>", num(X(p.x)), num(Y(p.y)));
            ++n;
        }
        const std::string color = escape(ser.color);
        s += fmt::format("<g class=\"line\" data-series=\"{}\" fill=\"{}\">", escape(ser.label), color);
        if (n >= 2) {
            s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>", pts, color);
        }
        if (ser.markers || n < 2) s += marks;
        s += "</g>\n";
        // Legend entry above the plot.
        s += fmt::format("<line x1=\"{}\" y1=\"14\" x2=\"{}\" y2=\"14\" stroke=\"{}\" stroke-width=\"3\"/>", num(lx),
                         num(lx + 18), color);
        s += fmt::format("<text x=\"{}\" y=\"18\" class=\"legend-text\">{}</text>\n", num(lx + 24),
                         escape(ser.label));
        lx += 40 + 7.5 * double(ser.label.size());
    }
    s += "</svg>\n";
    return s;
}

std::string plan_vs_measured_bars(const CategoryBytes & plan_live, const CategoryBytes & meas_live,
                                  const CategoryBytes & plan_reserved, const CategoryBytes & meas_reserved) {
    struct Row { Category c; uint64_t v[4]; };  // planned peak, measured peak, planned rsv, measured rsv
    std::vector<Row> rows;
    uint64_t mx = 1;
    for (size_t c = 0; c < kCategoryCount; ++c) {
        Row row{Category(c), {plan_live.v[c], meas_live.v[c], plan_reserved.v[c], meas_reserved.v[c]}};
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
        const std::string_view color = category_color(row.c);
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
                const double dx = x0 + wm + 12 + 6.6 * double(meas_text.size());
                s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"differs\">\u2260 {}{}</text>", num(dx), num(y + 28),
                                 more ? "+" : "\u2212", escape(format_bytes(more ? meas - plan : plan - meas)));
            }
        }
        s += "</g>\n";
        y += row_h;
    }
    return s + "</svg>\n";
}

std::string lifetime_strip(int first_op, int last_op, int num_ops, int mark_op, std::string_view color,
                           double width) {
    const double h = 14;
    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"strip\" viewBox=\"0 0 {0} {1}\" "
                                "width=\"{0}\" height=\"{1}\" data-first-op=\"{2}\" data-last-op=\"{3}\">"
                                "<rect x=\"0\" y=\"3\" width=\"{0}\" height=\"8\" fill=\"#eceef1\"/>",
                                num(width), num(h), first_op, last_op);
    if (num_ops > 0 && first_op >= 0 && last_op >= first_op) {
        const double x0 = double(std::min(first_op, num_ops - 1)) / num_ops * width;
        const double x1 = double(std::min(last_op, num_ops - 1) + 1) / num_ops * width;
        s += fmt::format("<rect x=\"{}\" y=\"2\" width=\"{}\" height=\"10\" fill=\"{}\"/>", num(x0),
                         num(std::max(x1 - x0, 1.0)), escape(color));
    }
    if (num_ops > 0 && mark_op >= 0 && mark_op < num_ops) {
        const double x = (double(mark_op) + 0.5) / num_ops * width;
        s += fmt::format("<line x1=\"{0}\" y1=\"0\" x2=\"{0}\" y2=\"{1}\" stroke=\"#d62728\" stroke-width=\"1.5\"/>",
                         num(x), num(h));
    }
    return s + "</svg>";
}

std::string share_bar(const CategoryBytes & bytes, const Category * order, size_t count, double width) {
    const uint64_t total = bytes.total();
    const double h = 28;
    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"share\" viewBox=\"0 0 {0} {1}\" "
                                "width=\"{0}\" height=\"{1}\" role=\"img\">",
                                num(width), num(h));
    if (total == 0) return s + "</svg>";
    double x = 0;
    for (size_t k = 0; k < count; ++k) {
        const Category c = order[k];
        if (bytes[c] == 0) continue;
        const double w = double(bytes[c]) / double(total) * width;
        const double share = 100.0 * double(bytes[c]) / double(total);
        const std::string label = fmt::format("{} {:.0f}%", category_name(c), share);
        s += fmt::format("<rect x=\"{}\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\">"
                         "<title>{}: {} ({:.1f}%)</title></rect>",
                         num(x), num(w), num(h), category_color(c), category_name(c), escape(format_bytes(bytes[c])),
                         share);
        if (w >= 6.8 * double(label.size()) + 8) {
            s += fmt::format("<text x=\"{}\" y=\"18\" class=\"share-label\" text-anchor=\"middle\">{}</text>",
                             num(x + w / 2), escape(label));
        }
        x += w;
    }
    return s + "</svg>";
}

}  // namespace memfit::svg
