#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/units.h"

namespace memfit::svg {

namespace {

// Length of the UTF-8 sequence at s[i] if it encodes an XML 1.0 character, else 0.
size_t xml_char_len(std::string_view s, size_t i) {
    const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = u(i);
    if (c < 0x80) return (c >= 0x20 || c == '\t' || c == '\n' || c == '\r') ? 1 : 0;
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return 0;
    uint32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
        if ((u(i + k) & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (u(i + k) & 0x3F);
    }
    const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF) return 0;
    return len;
}

int decimals_for(double step) {
    if (!(step > 0) || step >= 1) return 0;
    return std::clamp(int(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
}

// Short phase names for bands too narrow for the full one.
std::string_view phase_short(Phase p) {
    switch (p) {
        case Phase::forward: return "fwd";
        case Phase::backward: return "bwd";
        case Phase::recompute: return "rec";
        case Phase::communication: return "comm";
        case Phase::optimizer: return "opt";
        case Phase::other: return "";
    }
    return "";
}

constexpr double kCharPx = 7.0;  // average width of a 12px character, for fitting labels

}  // namespace

std::string escape(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 16);
    for (size_t i = 0; i < text.size();) {
        const size_t len = xml_char_len(text, i);
        if (len == 0) {
            out += "\xEF\xBF\xBD";  // U+FFFD
            ++i;
            continue;
        }
        switch (len == 1 ? text[i] : '\0') {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&#39;"; break;
            default: out.append(text.substr(i, len));
        }
        i += len;
    }
    return out;
}

std::string num(double v) {
    if (!std::isfinite(v)) return "0";
    std::string s = fmt::format("{:.1f}", v);
    if (s.ends_with(".0")) s.resize(s.size() - 2);
    return s == "-0" ? "0" : s;
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
        "#bab0ac",  // offloaded: grey
        "#ff9da7",  // teacher: pink
        "#d37295",  // reference: dark pink
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
    const size_t space = s.find(' '), dot = s.find('.');
    if (dot == std::string::npos || space == std::string::npos || dot > space) return s;
    size_t end = space;
    while (end > dot + 1 && s[end - 1] == '0') --end;
    if (end == dot + 1) end = dot;
    return s.erase(end, space - end);
}

std::vector<uint64_t> byte_ticks(uint64_t max, int max_ticks) {
    if (max == 0) return {0, 1};
    uint64_t step = 1;
    while ((max + step - 1) / step > uint64_t(std::max(max_ticks, 1)) && step < (uint64_t(1) << 62)) step *= 2;
    std::vector<uint64_t> ticks = {0};
    while (ticks.back() < max) ticks.push_back(ticks.back() + step);
    return ticks;
}

double nice_step(double span, int target) {
    if (!(span > 0) || !std::isfinite(span)) return 1;
    const double raw = span / std::max(target, 1);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0})
        if (m * mag >= raw * (1 - 1e-9)) return m * mag;
    return 10 * mag;
}

int nice_int_step(int n, int target) {
    return n <= 1 ? 1 : std::max(1, int(std::lround(nice_step(double(n), target))));
}

std::string op_label(const TimelineEvent & e) {
    std::string s = e.name ? e.name : "";
    if (e.layer >= 0) s += fmt::format(", layer {}", e.layer);
    return s + ", " + phase_name(e.phase);
}

