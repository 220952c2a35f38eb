#include "app/stop_request.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {

std::atomic<int> g_signal{0};           // the first stop signal received (0: none)
std::atomic<int64_t> g_when_ns{0};      // its CLOCK_MONOTONIC time

int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);   // async-signal-safe
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void on_signal(int sig) {
    if (g_signal.load() == 0) {   // the time first: a reader that sees the signal sees its time
        g_when_ns.store(now_ns());
        int none = 0;
        if (g_signal.compare_exchange_strong(none, sig)) return;
    }
    // The second: at once, as the default action would (the checkpoints on disk are complete).
    static const char msg[] = "memfit: second stop signal: exiting now\n";
    [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);
    _exit(128 + sig);
}

struct Named {
    const char * name;
    int number;
};
constexpr Named kSignals[] = {{"TERM", SIGTERM}, {"INT", SIGINT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
                              {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"XCPU", SIGXCPU}};

}  // namespace

std::vector<int> parse_stop_signals(const std::string & csv) {
    std::vector<int> out;
    if (csv == "none") return out;
    size_t start = 0;
    while (start <= csv.size()) {
        const size_t end = std::min(csv.find(',', start), csv.size());
        std::string s = csv.substr(start, end - start);
        if (s.starts_with("SIG")) s = s.substr(3);
        bool found = false;
        for (const Named & n : kSignals)
            if (s == n.name) out.push_back(n.number), found = true;
        if (!found)
            throw ConfigError(fmt::format("--stop-signals {}: '{}' is not one of TERM, INT, USR1, USR2, HUP, QUIT, "
                                          "XCPU (or none)", csv, s));
        start = end + 1;
    }
    return out;
}

std::string stop_signal_list(const std::string & csv) {
    std::string out;
    for (int sig : parse_stop_signals(csv))
        for (const Named & n : kSignals)
            if (n.number == sig) out += (out.empty() ? "SIG" : ", SIG") + std::string(n.name);
    return out;
}

// The signals are blocked in the calling thread (and so in every thread it starts from then on:
// OpenMP's, oneDNN's) and taken by a thread of their own that waits for them (sigwait), so a
// stop signal never interrupts the computation. Delivered to the computing thread, one used to
// corrupt the heap now and then (about 1 run in 3 of Cli.StopSignalsCheckpointAndResumeAutoIsBitwise
// on a Zen 3, the abort inside oneDNN's matmul; none in 32 runs since). The handler stays
// installed for threads started before (MPI's), which would otherwise take the default action.
void install_stop_handlers(const std::vector<int> & signals) {
    static std::mutex mu;
    static sigset_t waited;   // the signals a waiting thread takes already
    const std::lock_guard<std::mutex> lock(mu);
    static const bool init = [] { return sigemptyset(&waited) == 0; }();
    (void) init;
    sigset_t fresh;
    sigemptyset(&fresh);
    bool any = false;
    for (int sig : signals) {
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;   // a blocking read or write in flight goes on
        sigaction(sig, &sa, nullptr);
        if (sigismember(&waited, sig) == 1) continue;
        sigaddset(&fresh, sig);
        sigaddset(&waited, sig);
        any = true;
    }
    if (!any) return;
    pthread_sigmask(SIG_BLOCK, &fresh, nullptr);
    std::thread([fresh] {
        for (;;) {
            int sig = 0;
            if (sigwait(&fresh, &sig) == 0) on_signal(sig);
        }
    }).detach();
}

bool stop_requested() { return g_signal.load(std::memory_order_relaxed) != 0; }

std::string stop_signal_name() {
    const int s = g_signal.load();
    for (const Named & n : kSignals)
        if (n.number == s) return std::string("SIG") + n.name;
    return s ? fmt::format("signal {}", s) : std::string();
}

double seconds_since_stop_request() {
    return stop_requested() ? double(now_ns() - g_when_ns.load()) / 1e9 : 0.0;
}

void reset_stop_request() {
    g_signal.store(0);
    g_when_ns.store(0);
}

}  // namespace memfit
