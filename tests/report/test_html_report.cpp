// report.html: a strict XML well-formedness check of the page, the chart's embedded numbers
// against the input byte for byte, escaping, no scripts or network references, the atomic write,
// and (when Chromium is installed) a headless render that must not be blank.
#include "report/html_report.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "report/svg.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// A strict XML 1.0 well-formedness checker (no DTD, no CDATA, no processing instructions):
// valid UTF-8 and XML characters, one root element, tags that balance and nest, attributes
// quoted, unique and free of '<', only the five predefined entities and character references.

class XmlChecker {
public:
    // Empty string when `doc` is well-formed, else what is wrong and where.
    static std::string check(std::string_view doc) {
        XmlChecker c(doc);
        return c.run();
    }

private:
    explicit XmlChecker(std::string_view d) : s_(d) {}

    std::string run() {
        if (std::string e = check_chars(); !e.empty()) return e;
        std::vector<std::string> stack;
        bool root_done = false;
        while (i_ < s_.size()) {
            if (s_[i_] != '<') {
                const size_t end = std::min(s_.find('<', i_), s_.size());
                const std::string_view text = s_.substr(i_, end - i_);
                if (stack.empty() && text.find_first_not_of(" \t\r\n") != std::string_view::npos)
                    return fail("text outside the root element");
                if (text.find("]]>") != std::string_view::npos) return fail("']]>' in text");
                if (std::string e = check_entities(text); !e.empty()) return e;
                i_ = end;
                continue;
            }
            if (s_.substr(i_, 4) == "<!--") {
                const size_t end = s_.find("-->", i_ + 4);
                if (end == std::string_view::npos) return fail("unterminated comment");
                if (s_.substr(i_ + 4, end - i_ - 4).find("--") != std::string_view::npos) return fail("'--' in comment");
                i_ = end + 3;
                continue;
            }
            if (s_.substr(i_, 2) == "<!" || s_.substr(i_, 2) == "<?") return fail("declaration or PI in the body");
            if (s_.substr(i_, 2) == "</") {
                i_ += 2;
                const std::string name = read_name();
                if (name.empty()) return fail("bad end tag name");
                skip_ws();
                if (i_ >= s_.size() || s_[i_] != '>') return fail("end tag </" + name + " not closed by '>'");
                ++i_;
                if (stack.empty() || stack.back() != name)
                    return fail("</" + name + "> does not match <" + (stack.empty() ? "" : stack.back()) + ">");
                stack.pop_back();
                if (stack.empty()) root_done = true;
                continue;
            }
            ++i_;
            const std::string name = read_name();
            if (name.empty()) return fail("bad start tag name");
            if (stack.empty() && root_done) return fail("a second root element <" + name + ">");
            std::set<std::string> attrs;
            bool self_closing = false;
            while (true) {
                const size_t before = i_;
                skip_ws();
                if (i_ >= s_.size()) return fail("unterminated tag <" + name);
                if (s_[i_] == '>') { ++i_; break; }
                if (s_.substr(i_, 2) == "/>") { i_ += 2; self_closing = true; break; }
                if (i_ == before) return fail("no space before attribute in <" + name);
                const std::string attr = read_name();
                if (attr.empty()) return fail("bad attribute name in <" + name);
                if (!attrs.insert(attr).second) return fail("duplicate attribute " + attr + " in <" + name);
                skip_ws();
                if (i_ >= s_.size() || s_[i_] != '=') return fail("attribute " + attr + " without '='");
                ++i_;
                skip_ws();
                if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) return fail("unquoted attribute " + attr);
                const char q = s_[i_++];
                const size_t end = s_.find(q, i_);
                if (end == std::string_view::npos) return fail("unterminated attribute " + attr);
                const std::string_view value = s_.substr(i_, end - i_);
                if (value.find('<') != std::string_view::npos) return fail("'<' in attribute " + attr);
                if (std::string e = check_entities(value); !e.empty()) return e;
                i_ = end + 1;
            }
            if (!self_closing) stack.push_back(name);
            else if (stack.empty()) root_done = true;
        }
        if (!stack.empty()) return fail("<" + stack.back() + "> is never closed");
        if (!root_done) return fail("no root element");
        return "";
    }

    static bool name_start(unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || c >= 0x80;
    }
    static bool name_char(unsigned char c) {
        return name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.';
    }
    std::string read_name() {
        const size_t start = i_;
        if (i_ < s_.size() && name_start(static_cast<unsigned char>(s_[i_]))) {
            ++i_;
            while (i_ < s_.size() && name_char(static_cast<unsigned char>(s_[i_]))) ++i_;
        }
        return std::string(s_.substr(start, i_ - start));
    }
    void skip_ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
    }
    std::string fail(const std::string & what) const {
        const size_t from = i_ > 40 ? i_ - 40 : 0;
        return what + " at byte " + std::to_string(i_) + " near: " + std::string(s_.substr(from, 80));
    }

    std::string check_entities(std::string_view text) const {
        for (size_t k = text.find('&'); k != std::string_view::npos; k = text.find('&', k + 1)) {
            const size_t semi = text.find(';', k);
            if (semi == std::string_view::npos) return fail("'&' without ';'");
            const std::string_view ent = text.substr(k + 1, semi - k - 1);
            if (ent == "amp" || ent == "lt" || ent == "gt" || ent == "quot" || ent == "apos") continue;
            if (ent.size() >= 2 && ent[0] == '#') {
                const bool hex = ent[1] == 'x';
                const std::string_view digits = ent.substr(hex ? 2 : 1);
                if (digits.empty() || digits.size() > 6) return fail("bad character reference &" + std::string(ent) + ";");
                for (char c : digits)
                    if (!(std::isdigit(static_cast<unsigned char>(c)) || (hex && std::isxdigit(static_cast<unsigned char>(c)))))
                        return fail("bad character reference &" + std::string(ent) + ";");
                const unsigned long cp = std::stoul(std::string(digits), nullptr, hex ? 16 : 10);
                const bool ok = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
                                (cp >= 0xE000 && cp <= 0xFFFD) || (cp >= 0x10000 && cp <= 0x10FFFF);
                if (!ok) return fail("character reference to a non-XML character");
                continue;
            }
            return fail("unknown entity &" + std::string(ent) + ";");
        }
        return "";
    }

    // Valid UTF-8 and only XML 1.0 characters.
    std::string check_chars() const {
        for (size_t k = 0; k < s_.size();) {
            const unsigned char c = static_cast<unsigned char>(s_[k]);
            if (c < 0x80) {
                if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return "control character at byte " + std::to_string(k);
                ++k;
                continue;
            }
            const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            if (len == 0 || k + len > s_.size()) return "invalid UTF-8 at byte " + std::to_string(k);
            uint32_t cp = c & (0x7F >> len);
            for (size_t j = 1; j < len; ++j) {
                const unsigned char cc = static_cast<unsigned char>(s_[k + j]);
                if ((cc & 0xC0) != 0x80) return "invalid UTF-8 at byte " + std::to_string(k);
                cp = (cp << 6) | (cc & 0x3F);
            }
            const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
            if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF)
                return "invalid UTF-8 at byte " + std::to_string(k);
            k += len;
        }
        return "";
    }

    std::string_view s_;
    size_t i_ = 0;
};