std::string area_chart(const std::vector<TimelineEvent> & ev, int peak, uint64_t budget, std::string_view program,
                       std::string_view mark) {
    const size_t n = ev.size();
    const double W = 1060, H = 470, left = 78, right = 18, top = 60, bottom = 48;
    const double pw = W - left - right, ph = H - top - bottom, slot = pw / double(n);
    const TimelineEvent & pe = ev[size_t(peak)];
    const uint64_t peak_total = pe.live.total();

    uint64_t ymax = 0;
    for (const auto & e : ev) ymax = std::max(ymax, e.live.total());
    const bool show_budget = budget > 0 && double(budget) <= 1.3 * double(ymax);
    if (show_budget) ymax = std::max(ymax, budget);
    const std::vector<uint64_t> ticks = byte_ticks(ymax + ymax / 25, 6);  // headroom for the peak dot
    const double axis_top = double(ticks.back());
    auto X = [&](size_t i) { return left + double(i) * slot; };
    auto Y = [&](double b) { return top + ph - b / axis_top * ph; };
    const double px = X(size_t(peak)) + slot / 2;

    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" "
        "height=\"{1}\" role=\"img\" data-peak-total=\"{2}\" data-peak-op=\"{3}\" data-num-ops=\"{4}\">\n"
        "<title>live bytes per category over one step; peak {5} at op {3}</title>\n",
        num(W), num(H), peak_total, pe.op, n, escape(format_bytes(peak_total)));

    // Phases: background bands in the plot and a labelled strip above it.
    s += "<g class=\"phases\">\n";
    for (size_t a = 0, b = 0; a < n; a = b + 1) {
        for (b = a; b + 1 < n && ev[b + 1].phase == ev[a].phase;) ++b;
        const double x = X(a), w = X(b + 1) - X(a);
        const std::string_view fill = phase_fill(ev[a].phase), name = phase_name(ev[a].phase);
        s += fmt::format("<rect class=\"band\" data-phase=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>"
                         "<rect x=\"{}\" y=\"34\" width=\"{}\" height=\"20\" fill=\"{}\" stroke=\"#ffffff\"/>",
                         name, num(x), num(top), num(w), num(ph), fill, num(x), num(w), fill);
        const std::string_view label = w >= kCharPx * double(name.size()) + 8 ? name : phase_short(ev[a].phase);
        if (!label.empty() && w >= kCharPx * double(label.size()) + 4)
            s += fmt::format("<text x=\"{}\" y=\"48\" class=\"phase-label\" text-anchor=\"middle\">{}</text>",
                             num(x + w / 2), label);
        s += "\n";
    }
    s += "</g>\n";

    // Axes: binary-unit Y ticks, an X tick every ~n/10 ops.
    for (uint64_t t : ticks)
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"grid\"/><text x=\"{3}\" y=\"{4}\" "
                         "class=\"tick\" text-anchor=\"end\">{5}</text>\n",
                         num(left), num(Y(double(t))), num(left + pw), num(left - 6), num(Y(double(t)) + 4),
                         escape(short_bytes(t)));
    for (size_t i = 0; i < n; i += size_t(nice_int_step(int(n), 10)))
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#666666\"/><text x=\"{0}\" "
                         "y=\"{3}\" class=\"tick\" text-anchor=\"middle\">{4}</text>\n",
                         num(X(i) + slot / 2), num(top + ph), num(top + ph + 5), num(top + ph + 18), ev[i].op);
    s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis-title\" text-anchor=\"middle\">op index (one {} step, {} "
                     "ops)</text>\n<text x=\"14\" y=\"{}\" class=\"axis-title\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 14 {})\">live bytes</text>\n",
                     num(left + pw / 2), num(H - 8), escape(program.empty() ? "training" : program), n,
                     num(top + ph / 2), num(top + ph / 2));

    // One stacked layer per category with bytes; each op's value spans [X(i), X(i+1)).
    std::vector<uint64_t> lo(n, 0), hi(n, 0);
    std::string labels;
    for (Category c : kStackOrder) {
        if (std::none_of(ev.begin(), ev.end(), [&](const TimelineEvent & e) { return e.live[c] != 0; })) continue;
        std::string values, d;
        auto to = [&d](char cmd, double at) { d += cmd; d += num(at); };
        for (size_t i = 0; i < n; ++i) {
            hi[i] = lo[i] + ev[i].live[c];
            if (i) values += ',';
            values += std::to_string(ev[i].live[c]);
        }
        to('M', X(0)), d += ',', d += num(Y(double(hi[0])));
        for (size_t i = 1; i < n; ++i)
            if (hi[i] != hi[i - 1]) to('H', X(i)), to('V', Y(double(hi[i])));
        to('H', X(n)), to('V', Y(double(lo[n - 1])));
        for (size_t i = n - 1; i >= 1; --i)
            if (lo[i - 1] != lo[i]) to('H', X(i)), to('V', Y(double(lo[i - 1])));
        to('H', X(0)), d += 'Z';
        s += fmt::format("<g class=\"series\" data-category=\"{0}\" data-values=\"{1}\"><title>{0}: {2} at the peak"
                         "</title><path data-category=\"{0}\" d=\"{3}\" fill=\"{4}\" stroke=\"#ffffff\" "
                         "stroke-width=\"0.6\"/></g>\n",
                         category_name(c), values, escape(format_bytes(pe.live[c])), d, category_color(c));

        // Name the layer where it stays thickest under the whole label, away from the peak line,
        // preferring the middle of the wider side of the peak.
        const double label_px = kCharPx * double(category_name(c).size()) + 10;
        const size_t half = size_t(std::ceil(label_px / 2 / slot));
        const double prefer = px - left > pw / 2 ? (left + px) / 2 : (px + left + pw) / 2;
        uint64_t best = 0;
        double best_dist = 1e9, best_x = 0;
        for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 500)) {
            const double x = std::clamp(X(i) + slot / 2, left + label_px / 2, left + pw - label_px / 2);
            if (std::abs(x - px) < label_px / 2 + 6) continue;
            uint64_t m = UINT64_MAX;
            for (size_t k = i >= half ? i - half : 0; k <= std::min(n - 1, i + half); ++k) m = std::min(m, ev[k].live[c]);
            if (m > best || (m == best && std::abs(x - prefer) < best_dist))
                best = m, best_dist = std::abs(x - prefer), best_x = x;
        }
        if (double(best) / axis_top * ph >= 15) {
            const size_t i = std::min(n - 1, size_t(std::max(0.0, (best_x - left) / slot)));
            labels += fmt::format("<text x=\"{}\" y=\"{}\" class=\"layer-label\" text-anchor=\"middle\">{}</text>\n",
                                  num(best_x), num(Y(double(lo[i]) + double(ev[i].live[c]) / 2) + 4), category_name(c));
        }
        lo = hi;
    }
    s += labels;

    if (show_budget)
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"budget\"/><text x=\"{3}\" y=\"{4}\" "
                         "class=\"budget-label\" text-anchor=\"end\">budget {5}</text>\n",
                         num(left), num(Y(double(budget))), num(left + pw), num(left + pw - 4),
                         num(Y(double(budget)) - 5), escape(format_bytes(budget)));

    // Hover targets: one transparent column per op whose tooltip lists its bytes.
    if (n <= 5000) {
        s += "<g class=\"hover\" fill=\"#000000\" fill-opacity=\"0\">";
        for (size_t i = 0; i < n; ++i) {
            s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"><title>op {} ({}): {}", num(X(i)),
                             num(top), num(std::max(slot, 0.1)), num(ph), ev[i].op, escape(op_label(ev[i])),
                             escape(format_bytes(ev[i].live.total())));
            for (auto it = kStackOrder.rbegin(); it != kStackOrder.rend(); ++it)
                if (ev[i].live[*it]) s += fmt::format("&#10;{}: {}", category_name(*it), escape(format_bytes(ev[i].live[*it])));
            s += "</title></rect>";
        }
        s += "</g>\n";
    }

    // The peak: a dashed line through the strip, a dot on top of the stack, and its label.
    const bool flip = px > left + pw * 0.62;
    s += fmt::format("<g class=\"peak\"><line x1=\"{0}\" y1=\"22\" x2=\"{0}\" y2=\"{1}\" class=\"peak-line\"/>"
                     "<circle cx=\"{0}\" cy=\"{2}\" r=\"5\" class=\"peak-dot\"/><text x=\"{3}\" y=\"18\" "
                     "class=\"peak-label\" text-anchor=\"{4}\">{8} {5} at op {6} ({7})</text></g>\n",
                     num(px), num(top + ph), num(Y(double(peak_total))), num(flip ? px - 6 : px + 6),
                     flip ? "end" : "start", escape(format_bytes(peak_total)), pe.op, escape(op_label(pe)), escape(mark));
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999999\"/>\n",
                     num(left), num(top), num(pw), num(ph));
    return s + "</svg>\n";
}

