// What the command-line tests share: running the memfit binary with arguments (stdout and stderr
// captured), a scratch folder per test process, a small text, and "one clear line" failures.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cli_test {

namespace fs = std::filesystem;

// A whole file's text ("" when it cannot be read).
inline std::string slurp(const fs::path & p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct CmdResult {
    int code = -1;
    std::string err;   // stderr
    std::string out;   // stdout
};

// memfit ARGS, from the folder `cwd` when one is given (commands with relative paths).
inline CmdResult run_memfit(const std::string & args, const fs::path & cwd = {}) {
    // CTest runs tests in parallel processes: keep each process's files apart.
    const fs::path dir = fs::temp_directory_path() / ("memfit_cli_test." + std::to_string(getpid()));
    fs::create_directories(dir);
    const std::string err_file = (dir / "stderr.txt").string(), out_file = (dir / "stdout.txt").string();
    const std::string cd = cwd.empty() ? std::string() : "cd '" + cwd.string() + "' && ";
    const std::string cmd = cd + std::string(MEMFIT_BINARY) + " " + args + " >" + out_file + " 2>" + err_file;
    const int status = std::system(cmd.c_str());
    CmdResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.err = slurp(err_file);
    r.out = slurp(out_file);
    return r;
}

inline fs::path scratch(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_cli_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    fs::create_directories(p.parent_path());
    return p;
}

// One line, naming the problem, no crash.
inline void expect_clean_failure(const CmdResult & r, const std::string & needle) {
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_LT(r.code, 128) << "killed by a signal: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("memfit: error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

// The commands of a documentation page's code block: the block whose first line starts with
// `first`, up to its closing fence, lines joined where they end in a backslash.
inline std::vector<std::string> doc_commands(const fs::path & page, const std::string & first) {
    std::istringstream in(slurp(page));
    std::vector<std::string> cmds;
    std::string line;
    bool inside = false;
    while (std::getline(in, line)) {
        if (!inside) {
            inside = line.starts_with(first);
            if (!inside) continue;
        }
        if (line.starts_with("```")) break;
        if (!cmds.empty() && cmds.back().ends_with("\\")) cmds.back() = cmds.back().substr(0, cmds.back().size() - 1) + line;
        else cmds.push_back(line);
    }
    return cmds;
}

inline fs::path small_text(const std::string & name) {
    const fs::path p = scratch(name);
    std::ifstream src(std::string(MEMFIT_DATA_DIR) + "/tinyshakespeare.txt");
    std::string text(20000, '\0');
    src.read(text.data(), std::streamsize(text.size()));
    std::ofstream(p) << text;
    return p;
}

}  // namespace cli_test