// The page without its first line, which must be the doctype.
std::string_view body_of(std::string_view page) {
    constexpr std::string_view doctype = "<!DOCTYPE html>\n";
    if (!page.starts_with(doctype)) return "<missing-doctype/>";
    return page.substr(doctype.size());
}

TEST(XmlChecker, RejectsMalformedDocuments) {
    EXPECT_EQ(XmlChecker::check("<a x=\"1\"><b/>t &amp; &#60; &#x3C;</a>"), "");
    EXPECT_NE(XmlChecker::check("<a><b></a></b>"), "");            // bad nesting
    EXPECT_NE(XmlChecker::check("<a><b></a>"), "");                // unclosed
    EXPECT_NE(XmlChecker::check("<a x=1></a>"), "");               // unquoted
    EXPECT_NE(XmlChecker::check("<a x=\"1\" x=\"2\"></a>"), "");   // duplicate attribute
    EXPECT_NE(XmlChecker::check("<a>&nbsp;</a>"), "");             // HTML-only entity
    EXPECT_NE(XmlChecker::check("<a>a & b</a>"), "");              // bare ampersand
    EXPECT_NE(XmlChecker::check("<a x=\"<\"></a>"), "");           // '<' in attribute
    EXPECT_NE(XmlChecker::check("<a></a><b></b>"), "");            // two roots
    EXPECT_NE(XmlChecker::check("<br>"), "");                      // HTML void tag
    EXPECT_NE(XmlChecker::check("<a>\xff</a>"), "");               // invalid UTF-8
    EXPECT_NE(XmlChecker::check("<a>\x01</a>"), "");               // control character
}

// ---------------------------------------------------------------------------------------------
// Synthetic input: 40 ops in three phases, three categories with known bytes per op (odd byte
// counts so that rounding would show), the peak at op 23.

constexpr int kOps = 40, kPeakOp = 23;
constexpr std::string_view kOddName = "h.3.attn.<&>\"odd'";

uint64_t params_at(int) { return 300 * MiB + 7; }
uint64_t grads_at(int i) { return i < 18 ? 0 : 300 * MiB + 7; }
uint64_t acts_at(int i) {
    if (i < 18) return uint64_t(i + 1) * 40 * MiB + uint64_t(i) * 13;         // forward: saved activations grow
    if (i == kPeakOp) return 900 * MiB + 11;                                    // the logits gradient: the peak
    if (i < 36) return uint64_t(36 - i) * 40 * MiB + uint64_t(i) * 3;           // backward frees them
    return 0;                                                                   // optimizer
}

