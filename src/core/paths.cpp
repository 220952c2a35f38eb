#include "core/paths.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"

#include <cstdlib>

namespace memfit {

std::string data_dir() {
    if (const char * env = std::getenv("MEMFIT_DATA_DIR"); env && *env) return env;
    return std::string(MEMFIT_SOURCE_DIR) + "/data";
}

std::string read_whole_file(const std::string & path, const std::string & what, const std::string & missing_hint) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw IoError(fmt::format("{}: no such file; {}", path, missing_hint));
    if (std::filesystem::is_directory(path, ec))
        throw IoError(fmt::format("{}: is a folder, expected {}", path, what));
    // A pipe or a device (/dev/zero) never ends or blocks: only a file whose size is known.
    if (!std::filesystem::is_regular_file(path, ec))
        throw IoError(fmt::format("{}: not a regular file (a pipe or a device?), expected {}", path, what));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(fmt::format("{}: cannot open for reading; check its permissions", path));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw IoError(fmt::format("{}: read failed", path));
    return ss.str();
}

}  // namespace memfit
