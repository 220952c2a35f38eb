#include "report/progress.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/units.h"

namespace memfit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A FILE* backed by a temporary file (never a tty) whose contents can be read back.
class Capture {
public:
    Capture() : f_(std::tmpfile()) {}
    ~Capture() { if (f_) std::fclose(f_); }
    Capture(const Capture &) = delete;
    Capture & operator=(const Capture &) = delete;
    std::FILE * file() const { return f_; }
    std::string text() const {
        std::fflush(f_);
        const long end = std::ftell(f_);
        std::string s(size_t(end), '\0');
        std::rewind(f_);
        const size_t n = std::fread(s.data(), 1, s.size(), f_);
        s.resize(n);
        std::fseek(f_, 0, SEEK_END);
        return s;
    }

private:
    std::FILE * f_;
};

std::vector<std::string> lines_of(const std::string & s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < s.size()) {
        const size_t nl = s.find('\n', start);
        if (nl == std::string::npos) { out.push_back(s.substr(start)); break; }
        out.push_back(s.substr(start, nl - start));
        start = nl + 1;
    }
    return out;
}

ProgressLine line_at(int step, double val = kNaN) {
    ProgressLine p;
    p.step = step;
    p.total_steps = 600;
    p.loss = 3.2104;
    p.val_loss = val;
    p.lr = 2e-3;
    p.grad_norm = 0.751;
    p.tokens_per_s = 10601.4;
    p.ms_per_step = 193.2;
    p.eta_s = 100;
    p.live = uint64_t(13.13 * double(MiB));
    p.peak = uint64_t(98.30 * double(MiB));
    p.budget = uint64_t(23.06 * double(GiB));
    return p;
}

TEST(Progress, FormatsEta) {
    EXPECT_EQ(format_eta(0), "0:00:00");
    EXPECT_EQ(format_eta(100), "0:01:40");
    EXPECT_EQ(format_eta(3600 * 12 + 61.4), "12:01:01");
    EXPECT_EQ(format_eta(kNaN), "-:--:--");
    EXPECT_EQ(format_eta(-1), "-:--:--");
}

TEST(Progress, PlainLineMatchesTheDocumentedForm) {
    EXPECT_EQ(format_progress_plain(line_at(10, 3.3)),
              "step 10/600 | loss 3.2104 | val 3.3000 | lr 2.00e-03 | norm 0.751 | 10601 tok/s | 193.2 ms | "
              "ETA 0:01:40 | mem 13.13 MiB live / 98.30 MiB peak / 23.06 GiB budget");
    ProgressLine no_budget = line_at(10);
    no_budget.budget = 0;
    EXPECT_EQ(format_progress_plain(no_budget),
              "step 10/600 | loss 3.2104 | lr 2.00e-03 | norm 0.751 | 10601 tok/s | 193.2 ms | "
              "ETA 0:01:40 | mem 13.13 MiB live / 98.30 MiB peak");
}

TEST(Progress, StatusLineForm) {
    EXPECT_EQ(format_progress_status(line_at(150)),
              "step 150/600 [#####---------------] 25.0% | loss 3.2104 | 10601 tok/s | ETA 0:01:40 | "
              "mem 13.13 MiB/98.30 MiB/23.06 GiB");
    ProgressLine p = line_at(150);
    p.budget = 0;
    EXPECT_EQ(format_progress_status(p, false),
              "step 150/600 25.0% | loss 3.2104 | 10601 tok/s | ETA 0:01:40 | mem 13.13 MiB/98.30 MiB");
}

TEST(Progress, PlainPrintsOneLinePerLogPointOnly) {
    Capture cap;
    Progress prog(ProgressMode::plain, cap.file());
    EXPECT_EQ(prog.mode(), ProgressMode::plain);
    for (int step = 1; step <= 30; ++step) {
        const bool log = step % 10 == 0;
        prog.update(line_at(step, step == 20 ? 3.3 : kNaN), log);
        EXPECT_EQ(lines_of(cap.text()).size(), size_t(step / 10)) << "after step " << step;
    }
    prog.finish();
    const std::string out = cap.text();
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), '\n');
    EXPECT_EQ(out.find('\r'), std::string::npos);
    EXPECT_EQ(out.find('\x1b'), std::string::npos);
    const auto lines = lines_of(out);
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[0].rfind("step 10/600 | loss 3.2104 | lr 2.00e-03", 0), 0u) << lines[0];
    EXPECT_EQ(lines[0].find("val"), std::string::npos);
    EXPECT_NE(lines[1].find("| val 3.3000 |"), std::string::npos) << lines[1];
    EXPECT_EQ(lines[2].rfind("step 30/600", 0), 0u);
    for (const auto & l : lines) {
        EXPECT_NE(l.find("| 10601 tok/s |"), std::string::npos) << l;
        EXPECT_NE(l.find("| ETA 0:01:40 |"), std::string::npos) << l;
        EXPECT_NE(l.find("mem 13.13 MiB live / 98.30 MiB peak / 23.06 GiB budget"), std::string::npos) << l;
    }
}