ReportData synthetic_report() {
    ReportData r;
    r.title = "memfit profile: test <model> & \"friends\"";
    r.config = {{"model", "gpt2-6l"}, {"batch", 8}, {"seq", 256}, {"dtype", "fp32"}, {"note", "a<b & c>d"}};
    r.timeline.program = "train";
    static const char * names[] = {"layernorm_fwd", "matmul_fwd", "attention_fwd", "gelu_fwd"};
    for (int i = 0; i < kOps; ++i) {
        TimelineEvent e;
        e.op = i;
        e.name = i == kPeakOp ? "crossentropy_bwd" : names[i % 4];
        e.phase = i < 18 ? Phase::forward : i < 36 ? Phase::backward : Phase::optimizer;
        e.layer = i < 36 ? (i % 18) / 3 : -1;
        e.live[Category::parameters] = params_at(i);
        e.live[Category::gradients] = grads_at(i);
        e.live[Category::activations] = acts_at(i);
        e.begin_us = 10.0 * i;
        e.end_us = 10.0 * i + 8;
        r.timeline.events.push_back(e);
    }
    r.num_ops = kOps;
    r.peak_op = kPeakOp;
    for (const auto & e : r.timeline.events)
        for (size_t c = 0; c < kCategoryCount; ++c) r.planned_peak.v[c] = std::max(r.planned_peak.v[c], e.live.v[c]);
    r.measured_peak = r.planned_peak;
    r.measured_peak[Category::activations] += 4096;  // a difference the page must mark
    r.planned_reserved = r.planned_peak;
    r.planned_reserved[Category::activations] += 64 * MiB;
    r.measured_reserved = r.planned_reserved;
    r.budget = 3 * GiB;
    r.peak_rss = 2 * GiB + 123 * MiB;
    for (int k = 0; k < 12; ++k) {
        ReportBuffer b;
        b.name = k == 1 ? std::string(kOddName) : "h." + std::to_string(k) + ".saved";
        b.category = k == 0 ? Category::parameters : k == 2 ? Category::gradients : Category::activations;
        b.bytes = uint64_t(400 - 20 * k) * MiB;
        b.first_op = k == 0 ? 0 : k;
        b.last_op = k == 0 ? kOps - 1 : kOps - 5 - k;
        b.persistent = k == 0;
        r.live_at_peak.push_back(b);
    }
    r.largest.assign(r.live_at_peak.begin(), r.live_at_peak.begin() + 10);
    r.hints = {"activations are 60% of the peak; try --batch 4 <half> & \"see\" what's left.",
               "AdamW moments take 600 MiB."};
    for (int s = 0; s < 5; ++s) {
        r.loss.push_back({s * 10, 10.0 - 1.5 * s});
        r.tokens_per_s.push_back({s * 10, 12000.0 + 100 * s});
    }
    r.val_loss = {{0, 10.1}, {40, 4.4}};
    return r;
}

std::map<std::string, std::vector<uint64_t>> series_values(const std::string & page) {
    std::map<std::string, std::vector<uint64_t>> out;
    static const std::regex re(R"re(<g class="series" data-category="([a-z_]+)" data-values="([0-9,]*)")re");
    for (std::sregex_iterator it(page.begin(), page.end(), re), end; it != end; ++it) {
        std::vector<uint64_t> values;
        std::stringstream ss((*it)[2].str());
        for (std::string item; std::getline(ss, item, ',');) values.push_back(std::stoull(item));
        EXPECT_TRUE(out.emplace((*it)[1].str(), values).second) << "two series for " << (*it)[1];
    }
    return out;
}

std::string attr(const std::string & tag, const std::string & name) {
    const std::regex re(" " + name + "=\"([^\"]*)\"");
    std::smatch m;
    return std::regex_search(tag, m, re) ? m[1].str() : std::string("<missing>");
}

size_t count(const std::string & s, std::string_view needle) {
    size_t n = 0;
    for (size_t k = s.find(needle); k != std::string::npos; k = s.find(needle, k + 1)) ++n;
    return n;
}

