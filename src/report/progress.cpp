#include "report/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_num.h"

#include "core/units.h"

namespace memfit {
namespace {

constexpr auto kMinRedraw = std::chrono::milliseconds(100);   // ~10 redraws per second
constexpr int  kBarWidth = 20;
constexpr const char * kClearEol = "\x1b[K";

std::string memory_text(const ProgressLine & p) {
    std::string s = fmt::format("mem {} live / {} peak", format_bytes(p.live), format_bytes(p.peak));
    if (p.budget != 0) s += fmt::format(" / {} budget", format_bytes(p.budget));
    return s;
}

bool is_last_step(const ProgressLine & p) { return p.total_steps > 0 && p.step >= p.total_steps; }

}  // namespace

std::string format_eta(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "-:--:--";
    const auto s = static_cast<uint64_t>(std::llround(seconds));
    return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

// " (812 trained)" with instruction data, else nothing.
std::string trained_text(const ProgressLine & p) {
    return std::isnan(p.trained_per_s) ? std::string() : fmt::format(" ({:.0f} trained)", p.trained_per_s);
}

std::string format_progress_plain(const ProgressLine & p) {
    std::string s = fmt::format("step {}/{} | loss {:.4f}", p.step, p.total_steps, p.loss);
    if (!std::isnan(p.val_loss)) s += fmt::format(" | val {:.4f}", p.val_loss);
    s += fmt::format(" | lr {:.2e} | norm {:.3f} | {:.0f} tok/s{} | {:.1f} ms | ETA {} | {}", p.lr, p.grad_norm,
                     p.tokens_per_s, trained_text(p), p.ms_per_step, format_eta(p.eta_s), memory_text(p));
    return s;
}

std::string format_progress_json(const ProgressLine & p) {
    nlohmann::ordered_json j;
    j["step"] = p.step;
    j["total_steps"] = p.total_steps;
    j["loss"] = p.loss;
    if (!std::isnan(p.val_loss)) j["val_loss"] = p.val_loss;
    j["lr"] = json_float(float(p.lr));   // the float the schedule computed, not its double expansion
    j["grad_norm"] = p.grad_norm;
    j["tokens_per_s"] = p.tokens_per_s;
    if (!std::isnan(p.trained_per_s)) j["trained_tokens_per_s"] = p.trained_per_s;
    j["ms_per_step"] = p.ms_per_step;
    j["eta_s"] = p.eta_s;
    j["live_bytes"] = p.live;
    j["peak_bytes"] = p.peak;
    j["budget_bytes"] = p.budget;
    return j.dump();   // non-finite numbers become null
}

std::string format_progress_status(const ProgressLine & p, bool bar) {
    std::string s = fmt::format("step {}/{}", p.step, p.total_steps);
    if (p.total_steps > 0) {
        const double frac = std::clamp(double(p.step) / double(p.total_steps), 0.0, 1.0);
        if (bar) {
            const int filled = static_cast<int>(frac * kBarWidth);
            s += fmt::format(" [{}{}]", std::string(size_t(filled), '#'), std::string(size_t(kBarWidth - filled), '-'));
        }
        s += fmt::format(" {:.1f}%", frac * 100.0);
    }
    s += fmt::format(" | loss {:.4f} | {:.0f} tok/s{} | ETA {} | mem {}/{}", p.loss, p.tokens_per_s, trained_text(p),
                     format_eta(p.eta_s), format_bytes(p.live), format_bytes(p.peak));
    if (p.budget != 0) s += fmt::format("/{}", format_bytes(p.budget));
    return s;
}

Progress::Progress(ProgressMode m, std::FILE * out) : mode_(m), out_(out) {
    const int fd = out_ ? fileno(out_) : -1;
    if (mode_ == ProgressMode::auto_detect) {
        const char * term = std::getenv("TERM");
        const bool dumb = term != nullptr && std::strcmp(term, "dumb") == 0;
        mode_ = (fd >= 0 && isatty(fd) && !dumb) ? ProgressMode::tty : ProgressMode::plain;
    }
    if (out_ == nullptr) mode_ = ProgressMode::quiet;
}

int Progress::terminal_width() const {
    struct winsize ws {};
    const int fd = fileno(out_);
    if (fd < 0 || ioctl(fd, TIOCGWINSZ, &ws) != 0) return 0;
    return ws.ws_col;
}

void Progress::write(const std::string & s) {
    std::fwrite(s.data(), 1, s.size(), out_);
    std::fflush(out_);
}

void Progress::draw_status() {
    // A line wider than the terminal wraps, and \r would then rewrite only its last row: drop the
    // bar, then cut the line. The width is read on every draw (at most ~10 a second) to follow
    // resizes.
    std::string line = format_progress_status(last_);
    const int width = terminal_width();
    if (width > 1 && line.size() >= size_t(width)) line = format_progress_status(last_, false);
    if (width > 1 && line.size() >= size_t(width)) line.resize(size_t(width - 1));
    write(fmt::format("\r{}{}", line, kClearEol));
    line_open_ = true;
    pending_ = false;
    drawn_once_ = true;
    last_draw_ = std::chrono::steady_clock::now();
}

void Progress::update(const ProgressLine & p, bool log_point) {
    switch (mode_) {
        case ProgressMode::quiet:
        case ProgressMode::auto_detect:
            return;
        case ProgressMode::plain:
            if (log_point) write(fmt::format("{}\n", format_progress_plain(p)));
            return;
        case ProgressMode::json:
            if (log_point) write(fmt::format("{}\n", format_progress_json(p)));
            return;
        case ProgressMode::tty:
            break;
    }
    last_ = p;
    have_last_ = true;
    if (log_point) {
        // Leave the log line in the history, then draw the status line below it.
        const std::string s = fmt::format("\r{}{}\n", format_progress_plain(p), kClearEol);
        std::fwrite(s.data(), 1, s.size(), out_);
        line_open_ = false;
        draw_status();
        return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (drawn_once_ && !is_last_step(p) && now - last_draw_ < kMinRedraw) {
        pending_ = true;
        return;
    }
    draw_status();
}

void Progress::finish() {
    if (mode_ != ProgressMode::tty) return;
    if (pending_ && have_last_) draw_status();
    if (line_open_) {
        write("\n");
        line_open_ = false;
    }
}

void Progress::message(const std::string & line) {
    std::string text = line;
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    switch (mode_) {
        case ProgressMode::quiet:
        case ProgressMode::auto_detect:
            return;
        case ProgressMode::plain:
            write(fmt::format("{}\n", text));
            return;
        case ProgressMode::json:
            write(fmt::format("{}\n", nlohmann::json{{"message", text}}.dump(-1, ' ', false,
                                                                               nlohmann::json::error_handler_t::replace)));
            return;
        case ProgressMode::tty:
            break;
    }
    if (!line_open_) {
        write(fmt::format("{}\n", text));
        return;
    }
    const std::string s = fmt::format("\r{}{}\n", text, kClearEol);
    std::fwrite(s.data(), 1, s.size(), out_);
    line_open_ = false;
    draw_status();
}

}  // namespace memfit
