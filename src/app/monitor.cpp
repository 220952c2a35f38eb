#include "app/monitor.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_read.h"
#include "core/units.h"
#include "memory/category.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

uint64_t bytes_at(const nlohmann::json & obj, std::string_view category) {
    if (!obj.is_object()) return 0;
    const auto it = obj.find(std::string(category));
    return it != obj.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

uint64_t total_of(const nlohmann::json & obj) {
    uint64_t t = 0;
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (Category(c) != Category::offloaded) t += bytes_at(obj, kCategoryNames[c]);
    return t;
}

std::string pct(uint64_t part, uint64_t whole) {
    return whole ? fmt::format("{:.1f}%", 100.0 * double(part) / double(whole)) : std::string("-");
}

// One rank's block: totals against its plan and the budget, then a row per category with bytes.
std::string rank_block(const nlohmann::json & plan, const nlohmann::json & now, uint64_t budget) {
    const nlohmann::json planned = plan.value("planned_peak", nlohmann::json::object());
    const nlohmann::json live = now.value("live", nlohmann::json::object());
    const nlohmann::json peak = now.value("peak", nlohmann::json::object());
    const uint64_t plan_total = plan.value("planned_peak_total", uint64_t(0)), peak_total = total_of(peak);
    std::string s = fmt::format("{:<26} live {:>11}  peak {:>11}  planned {:>11} (peak {} of plan{})  RSS {}\n",
                                plan.value("label", fmt::format("rank {}", now.value("rank", 0))),
                                format_bytes(total_of(live)), format_bytes(peak_total), format_bytes(plan_total),
                                pct(peak_total, plan_total),
                                budget ? fmt::format(", {} of budget", pct(peak_total, budget)) : std::string(),
                                format_bytes(now.value("rss", uint64_t(0))));
    s += fmt::format("  {:<18} {:>11}  {:>11}  {:>11}\n", "category", "live", "peak", "planned");
    for (size_t c = 0; c < kCategoryCount; ++c) {
        const std::string_view n = kCategoryNames[c];
        const uint64_t l = bytes_at(live, n), p = bytes_at(peak, n), q = bytes_at(planned, n);
        if (l || p || q)
            s += fmt::format("  {:<18} {:>11}  {:>11}  {:>11}\n", n == "offloaded" ? "+ offloaded" : std::string(n),
                             format_bytes(l), format_bytes(p), format_bytes(q));
    }
    return s;
}

// The run's process exists, is no zombie (killed, not yet reaped), and is the one run.json names:
// it started when run.json says (a pid reused by another process since is not the run; a
// run.json without "pid_start", an older memfit's, by the process's name).
bool process_alive(const nlohmann::json & run) {
    const long pid = run.contains("pid") && run["pid"].is_number_integer() ? run["pid"].get<long>() : 0;
    if (pid <= 0 || (::kill(pid_t(pid), 0) != 0 && errno != EPERM)) return false;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');   // "pid (comm) S ...": the state follows the name
    if (paren != std::string::npos && paren + 2 < text.size() && (text[paren + 2] == 'Z' || text[paren + 2] == 'X'))
        return false;
    if (run.contains("pid_start") && run["pid_start"].is_number_unsigned())
        return process_start_ticks(pid) == run["pid_start"].get<uint64_t>();
    // An older memfit's run.json: the process must at least be a memfit.
    std::ifstream comm(fmt::format("/proc/{}/comm", pid));
    std::string name;
    std::getline(comm, name);
    return name.starts_with("memfit");
}

// The file's JSON, or a discarded value when it is missing, being written, or not bounded JSON.
nlohmann::json read_json(const fs::path & p) {
    try {
        if (std::optional<nlohmann::json> j = try_parse_json(read_text_file(p.string(), uint64_t(64) << 20))) return *j;
    } catch (const IoError &) {
        return nullptr;
    }
    return nlohmann::json(nlohmann::json::value_t::discarded);
}

// Reads metrics.jsonl's complete lines past `offset` (from 0 again when the file was rewritten
// shorter: a resumed run), keeping the newest line and the last validation loss.
struct MetricsTail {
    std::streamoff offset = 0;
    nlohmann::json last;
    double val = NAN;
    bool poll(const fs::path & path) {
        std::error_code ec;
        const auto size = std::streamoff(fs::file_size(path, ec));
        if (ec) return false;
        if (size < offset) offset = 0, last = nullptr, val = NAN;
        std::ifstream in(path, std::ios::binary);
        in.seekg(offset);
        bool changed = false;
        for (std::string line; std::getline(in, line);) {
            if (in.eof()) break;   // no newline yet: the writer is mid-line
            offset += std::streamoff(line.size()) + 1;
            const std::optional<nlohmann::json> parsed = try_parse_json(line);
            if (!parsed || !parsed->is_object() || !parsed->contains("step")) continue;
            const nlohmann::json & j = *parsed;
            last = j;
            if (j.contains("val_loss") && j["val_loss"].is_number()) val = j["val_loss"].get<double>();
            changed = true;
        }
        return changed;
    }
};

}  // namespace