TEST(HtmlReport, IsWellFormedAndSelfContained) {
    const std::string page = render_html_report(synthetic_report());
    ASSERT_TRUE(page.starts_with("<!DOCTYPE html>\n"));
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    std::string lower = page;
    for (char & c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(lower.find("<script"), std::string::npos);
    EXPECT_EQ(lower.find("https://"), std::string::npos);
    EXPECT_EQ(lower.find("url("), std::string::npos);
    EXPECT_EQ(lower.find("@import"), std::string::npos);
    EXPECT_EQ(lower.find(" href="), std::string::npos);
    EXPECT_EQ(lower.find(" src="), std::string::npos);
    for (size_t k = lower.find("http://"); k != std::string::npos; k = lower.find("http://", k + 1))
        EXPECT_EQ(lower.substr(k, 27), "http://www.w3.org/2000/svg\"") << "at byte " << k;
    EXPECT_NE(page.find("<meta charset=\"utf-8\"/>"), std::string::npos);
}

TEST(HtmlReport, ChartCarriesTheInputNumbersExactly) {
    const ReportData r = synthetic_report();
    const std::string page = render_html_report(r);

    const auto series = series_values(page);
    std::set<std::string> expected = {"parameters", "gradients", "activations"};
    std::set<std::string> got;
    for (const auto & [name, values] : series) got.insert(name);
    EXPECT_EQ(got, expected);
    for (const auto & [name, values] : series) {
        Category c = Category::runtime;
        for (size_t k = 0; k < kCategoryCount; ++k)
            if (kCategoryNames[k] == name) c = Category(k);
        ASSERT_EQ(values.size(), size_t(kOps)) << name;
        for (int i = 0; i < kOps; ++i) EXPECT_EQ(values[size_t(i)], r.timeline.events[size_t(i)].live[c]) << name << " op " << i;
    }
    // One filled area per series, nothing for the categories without bytes.
    for (const auto & name : expected) EXPECT_EQ(count(page, "<path data-category=\"" + name + "\""), 1u) << name;
    EXPECT_EQ(count(page, "<path data-category=\"workspace\""), 0u);

    std::smatch m;
    ASSERT_TRUE(std::regex_search(page, m, std::regex("<svg[^>]* class=\"chart\"[^>]*>")));
    const std::string chart = m[0].str();
    EXPECT_EQ(attr(chart, "data-peak-total"), std::to_string(r.timeline.events[kPeakOp].live.total()));
    EXPECT_EQ(attr(chart, "data-peak-op"), std::to_string(kPeakOp));
    EXPECT_NE(page.find("peak " + format_bytes(r.timeline.events[kPeakOp].live.total()) + " at op 23 (crossentropy_bwd"),
              std::string::npos);

    // The legend names every category with bytes.
    const size_t legend = page.find("<table class=\"legend\">");
    ASSERT_NE(legend, std::string::npos);
    const std::string legend_html = page.substr(legend, page.find("</table>", legend) - legend);
    for (const auto & name : expected) EXPECT_NE(legend_html.find(">" + name + "<"), std::string::npos) << name;
    EXPECT_EQ(legend_html.find("workspace"), std::string::npos);

    // Phases as bands: forward, backward, optimizer, in that order.
    const std::regex band_re("<rect class=\"band\" data-phase=\"([a-z]+)\"");
    std::vector<std::string> bands;
    for (std::sregex_iterator it(page.begin(), page.end(), band_re), end; it != end; ++it) bands.push_back((*it)[1]);
    EXPECT_EQ(bands, (std::vector<std::string>{"forward", "backward", "optimizer"}));

    // Dominant category and its share of the peak, in the headline.
    const uint64_t total = r.timeline.events[kPeakOp].live.total();
    const int share = int(std::lround(100.0 * double(acts_at(kPeakOp)) / double(total)));
    EXPECT_NE(page.find("activations: " + std::to_string(share) + "% of the peak"), std::string::npos);

    // Planned vs measured rows carry the four numbers; the activation difference is marked.
    ASSERT_TRUE(std::regex_search(page, m, std::regex("<g class=\"pvm-row\" data-category=\"activations\"[^>]*>")));
    EXPECT_EQ(attr(m[0].str(), "data-planned-peak"), std::to_string(r.planned_peak[Category::activations]));
    EXPECT_EQ(attr(m[0].str(), "data-measured-peak"), std::to_string(r.measured_peak[Category::activations]));
    EXPECT_EQ(attr(m[0].str(), "data-planned-reserved"), std::to_string(r.planned_reserved[Category::activations]));
    EXPECT_NE(page.find("\u2260 +4.00 KiB"), std::string::npos);

    // Ten lifetime strips, the persistent one spanning every op.
    EXPECT_EQ(count(page, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"strip\""), 10u);
    EXPECT_NE(page.find("data-first-op=\"0\" data-last-op=\"39\""), std::string::npos);

    // Loss and throughput charts.
    EXPECT_EQ(count(page, "class=\"linechart\""), 2u);
}

TEST(HtmlReport, EscapesEveryText) {
    const ReportData r = synthetic_report();
    const std::string page = render_html_report(r);
    EXPECT_NE(page.find("h.3.attn.&lt;&amp;&gt;&quot;odd&#39;"), std::string::npos);
    EXPECT_EQ(page.find("<&>"), std::string::npos);
    for (const auto & h : r.hints) EXPECT_NE(page.find(svg::escape(h)), std::string::npos) << h;
    EXPECT_NE(page.find("try --batch 4 &lt;half&gt; &amp; &quot;see&quot; what&#39;s left."), std::string::npos);
    // fmt, not "x" + std::string: GCC 12 warns (-Wrestrict, a false positive) on operator+ of a
    // literal and a temporary under -O3 -march=znver4.
    for (const auto & b : r.largest)
        EXPECT_NE(page.find(fmt::format(">{}<", svg::escape(b.name))), std::string::npos) << b.name;
    // 12 buffers live at the peak: the top 12 shown, none hidden.
    for (const auto & b : r.live_at_peak) EXPECT_NE(page.find(svg::escape(b.name)), std::string::npos);
    EXPECT_EQ(page.find("more</td>"), std::string::npos);
    EXPECT_NE(page.find("<title>memfit profile: test &lt;model&gt; &amp; &quot;friends&quot;</title>"), std::string::npos);
    EXPECT_NE(page.find("<td>a&lt;b &amp; c&gt;d</td>"), std::string::npos);
}

TEST(HtmlReport, EdgeCasesStayWellFormed) {
    ReportData r = synthetic_report();
    // More buffers at the peak than shown, invalid UTF-8 and a control character in names.
    for (int k = 0; k < 5; ++k) r.live_at_peak.push_back({"extra\xff\x01" + std::to_string(k), Category::workspace, 1024, 3, 30, false});
    r.config["bytes\xc3"] = "bad \xe2\x82 utf8";
    std::string page = render_html_report(r);
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    EXPECT_NE(page.find("+5 more"), std::string::npos);

    // peak_op unset: the largest total is found.
    r.peak_op = -1;
    page = render_html_report(r);
    EXPECT_NE(page.find("data-peak-op=\"23\""), std::string::npos);

    // No timeline, no curves, no config: still a valid page.
    ReportData empty;
    page = render_html_report(empty);
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    EXPECT_NE(page.find("No timeline was recorded"), std::string::npos);
    EXPECT_NE(page.find("no bytes recorded"), std::string::npos);
    EXPECT_EQ(page.find("class=\"linechart\""), std::string::npos);

    // A single op.
    ReportData one;
    one.timeline.events.push_back({0, "matmul_fwd", Phase::forward, 0, {}, 0, 1});
    one.timeline.events[0].live[Category::activations] = 5;
    one.loss = {{1, 2.5}};
    page = render_html_report(one);
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    EXPECT_NE(page.find("data-values=\"5\""), std::string::npos);
}

TEST(SvgHelpers, UnitsTicksAndEscaping) {
    EXPECT_EQ(svg::short_bytes(2 * GiB), "2 GiB");
    EXPECT_EQ(svg::short_bytes(3 * GiB / 2), "1.5 GiB");
    EXPECT_EQ(svg::short_bytes(768 * MiB), "768 MiB");
    EXPECT_EQ(svg::short_bytes(12), "12 B");
    for (uint64_t max : {uint64_t(1), uint64_t(1000), 3 * GiB + 5, 17 * MiB, 100 * GiB}) {
        const auto t = svg::byte_ticks(max, 6);
        ASSERT_GE(t.size(), 2u);
        EXPECT_LE(t.size(), 7u) << max;
        EXPECT_GE(t.back(), max);
        const uint64_t step = t[1];
        EXPECT_EQ(step & (step - 1), 0u) << "step " << step << " is not a power of two";
    }
    EXPECT_EQ(svg::byte_ticks(3 * GiB, 6), (std::vector<uint64_t>{0, GiB / 2, GiB, 3 * GiB / 2, 2 * GiB, 5 * GiB / 2, 3 * GiB}));
    EXPECT_EQ(svg::nice_int_step(40, 10), 5);
    EXPECT_EQ(svg::nice_int_step(1000, 10), 100);
    EXPECT_EQ(svg::escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
    EXPECT_EQ(svg::escape("\xce\xbc ok"), "\xce\xbc ok");
    EXPECT_EQ(svg::escape("x\xffy"), "x\xef\xbf\xbdy");
    EXPECT_EQ(svg::num(-0.01), "0");
    EXPECT_EQ(svg::num(12.25), "12.2");
}

TEST(HtmlReport, WritesAtomically) {
    const fs::path dir = fs::temp_directory_path() / ("memfit_html_test." + std::to_string(getpid()));
    fs::create_directories(dir);
    const std::string path = (dir / "report.html").string();
    const ReportData r = synthetic_report();
    write_html_report(path, r);
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, render_html_report(r));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    EXPECT_THROW(write_html_report((dir / "no-such-dir" / "report.html").string(), r), IoError);
    fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// A realistic step for the render: a 6-layer GPT-2 at batch 4 x seq 512 in fp32, its buffers
// with lifetimes from forward to their backward op, live bytes per op computed from them.

struct StepSim {
    ReportData r;
    std::vector<ReportBuffer> bufs;
    int op(const char * name, Phase phase, int layer) {
        TimelineEvent e;
        e.op = int(r.timeline.events.size());
        e.name = name, e.phase = phase, e.layer = layer;
        r.timeline.events.push_back(e);
        return e.op;
    }
    int buf(std::string name, Category c, uint64_t bytes, int first, bool persistent = false) {
        bufs.push_back({std::move(name), c, bytes, first, first, persistent});
        return int(bufs.size()) - 1;
    }
};

ReportData realistic_report() {
    StepSim s;
    const int L = 6;
    const uint64_t act = 4ull * 512 * 768 * 4, probs = 4ull * 12 * 512 * 512 * 4, logits = 4ull * 512 * 50257 * 4;
    const uint64_t params = 81'000'000ull * 4;
    s.buf("parameters", Category::parameters, params, 0, true);
    s.buf("gradients", Category::gradients, params, 0, true);
    s.buf("adamw.m", Category::optimizer_states, params, 0, true);
    s.buf("adamw.v", Category::optimizer_states, params, 0, true);
    s.op("zero_grad", Phase::other, -1);
    const int ws = s.buf("workspace", Category::workspace, 24 * MiB, s.op("embedding_fwd", Phase::forward, -1));
    int prev = s.buf("h.emb", Category::activations, act, 1);
    std::vector<std::vector<int>> saved(L);
    auto fwd = [&](int l, const char * name, const std::string & out, uint64_t bytes) {
        const int o = s.op(name, Phase::forward, l);
        s.bufs[size_t(prev)].last_op = std::max(s.bufs[size_t(prev)].last_op, o);
        prev = s.buf("h." + std::to_string(l) + "." + out, Category::activations, bytes, o);
        saved[size_t(l)].push_back(prev);
    };
    for (int l = 0; l < L; ++l) {
        fwd(l, "layernorm_fwd", "ln1", act);
        fwd(l, "matmul_fwd", "attn.qkv", 3 * act);
        fwd(l, "attention_fwd", "attn.probs", probs);
        fwd(l, "attention_fwd", "attn.out", act);
        fwd(l, "matmul_fwd", "attn.proj", act);
        fwd(l, "residual_fwd", "res1", act);
        fwd(l, "layernorm_fwd", "ln2", act);
        fwd(l, "matmul_fwd", "mlp.fc", 4 * act);
        fwd(l, "gelu_fwd", "mlp.gelu", 4 * act);
        fwd(l, "matmul_fwd", "mlp.proj", act);
        fwd(l, "residual_fwd", "res2", act);
    }
    fwd(L - 1, "layernorm_fwd", "lnf", act);
    const int lg = s.buf("logits", Category::activations, logits, s.op("matmul_fwd", Phase::forward, -1));
    s.bufs[size_t(prev)].last_op = s.bufs[size_t(lg)].first_op;
    const int ce = s.op("crossentropy_fwd", Phase::forward, -1);
    const int dl = s.buf("dlogits", Category::activations, logits, s.op("crossentropy_bwd", Phase::backward, -1));
    s.bufs[size_t(lg)].last_op = std::max(ce, s.bufs[size_t(dl)].first_op);
    int grad = s.buf("dh", Category::activations, act, s.op("matmul_bwd", Phase::backward, -1));
    s.bufs[size_t(dl)].last_op = s.bufs[size_t(grad)].first_op;
    s.bufs[size_t(prev)].last_op = s.op("layernorm_bwd", Phase::backward, -1);
    static const char * bwd_names[] = {"layernorm_bwd", "matmul_bwd", "attention_bwd", "attention_bwd",
                                       "matmul_bwd", "residual_bwd", "layernorm_bwd", "matmul_bwd",
                                       "gelu_bwd", "matmul_bwd", "residual_bwd"};
    for (int l = L - 1; l >= 0; --l) {
        for (int k = 10; k >= 0; --k) {
            const int o = s.op(bwd_names[k], Phase::backward, l);
            s.bufs[size_t(saved[size_t(l)][size_t(k)])].last_op = o;
            s.bufs[size_t(grad)].last_op = o;
            grad = s.buf("d.h." + std::to_string(l) + "." + std::to_string(k), Category::activations,
                         k == 2 ? probs : k == 7 || k == 8 ? 4 * act : act, o);
        }
    }
    s.bufs[size_t(grad)].last_op = s.op("embedding_bwd", Phase::backward, -1);
    s.bufs[size_t(ws)].last_op = s.bufs[size_t(grad)].last_op;
    s.op("grad_norm", Phase::optimizer, -1);
    for (int k = 0; k < 8; ++k) s.op("adamw", Phase::optimizer, -1);

    ReportData & r = s.r;
    const int n = int(r.timeline.events.size());
    for (auto & b : s.bufs) if (b.persistent) b.first_op = 0, b.last_op = n - 1;
    for (int i = 0; i < n; ++i) {
        auto & e = r.timeline.events[size_t(i)];
        e.begin_us = 100.0 * i, e.end_us = 100.0 * i + 90;
        for (const auto & b : s.bufs)
            if (b.first_op <= i && i <= b.last_op) e.live[b.category] += b.bytes;
        e.live[Category::runtime] = 180 * MiB;
        if (r.peak_op < 0 || e.live.total() > r.timeline.events[size_t(r.peak_op)].live.total()) r.peak_op = i;
        for (size_t c = 0; c < kCategoryCount; ++c) r.planned_peak.v[c] = std::max(r.planned_peak.v[c], e.live.v[c]);
    }
    r.title = "memfit profile: gpt2-6l, batch 4 x seq 512";
    r.config = {{"model", "gpt2-6l"}, {"batch", 4}, {"seq", 512}, {"dtype", "fp32"}, {"threads", 16},
                {"check_lifetimes", false}, {"budget", "8GiB"}};
    r.timeline.program = "train";
    r.num_ops = n;
    r.measured_peak = r.planned_peak;
    r.planned_peak[Category::runtime] = 0;  // runtime is measured, not planned
    r.planned_reserved = r.planned_peak;
    r.planned_reserved[Category::activations] += 96 * MiB;  // arena fragmentation
    r.measured_reserved = r.planned_reserved;
    r.measured_reserved[Category::runtime] = 180 * MiB;
    r.budget = 8 * GiB;
    r.peak_rss = r.measured_reserved.total() + 410 * MiB;
    std::vector<ReportBuffer> sorted = s.bufs;
    std::sort(sorted.begin(), sorted.end(), [](const auto & a, const auto & b) { return a.bytes > b.bytes; });
    for (const auto & b : sorted)
        if (b.first_op <= r.peak_op && r.peak_op <= b.last_op) r.live_at_peak.push_back(b);
    r.largest.assign(sorted.begin(), sorted.begin() + 10);
    r.hints = {"activations are the largest share of the peak, reached at the cross-entropy backward.",
               "--batch 2 instead of 4 would lower the planned peak; accumulating two micro-batches keeps the global batch.",
               "saved attention probabilities (B*NH*T*T floats per layer) are 288.00 MiB; a tiled attention would not store them."};
    for (int st = 0; st <= 200; st += 10) {
        r.loss.push_back({st, 3.3 + 7.7 * std::exp(-st / 40.0) + 0.05 * std::sin(st)});
        r.tokens_per_s.push_back({st, 14500 + 800 * std::sin(st / 30.0) - (st == 0 ? 6000 : 0)});
        if (st % 50 == 0) r.val_loss.push_back({st, 3.5 + 7.6 * std::exp(-st / 40.0)});
    }
    return r;
}

// Renders a page with headless Chromium through scripts/render-report.sh; returns the PNG's size.
uintmax_t render_png(const fs::path & html, const fs::path & png) {
    const std::string cmd = std::string("bash ") + MEMFIT_SOURCE_DIR + "/scripts/render-report.sh '" + html.string() +
                            "' '" + png.string() + "' 1200,1600";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << cmd;
    return fs::exists(png) ? fs::file_size(png) : 0;
}

TEST(HtmlReport, ChromiumRendersAChart) {
    if (!fs::exists("/usr/bin/chromium"))
        GTEST_SKIP() << "chromium not installed: apt-get install chromium (renders report.html to PNG headless)";
    const fs::path dir = fs::temp_directory_path() / ("memfit_html_render." + std::to_string(getpid()));
    fs::create_directories(dir);
    const ReportData r = realistic_report();
    EXPECT_EQ(XmlChecker::check(body_of(render_html_report(r))), "");
    write_html_report((dir / "report.html").string(), r);
    {
        std::ofstream blank(dir / "blank.html");
        blank << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/></head><body></body></html>\n";
    }
    const uintmax_t report_png = render_png(dir / "report.html", dir / "report.png");
    const uintmax_t blank_png = render_png(dir / "blank.html", dir / "blank.png");
    ASSERT_GT(blank_png, 0u);
    EXPECT_GT(report_png, 20'000u);
    EXPECT_GT(report_png, 3 * blank_png) << "report " << report_png << " bytes, blank page " << blank_png;
    // MEMFIT_KEEP_REPORT=DIR keeps the page and its screenshot for a human to look at.
    if (const char * keep = std::getenv("MEMFIT_KEEP_REPORT")) {
        fs::create_directories(keep);
        fs::copy_file(dir / "report.html", fs::path(keep) / "report.html", fs::copy_options::overwrite_existing);
        fs::copy_file(dir / "report.png", fs::path(keep) / "report.png", fs::copy_options::overwrite_existing);
    }
    fs::remove_all(dir);
}


// ---------------------------------------------------------------------------------------------
// A multi-process run: three ranks with different peaks (rank 1 also offloads), timelines
// gathered for ranks 0 and 1 only.

ReportData three_rank_report() {
    ReportData r = synthetic_report();
    const char * labels[] = {"rank 0 (tp 0, pp 0, dp 0)", "rank 1 (tp 0, pp 1, dp 0)", "rank 2 <dp & 1>"};
    for (int k = 0; k < 3; ++k) {
        RankView rv;
        rv.rank = k;
        rv.label = labels[k];
        rv.measured_peak = r.measured_peak;
        rv.measured_peak[Category::activations] = uint64_t(100 + 50 * k) * MiB + uint64_t(k);
        rv.measured_peak[Category::workspace] = k == 2 ? 3 * MiB + 1 : 0;
        rv.planned_peak = rv.measured_peak;
        rv.planned_peak[Category::activations] -= uint64_t(k) * MiB;   // rank 0 matches its plan
        rv.peak_rss = uint64_t(2 + k) * GiB;
        if (k < 2) {
            rv.timeline = r.timeline;
            for (auto & e : rv.timeline.events) e.live[Category::activations] += uint64_t(k) * 10 * MiB;
            if (k == 1) rv.timeline.events.resize(30);
        }
        r.ranks.push_back(rv);
    }
    r.ranks[1].measured_peak[Category::offloaded] = 600 * MiB;   // host memory: not in the bar
    return r;
}

TEST(HtmlReport, PerRankSectionShowsEachRank) {
    const ReportData r = three_rank_report();
    const std::string page = render_html_report(r);
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    EXPECT_EQ(count(page, "<h2>Memory per rank</h2>"), 1u);

    // One group per rank with its numbers; device bytes only (offloaded left out).
    const std::regex re(R"re(<g class="rank" data-rank="([0-9]+)" data-total="([0-9]+)" data-planned="([0-9]+)"[^>]*>(.*?)</g>)re");
    std::vector<std::smatch> groups;
    for (std::sregex_iterator it(page.begin(), page.end(), re), end; it != end; ++it) groups.push_back(*it);
    ASSERT_EQ(groups.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
        const RankView & rv = r.ranks[k];
        const std::string g = groups[k][4].str();
        EXPECT_EQ(groups[k][1].str(), std::to_string(rv.rank));
        EXPECT_EQ(groups[k][2].str(), std::to_string(rv.measured_peak.total())) << "rank " << k;
        EXPECT_EQ(groups[k][3].str(), std::to_string(rv.planned_peak.total())) << "rank " << k;
        EXPECT_NE(g.find("class=\"row-label\">" + svg::escape(rv.label) + "</text>"), std::string::npos) << g;
        EXPECT_NE(g.find("RSS " + svg::short_bytes(rv.peak_rss)), std::string::npos) << g;
        EXPECT_NE(g.find(svg::short_bytes(rv.measured_peak.total()) + " \u00b7 plan " +
                         svg::short_bytes(rv.planned_peak.total())), std::string::npos) << g;
        // The stack: every device category with bytes, in kStackOrder, nothing else.
        std::vector<std::string> cats, expected;
        const std::regex rect_re("<rect data-category=\"([a-z_]+)\"");
        for (std::sregex_iterator it(g.begin(), g.end(), rect_re), end; it != end; ++it) cats.push_back((*it)[1]);
        for (Category c : svg::kStackOrder)
            if (rv.measured_peak[c] != 0) expected.emplace_back(category_name(c));
        EXPECT_EQ(cats, expected) << "rank " << k;
        EXPECT_EQ(count(g, "class=\"planned-tick\""), 1u);
    }
    EXPECT_NE(groups[1][2].str(), std::to_string(r.ranks[1].measured_peak.total() + 600 * MiB));
    EXPECT_NE(groups[1][4].str().find("+600 MiB offloaded"), std::string::npos);
    EXPECT_EQ(page.find("rank 2 <dp"), std::string::npos);   // escaped everywhere

    // Two ranks have timelines: one line each, with their op counts.
    EXPECT_EQ(count(page, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"rank-timeline\""), 1u);
    const std::regex line_re(R"re(<g class="rank-line" data-rank="([0-9]+)" data-points="([0-9]+)" data-max="([0-9]+)")re");
    std::vector<std::string> lines;
    for (std::sregex_iterator it(page.begin(), page.end(), line_re), end; it != end; ++it) {
        const size_t k = std::stoul((*it)[1]);
        ASSERT_LT(k, 2u);
        uint64_t mx = 0;
        for (const auto & e : r.ranks[k].timeline.events) mx = std::max(mx, e.live.total());
        EXPECT_EQ((*it)[2].str(), std::to_string(r.ranks[k].timeline.events.size()));
        EXPECT_EQ((*it)[3].str(), std::to_string(mx));
        lines.push_back((*it)[1]);
    }
    EXPECT_EQ(lines, (std::vector<std::string>{"0", "1"}));
}

TEST(HtmlReport, PerRankSectionOnlyForSeveralRanks) {
    ReportData r = three_rank_report();
    r.ranks[1].timeline.events.clear();   // one rank with a timeline: bars, no line chart
    std::string page = render_html_report(r);
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    EXPECT_EQ(count(page, "<g class=\"rank\" "), 3u);
    EXPECT_EQ(page.find("class=\"rank-timeline\""), std::string::npos);

    r.ranks.resize(1);                    // one process: no section
    page = render_html_report(r);
    EXPECT_EQ(page.find("Memory per rank"), std::string::npos);
    EXPECT_EQ(page.find("<g class=\"rank\""), std::string::npos);
    EXPECT_EQ(page, render_html_report(synthetic_report()));
}

// A step that failed out of memory at op 20: the timeline ends there.
constexpr int kFailedOp = 20;

ReportData failed_report() {
    ReportData r = synthetic_report();
    r.timeline.events.resize(kFailedOp + 1);
    r.timeline.events.back().end_us = r.timeline.events.back().begin_us;
    r.timeline.failed_op = kFailedOp;
    r.failure = "allocation of h.3.attn.<probs> (1.50 MiB) failed";
    r.peak_op = kFailedOp;
    return r;
}

TEST(HtmlReport, FailureBannerAndWording) {
    ReportData r = failed_report();
    std::string page = render_html_report(r);
    EXPECT_EQ(XmlChecker::check(body_of(page)), "");
    const std::string banner = fmt::format("<div class=\"failure\" data-failed-op=\"{}\">This step failed: {} at op {} ({})</div>",
                                           kFailedOp, svg::escape(r.failure), kFailedOp,
                                           svg::escape(svg::op_label(r.timeline.events.back())));
    const size_t at = page.find(banner);
    ASSERT_NE(at, std::string::npos) << banner;
    EXPECT_EQ(count(page, "class=\"failure\""), 1u);
    EXPECT_LT(at, page.find("<h1>"));   // at the top
    EXPECT_NE(page.find("<title>" + svg::escape(r.title) + "</title>"), std::string::npos);
    EXPECT_NE(page.find("<h1>" + svg::escape(r.title) + "</h1>"), std::string::npos);

    // The chart's marker is the failed op; the lists say when the allocation failed.
    EXPECT_NE(page.find("data-peak-op=\"20\""), std::string::npos);
    EXPECT_NE(page.find(fmt::format(">allocation failed with {} at op 20 (",
                                    format_bytes(r.timeline.events.back().live.total()))), std::string::npos);
    EXPECT_FALSE(std::regex_search(page, std::regex("class=\"peak-label\"[^>]*>peak ")));
    EXPECT_NE(page.find("<h3>Buffers live when the allocation failed (12, "), std::string::npos);
    EXPECT_NE(page.find("<h3>When the allocation failed, by category</h3>"), std::string::npos);
    EXPECT_NE(page.find("(red: the failed op)"), std::string::npos);
    EXPECT_NE(page.find("dominates at the failure"), std::string::npos);
    EXPECT_EQ(page.find("Buffers live at the peak"), std::string::npos);
    EXPECT_EQ(page.find("At the peak, by category"), std::string::npos);

    // The marker follows the failed op even when peak_op points elsewhere.
    r.peak_op = 5;
    page = render_html_report(r);
    EXPECT_NE(page.find("data-peak-op=\"20\""), std::string::npos);

    // A completed step has neither banner nor failure wording.
    page = render_html_report(synthetic_report());
    EXPECT_EQ(page.find("class=\"failure\""), std::string::npos);
    EXPECT_EQ(page.find("allocation failed"), std::string::npos);
    EXPECT_NE(page.find("<h3>Buffers live at the peak (12, "), std::string::npos);
}

}  // namespace
}  // namespace memfit
