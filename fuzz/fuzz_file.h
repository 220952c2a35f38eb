// The fuzz targets whose reader takes a path: the input written as NAME in a per-process folder
// under /tmp (made once). Returns the file's path, or "" when it cannot be written.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

inline std::string write_fuzz_input(const std::string & tag, const std::string & name, const void * data, size_t size) {
    const std::string dir = "/tmp/memfit_fuzz_" + tag + "." + std::to_string(getpid());
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = dir + "/" + name;
    std::FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) return "";
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
    return path;
}
