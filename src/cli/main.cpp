// memfit: train, plan and profile transformer language models inside a memory budget.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "app/stop_request.h"
#include "app/trainer.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/version.h"
#include "core/error.h"

namespace {

// `memfit train` takes its stop signals from before its first instruction, so that a SIGTERM while
// the run starts (the shared libraries' initialisers, loading, planning, MPI's start-up) is a stop
// like any other (the run ends at its first step boundary, exit 0) rather than the default action
// (exit 143). The earliest moment is the executable's .preinit_array, which runs before any
// library's initialiser: there a handler only notes the signal; main then installs the real ones
// (the command line's --stop-signals, else the default) and hands a noted signal on to them.
constexpr int kDefaultStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
volatile std::sig_atomic_t g_early_signal = 0;

void note_early_signal(int sig) { g_early_signal = sig; }

bool is_train(int argc, char ** argv) { return argc >= 2 && argv && argv[1] && std::string(argv[1]) == "train"; }

void preinit(int argc, char ** argv, char **) {
    if (!is_train(argc, argv)) return;
    struct sigaction sa {};
    sa.sa_handler = note_early_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kDefaultStopSignals) sigaction(sig, &sa, nullptr);
}
[[gnu::used, gnu::section(".preinit_array")]] void (*const kPreinit)(int, char **, char **) = preinit;

void take_stop_signals_early(int argc, char ** argv) {
    if (!is_train(argc, argv)) return;
    std::string csv = memfit::TrainOptions{}.stop_signals;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--stop-signals" && i + 1 < argc) csv = argv[i + 1];
        else if (a.rfind("--stop-signals=", 0) == 0) csv = a.substr(15);
    }
    std::vector<int> signals;
    try {
        signals = memfit::parse_stop_signals(csv);
    } catch (const memfit::Error &) {
        signals.assign(std::begin(kDefaultStopSignals), std::end(kDefaultStopSignals));   // the flag's check reports it
    }
    for (int sig : kDefaultStopSignals)
        if (std::find(signals.begin(), signals.end(), sig) == signals.end()) std::signal(sig, SIG_DFL);
    memfit::install_stop_handlers(signals);
    // Tests only: a stop signal as the run starts (before the trainer has done anything).
    if (const char * s = std::getenv("MEMFIT_TEST_SIGNAL_AT_START"); s && std::string(s) == "TERM") g_early_signal = SIGTERM;
    if (const int sig = g_early_signal) ::kill(::getpid(), sig);   // to the waiting thread, or the default action
}

// Every help opens with its usage line ("Usage: memfit plan [OPTIONS]"), then the description;
// CLI11's order is the other way round. --help-all's sections (mode Sub) keep CLI11's layout.
class UsageFirst final : public CLI::Formatter {
public:
    std::string make_help(const CLI::App * app, std::string name, CLI::AppFormatMode mode) const override {
        if (mode == CLI::AppFormatMode::Sub) return CLI::Formatter::make_help(app, name, mode);
        return make_usage(app, name) + "\n" + make_description(app) + make_positionals(app) + make_groups(app, mode) +
               make_subcommands(app, mode) + "\n" + make_footer(app);
    }
};

}  // namespace

int main(int argc, char ** argv) {
    // A closed pipe (`memfit train | head`) makes writes fail instead of killing the run.
    std::signal(SIGPIPE, SIG_IGN);
    // So does a file-size limit (ulimit -f): an error line instead of a killed run.
    std::signal(SIGXFSZ, SIG_IGN);
    take_stop_signals_early(argc, argv);
    // A closed standard stream (`memfit train >&-`) would be the next file opened (metrics.jsonl
    // taking fd 1 and filling with progress text): point it at /dev/null first.
    for (int fd = 0; fd <= 2; ++fd)
        if (::fcntl(fd, F_GETFD) == -1 && ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) return 1;
    // The name makes the help's usage lines "Usage: memfit [OPTIONS] SUBCOMMAND", "Usage: memfit plan ...".
    CLI::App app{"memfit: train transformer language models inside a memory budget", "memfit"};
    app.formatter(std::make_shared<UsageFirst>());   // before the subcommands, which take it from app
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every command");
    app.set_version_flag("--version", memfit::cli::version_text,
                         "the version, the git revision and build type, the CPU features and CUDA devices found");
    memfit::cli::add_data_commands(app);
    memfit::cli::add_train_commands(app);
    memfit::cli::add_model_commands(app);
    memfit::cli::add_generate_command(app);
    memfit::cli::add_plan_commands(app);
    memfit::cli::add_quant_commands(app);
    try {
        // --config FILE: the file's flags join the command line's (cli/config_file.h).
        std::vector<std::string> args = memfit::cli::expand_config(app, std::vector<std::string>(argv, argv + argc));
        args.erase(args.begin());
        std::reverse(args.begin(), args.end());   // CLI11 takes a vector last argument first
        app.parse(args);
    } catch (const CLI::CallForHelp & e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp & e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion & e) {
        return app.exit(e);
    } catch (const CLI::ConversionError & e) {
        // CLI11's "Could not convert: --steps = 1e30": the flag, the value and what it takes.
        std::string what = e.what();
        const std::string prefix = "Could not convert: ";
        if (what.rfind(prefix, 0) == 0) {
            const std::string rest = what.substr(prefix.size());
            const size_t eq = rest.find(" = ");
            if (eq != std::string::npos)
                what = rest.substr(0, eq) + " " + rest.substr(eq + 3) +
                       ": not a value this flag takes (counts and sizes are whole numbers up to 2147483647)";
        }
        std::fprintf(stderr, "memfit: error: %s (see memfit --help)\n", what.c_str());
        return 2;
    } catch (const CLI::ParseError & e) {
        std::fprintf(stderr, "memfit: error: %s (see memfit --help)\n", e.what());
        return 2;
    } catch (const memfit::Error & e) {
        std::fprintf(stderr, "memfit: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc &) {
        // Only a run's batch and sequence make its host memory; other commands name what they read.
        const auto cmds = app.get_subcommands();
        const std::string cmd = cmds.empty() ? "" : cmds.front()->get_name();
        if (cmd == "train" || cmd == "profile" || cmd == "bench")
            std::fprintf(stderr, "memfit: error: out of host memory; lower --batch or --seq, or set --memory-budget\n");
        else
            std::fprintf(stderr, "memfit: error: out of host memory in memfit %s (an input too large for this "
                                 "machine's memory; see docs/reliability.md for the limits memfit sets)\n", cmd.c_str());
        return 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "memfit: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