std::string line_chart(const std::vector<LineSeries> & series, std::string_view y_label, bool y_from_zero) {
    const double W = 540, H = 260, left = 64, right = 16, top = 30, bottom = 44;
    const double pw = W - left - right, ph = H - top - bottom;
    double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
    for (const auto & ser : series)
        for (const auto & p : ser.points) {
            if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
            xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x), ylo = std::min(ylo, p.y), yhi = std::max(yhi, p.y);
        }
    if (!std::isfinite(xlo)) xlo = 0, xhi = 1, ylo = 0, yhi = 1;
    if (xhi == xlo) xlo -= 1, xhi += 1;
    if (y_from_zero) ylo = std::min(0.0, ylo);
    if (yhi == ylo) ylo -= 1, yhi += 1;
    const double ystep = nice_step(yhi - ylo, 5), xstep = std::max(nice_step(xhi - xlo, 6), 1.0);
    ylo = std::floor(ylo / ystep) * ystep, yhi = std::ceil(yhi / ystep) * ystep;
    auto X = [&](double x) { return left + (x - xlo) / (xhi - xlo) * pw; };
    auto Y = [&](double y) { return top + ph - (y - ylo) / (yhi - ylo) * ph; };
    auto label = [](double v, double step) {
        if (std::abs(v) < step * 1e-6) return std::string("0");
        if (step >= 1000) return fmt::format("{:.{}f}k", v / 1000, decimals_for(step / 1000));
        return fmt::format("{:.{}f}", v, decimals_for(step));
    };

    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"linechart\" viewBox=\"0 0 {0} {1}\" "
                                "width=\"{0}\" height=\"{1}\" role=\"img\">\n<rect x=\"{2}\" y=\"{3}\" width=\"{4}\" "
                                "height=\"{5}\" fill=\"#ffffff\" stroke=\"#cccccc\"/>\n",
                                num(W), num(H), num(left), num(top), num(pw), num(ph));
    for (double v = ylo; v <= yhi + ystep * 1e-6; v += ystep)
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"grid\"/><text x=\"{3}\" y=\"{4}\" "
                         "class=\"tick\" text-anchor=\"end\">{5}</text>\n",
                         num(left), num(Y(v)), num(left + pw), num(left - 6), num(Y(v) + 4), label(v, ystep));
    for (double v = std::ceil(xlo / xstep) * xstep; v <= xhi + xstep * 1e-6; v += xstep)
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#888888\"/><text x=\"{0}\" "
                         "y=\"{3}\" class=\"tick\" text-anchor=\"middle\">{4}</text>\n",
                         num(X(v)), num(top + ph), num(top + ph + 4), num(top + ph + 17), label(v, xstep));
    s += fmt::format("<text x=\"{0}\" y=\"{1}\" class=\"axis-title\" text-anchor=\"middle\">step</text>\n<text x=\"12\" "
                     "y=\"{2}\" class=\"axis-title\" text-anchor=\"middle\" transform=\"rotate(-90 12 {2})\">{3}</text>\n",
                     num(left + pw / 2), num(H - 6), num(top + ph / 2), escape(y_label));
    double lx = left;
    for (const auto & ser : series) {
        std::string pts, marks;
        size_t n = 0;
        for (const auto & p : ser.points) {
            if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
            if (n++) pts += ' ';
            pts += num(X(p.x)), pts += ',', pts += num(Y(p.y));
            marks += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.5\"/>", num(X(p.x)), num(Y(p.y)));
        }
        const std::string color = escape(ser.color);
        s += fmt::format("<g class=\"line\" data-series=\"{}\" fill=\"{}\">", escape(ser.label), color);
        if (n >= 2) s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>", pts, color);
        s += (ser.markers || n < 2 ? marks : "") + "</g>\n";
        s += fmt::format("<line x1=\"{}\" y1=\"14\" x2=\"{}\" y2=\"14\" stroke=\"{}\" stroke-width=\"3\"/><text x=\"{}\" "
                         "y=\"18\" class=\"legend-text\">{}</text>\n",
                         num(lx), num(lx + 18), color, num(lx + 24), escape(ser.label));
        lx += 40 + kCharPx * double(ser.label.size());
    }
    return s + "</svg>\n";
}

