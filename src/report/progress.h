// Progress of the training loop on the terminal or in a log.
//   tty:   one status line rewritten in place (step, bar, loss, tokens/s, ETA, memory), at most
//          ~10 redraws a second; at log points a permanent line is left above it.
//   plain: one line per log point, for logs and pipes.
//   json:  one JSON object per log point (JSON Lines), for scripts.
//   quiet: nothing.
// auto_detect picks tty when the stream is a terminal and TERM is not "dumb", else plain.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace memfit {

struct ProgressLine {
    int      step = 0, total_steps = 0;
    double   loss = 0;
    double   val_loss = 0;      // NaN if none at this step
    double   lr = 0, grad_norm = 0, tokens_per_s = 0, ms_per_step = 0, eta_s = 0;
    double   trained_per_s = NAN;   // instruction data: the trained (unmasked) targets per second
    uint64_t live = 0, peak = 0, budget = 0;   // bytes; budget 0: none
};

enum class ProgressMode { auto_detect, tty, plain, json, quiet };

// "step 10/600 | loss 3.2104 | val 3.3000 | lr 2.00e-03 | ... | mem 13.13 MiB live / ...".
std::string format_progress_plain(const ProgressLine & p);
// One JSON object, no trailing newline; val_loss only when not NaN.
std::string format_progress_json(const ProgressLine & p);
// The in-place status line: "step 10/600 [#-------------------] 1.7% | loss 3.2104 | 10601 tok/s |
// ETA 0:01:40 | mem 13.13 MiB/98.30 MiB/23.06 GiB" (live/peak/budget); bar=false leaves out the bar.
std::string format_progress_status(const ProgressLine & p, bool bar = true);
// Seconds as h:mm:ss ("0:01:40"); "-:--:--" when negative or not finite.
std::string format_eta(double seconds);

class Progress {
public:
    explicit Progress(ProgressMode m, std::FILE * out = stdout);

    // log_point: a log interval, an eval, or the last step.
    void update(const ProgressLine & p, bool log_point);
    // Ends an in-place status line with a newline (redrawing it first if a rate-limited update
    // was not shown). Safe to call more than once.
    void finish();
    // Prints a normal line without breaking the status line: in tty mode the status line is
    // cleared, the message printed, and the status line drawn again below it. In json mode the
    // line is wrapped as {"message": ...} so the stream stays JSON Lines; quiet prints nothing.
    void message(const std::string & line);

    // The mode after auto-detection (never auto_detect).
    ProgressMode mode() const { return mode_; }

private:
    void draw_status();
    void write(const std::string & s);
    int  terminal_width() const;         // columns; 0 when unknown


    ProgressMode mode_;
    std::FILE *  out_;
    bool         line_open_ = false;     // a status line is on screen without a newline
    bool         pending_ = false;       // last_ was not drawn (rate-limited)
    bool         have_last_ = false;
    ProgressLine last_{};
    std::chrono::steady_clock::time_point last_draw_{};
    bool         drawn_once_ = false;
};

}  // namespace memfit
