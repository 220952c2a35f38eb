#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

void write_file_atomic(const std::string & path, std::string_view contents) {
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        throw IoError(fmt::format("{}: cannot create ({}); check the folder exists and is writable", tmp,
                                  std::strerror(errno)));
    auto fail = [&](const char * what) {
        const int err = errno;
        ::close(fd);
        std::remove(tmp.c_str());
        throw IoError(fmt::format("{}: {} failed ({}); check free disk space", tmp, what, std::strerror(err)));
    };
    size_t done = 0;
    while (done < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("write");
        }
        done += size_t(n);
    }
    if (::fsync(fd) != 0) fail("fsync");
    ::close(fd);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
    }
}

void fsync_dir(const std::string & dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) throw IoError(fmt::format("cannot open directory {}: {}", dir, std::strerror(errno)));
    ::fsync(fd);
    ::close(fd);
}

}  // namespace memfit