TEST(Progress, JsonLinesParseWithTheRightValues) {
    Capture cap;
    Progress prog(ProgressMode::json, cap.file());
    prog.update(line_at(5), false);
    prog.update(line_at(10), true);
    prog.update(line_at(15), false);
    prog.update(line_at(20, 3.3), true);
    prog.finish();
    const auto lines = lines_of(cap.text());
    ASSERT_EQ(lines.size(), 2u);
    const auto a = nlohmann::json::parse(lines[0]);
    const auto b = nlohmann::json::parse(lines[1]);
    const ProgressLine p = line_at(10);
    EXPECT_EQ(a["step"], 10);
    EXPECT_EQ(a["total_steps"], 600);
    EXPECT_DOUBLE_EQ(a["loss"].get<double>(), p.loss);
    EXPECT_FALSE(a.contains("val_loss"));
    EXPECT_DOUBLE_EQ(a["lr"].get<double>(), p.lr);
    EXPECT_DOUBLE_EQ(a["grad_norm"].get<double>(), p.grad_norm);
    EXPECT_DOUBLE_EQ(a["tokens_per_s"].get<double>(), p.tokens_per_s);
    EXPECT_DOUBLE_EQ(a["ms_per_step"].get<double>(), p.ms_per_step);
    EXPECT_DOUBLE_EQ(a["eta_s"].get<double>(), p.eta_s);
    EXPECT_EQ(a["live_bytes"].get<uint64_t>(), p.live);
    EXPECT_EQ(a["peak_bytes"].get<uint64_t>(), p.peak);
    EXPECT_EQ(a["budget_bytes"].get<uint64_t>(), p.budget);
    EXPECT_EQ(b["step"], 20);
    ASSERT_TRUE(b.contains("val_loss"));
    EXPECT_DOUBLE_EQ(b["val_loss"].get<double>(), 3.3);

    prog.message("saved checkpoint");
    const auto more = lines_of(cap.text());
    ASSERT_EQ(more.size(), 3u);
    EXPECT_EQ(nlohmann::json::parse(more[2])["message"], "saved checkpoint");
}

TEST(Progress, QuietPrintsNothing) {
    Capture cap;
    Progress prog(ProgressMode::quiet, cap.file());
    for (int step = 1; step <= 20; ++step) prog.update(line_at(step), step % 5 == 0);
    prog.message("hello");
    prog.finish();
    EXPECT_EQ(cap.text(), "");
}

TEST(Progress, AutoDetectOnAFileIsPlain) {
    Capture cap;
    Progress prog(ProgressMode::auto_detect, cap.file());
    EXPECT_EQ(prog.mode(), ProgressMode::plain);
}

TEST(Progress, TtyRewritesInPlaceAndKeepsLogLines) {
    Capture cap;
    Progress prog(ProgressMode::tty, cap.file());
    EXPECT_EQ(prog.mode(), ProgressMode::tty);
    prog.update(line_at(1), false);
    std::string out = cap.text();
    EXPECT_EQ(out.rfind("\r", 0), 0u);
    EXPECT_NE(out.find("\x1b[K"), std::string::npos);
    EXPECT_EQ(out.find('\n'), std::string::npos);   // in place: no newline yet
    EXPECT_NE(out.find("step 1/600 ["), std::string::npos) << out;
    EXPECT_NE(out.find("ETA 0:01:40"), std::string::npos);
    EXPECT_NE(out.find("mem 13.13 MiB/98.30 MiB/23.06 GiB"), std::string::npos);

    prog.update(line_at(10, 3.3), true);
    out = cap.text();
    // The permanent line is the plain line, ended by a newline, then the status line again.
    const std::string permanent = format_progress_plain(line_at(10, 3.3)) + "\x1b[K\n";
    const size_t at = out.find(fmt::format("\r{}", permanent));
    ASSERT_NE(at, std::string::npos) << out;
    const std::string after = out.substr(at + 1 + permanent.size());
    EXPECT_EQ(after, fmt::format("\r{}\x1b[K", format_progress_status(line_at(10, 3.3))));

    prog.message("saved checkpoint");
    out = cap.text();
    EXPECT_NE(out.find(fmt::format("\rsaved checkpoint\x1b[K\n\r{}", format_progress_status(line_at(10, 3.3)))), std::string::npos);

    prog.update(line_at(600), true);   // the last step
    prog.finish();
    out = cap.text();
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), '\n');
    EXPECT_NE(out.find("step 600/600 [####################] 100.0%"), std::string::npos);
    // Each permanent log line ends with a newline.
    for (const char * step : {"\rstep 10/600 | loss", "\rstep 600/600 | loss"}) {
        const size_t p = out.find(step);
        ASSERT_NE(p, std::string::npos) << step;
        const size_t nl = out.find('\n', p);
        ASSERT_NE(nl, std::string::npos);
        EXPECT_EQ(out.find('\r', p + 1), nl + 1);   // the line runs to its newline, then a redraw
    }
    const size_t len = out.size();
    prog.finish();   // idempotent
    EXPECT_EQ(cap.text().size(), len);
}

TEST(Progress, TtyRateLimitsButDrawsTheLastStepAndFinishes) {
    Capture cap;
    Progress prog(ProgressMode::tty, cap.file());
    ProgressLine p = line_at(1);
    p.total_steps = 1000;
    for (int step = 1; step < 1000; ++step) {
        p.step = step;
        prog.update(p, false);
    }
    const std::string fast = cap.text();
    size_t draws = 0;
    for (char c : fast) draws += c == '\r';
    EXPECT_GE(draws, 1u);
    EXPECT_LT(draws, 100u);   // 999 rapid updates are not 999 redraws
    prog.finish();            // redraws the step that was rate-limited, then a newline
    const std::string out = cap.text();
    EXPECT_NE(out.find("step 999/1000"), std::string::npos);
    EXPECT_EQ(out.back(), '\n');

    Capture cap2;
    Progress prog2(ProgressMode::tty, cap2.file());
    p.step = 999;
    prog2.update(p, false);
    p.step = 1000;
    prog2.update(p, false);   // last step: drawn despite the rate limit
    EXPECT_NE(cap2.text().find("step 1000/1000"), std::string::npos);
}

}  // namespace
}  // namespace memfit
