// memfit: train, plan and profile transformer language models inside a memory budget.
#include <fcntl.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "core/error.h"

int main(int argc, char ** argv) {
    // A closed pipe (`memfit train | head`) makes writes fail instead of killing the run.
    std::signal(SIGPIPE, SIG_IGN);
    // So does a file-size limit (ulimit -f): an error line instead of a killed run.
    std::signal(SIGXFSZ, SIG_IGN);
    // A closed standard stream (`memfit train >&-`) would be the next file opened (metrics.jsonl
    // taking fd 1 and filling with progress text): point it at /dev/null first.
    for (int fd = 0; fd <= 2; ++fd)
        if (::fcntl(fd, F_GETFD) == -1 && ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) return 1;
    CLI::App app{"memfit: train transformer language models inside a memory budget"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every command");
    memfit::cli::add_data_commands(app);
    memfit::cli::add_train_commands(app);
    memfit::cli::add_model_commands(app);
    memfit::cli::add_plan_commands(app);
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
    } catch (const CLI::ParseError & e) {
        std::fprintf(stderr, "memfit: error: %s (see memfit --help)\n", e.what());
        return 2;
    } catch (const memfit::Error & e) {
        std::fprintf(stderr, "memfit: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "memfit: error: out of host memory; lower --batch or --seq, or set --memory-budget\n");
        return 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "memfit: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
