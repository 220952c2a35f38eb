// Stop signals: the names parse (or are refused by name), the first signal only asks, and a
// second one ends the process at once with 128 + its number.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/stop_request.h"
#include "core/error.h"

namespace memfit {
namespace {

TEST(StopRequest, SignalNamesParse) {
    EXPECT_EQ(parse_stop_signals("TERM,INT,USR1"), (std::vector<int>{SIGTERM, SIGINT, SIGUSR1}));
    EXPECT_EQ(parse_stop_signals("SIGUSR2,HUP"), (std::vector<int>{SIGUSR2, SIGHUP}));
    EXPECT_TRUE(parse_stop_signals("none").empty());
    EXPECT_THROW(parse_stop_signals("TERM,KILL"), ConfigError);   // SIGKILL cannot be caught
    EXPECT_THROW(parse_stop_signals(""), ConfigError);
    EXPECT_EQ(stop_signal_list("TERM,USR1"), "SIGTERM, SIGUSR1");
}

TEST(StopRequest, FirstSignalAsksSecondExits) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        reset_stop_request();
        install_stop_handlers({SIGUSR2});
        // Process-directed, as `kill` and schedulers send them: the waiting thread takes it.
        kill(getpid(), SIGUSR2);
        for (int i = 0; i < 2000 && !stop_requested(); ++i) usleep(1000);
        if (!stop_requested() || stop_signal_name() != "SIGUSR2" || seconds_since_stop_request() < 0) _exit(1);
        kill(getpid(), SIGUSR2);   // exits there
        for (int i = 0; i < 2000; ++i) usleep(1000);
        _exit(2);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 128 + SIGUSR2);
}

}  // namespace
}  // namespace memfit