std::string lifetime_strip(int first_op, int last_op, int num_ops, int mark_op, std::string_view color) {
    const double W = 240, H = 14;
    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"strip\" viewBox=\"0 0 {0} {1}\" "
                                "width=\"{0}\" height=\"{1}\" data-first-op=\"{2}\" data-last-op=\"{3}\"><rect x=\"0\" "
                                "y=\"3\" width=\"{0}\" height=\"8\" fill=\"#eceef1\"/>",
                                num(W), num(H), first_op, last_op);
    if (num_ops > 0 && first_op >= 0 && last_op >= first_op) {
        const double x0 = double(std::min(first_op, num_ops - 1)) / num_ops * W;
        const double x1 = double(std::min(last_op, num_ops - 1) + 1) / num_ops * W;
        s += fmt::format("<rect x=\"{}\" y=\"2\" width=\"{}\" height=\"10\" fill=\"{}\"/>", num(x0),
                         num(std::max(x1 - x0, 1.5)), escape(color));
    }
    if (num_ops > 0 && mark_op >= 0 && mark_op < num_ops)
        s += fmt::format("<line x1=\"{0}\" y1=\"0\" x2=\"{0}\" y2=\"{1}\" stroke=\"#c62828\" stroke-width=\"1.5\"/>",
                         num((double(mark_op) + 0.5) / num_ops * W), num(H));
    return s + "</svg>";
}

}  // namespace memfit::svg