uint64_t process_start_ticks(long pid) {
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) return 0;
    std::istringstream fields(text.substr(paren + 2));   // from field 3 (the state) on
    std::string f;
    for (int i = 3; i < 22 && fields >> f;) ++i;          // field 22: starttime
    uint64_t start = 0;
    return fields >> start ? start : 0;
}

std::string render_monitor(const nlohmann::json & run, const nlohmann::json & last, double val,
                           const std::string & state) {
    const int world = run.value("world", 1), steps = run.value("steps", 0);
    const uint64_t budget = run.value("budget", uint64_t(0));
    std::string s = fmt::format("memfit monitor {}: {} on {}, {} rank{} (pid {}), {}\n", run.value("dir", ""),
                                run.value("model", "?"), run.value("device", "?"), world, world == 1 ? "" : "s",
                                run.value("pid", 0L), state);
    if (last.is_object()) {
        const int step = last.value("step", 0);
        s += fmt::format("step {}/{} ({:.1f}%)  loss {:.4f}", step, steps, steps ? 100.0 * step / steps : 0.0,
                         last.value("loss", NAN));
        if (!std::isnan(val)) s += fmt::format("  val {:.4f}", val);
        s += fmt::format("  {:.0f} tokens/s  {:.1f} ms/step  lr {:.2e}  grad norm {:.3f}\n",
                         last.value("tokens_per_s", 0.0), last.value("ms", 0.0), last.value("lr", 0.0),
                         last.value("grad_norm", 0.0));
    } else {
        s += fmt::format("step 0/{}: waiting for the first log line\n", steps);
    }
    s += budget ? fmt::format("budget {} per rank\n", format_bytes(budget)) : std::string("no memory budget\n");
    const nlohmann::json plans = run.value("ranks", nlohmann::json::array());
    const nlohmann::json nows = last.is_object() ? last.value("ranks", nlohmann::json::array()) : nlohmann::json::array();
    for (size_t k = 0; k < plans.size(); ++k) {
        nlohmann::json now = {{"rank", k}};
        for (const auto & r : nows)
            if (r.value("rank", -1) == int(k)) now = r;
        s += '\n';
        s += rank_block(plans[k], now, budget);
    }
    return s;
}

int run_monitor(const MonitorOptions & opt) {
    const fs::path dir = opt.run_dir, run_path = dir / "run.json", metrics = dir / "metrics.jsonl";
    const auto t0 = std::chrono::steady_clock::now();
    const auto pause = std::chrono::duration<double>(opt.interval);
    nlohmann::json run = read_json(run_path);
    while (!run.is_object()) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // There, but not a run's: run.json is written whole (renamed into place), so it will not become one.
        if (run.is_discarded() || !run.is_null())
            throw FormatError(fmt::format("{}: not a memfit run's run.json (not a JSON object); is {} a memfit train "
                                          "--out folder?", run_path.string(), opt.run_dir));
        if (opt.once || (opt.wait > 0 && waited >= opt.wait)) {
            throw IoError(fmt::format("{}: no run.json after {:.0f} s; hint: start the run with `memfit train --out {}` "
                                      "(run.json appears once its plan is made)",
                                      opt.run_dir, waited, opt.run_dir));
        }
        std::this_thread::sleep_for(pause);
        run = read_json(run_path);
    }
    run["dir"] = opt.run_dir;
    const bool tty = ::isatty(STDOUT_FILENO) != 0;
    MetricsTail tail;
    int shown_step = -1;
    std::string shown_state;
    for (;;) {
        const bool alive = process_alive(run);
        tail.poll(metrics);
        // A run that ended wrote summary.json after its run.json (an earlier run's does not count).
        std::error_code ec;
        const bool summary = fs::exists(dir / "summary.json") &&
                             fs::last_write_time(dir / "summary.json", ec) >= fs::last_write_time(run_path, ec);
        const std::string state = alive ? "running" : summary ? "done (summary.json written)"
                                                               : "ended without summary.json (failed or killed)";
        const int step = tail.last.is_object() ? tail.last.value("step", 0) : 0;
        if (step != shown_step || state != shown_state || opt.once) {
            if (tty) std::fputs("\x1b[H\x1b[2J", stdout);   // the screen redrawn in place
            std::fputs(render_monitor(run, tail.last, tail.val, state).c_str(), stdout);
            if (!tty) std::fputc('\n', stdout);
            std::fflush(stdout);
            shown_step = step;
            shown_state = state;
        }
        if (!alive && !summary) {
            std::fprintf(stderr, "memfit: error: the run in %s is not running and wrote no summary.json: it failed or "
                                 "was killed (its last lines are in %s)\n",
                         opt.run_dir.c_str(), (dir / "metrics.jsonl").c_str());
            return 1;
        }
        if (opt.once || !alive) return 0;
        std::this_thread::sleep_for(pause);
        // A resumed run (a new process in the same folder) rewrites run.json.
        if (const nlohmann::json again = read_json(run_path); again.is_object() && again.value("pid", 0L) != run.value("pid", 0L)) {
            run = again;
            run["dir"] = opt.run_dir;
        }
    }
}

}  // namespace memfit
