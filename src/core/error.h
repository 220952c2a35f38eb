// Errors, in three tiers:
//   1. broken invariants abort with file and line:      MF_ASSERT(cond), MF_UNREACHABLE()
//   2. vendor calls go through one checked macro per library (see backend/cpu/dnnl_check.h)
//   3. expected failures (bad config, missing file, corrupt data, a plan that does not fit)
//      throw a typed memfit::Error whose message carries the numbers and a hint; the CLI prints
//      it as one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace memfit {

// Base of every expected failure. what() is one line: what happened, the numbers, a hint.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string & msg) : std::runtime_error(msg) {}
};

class ConfigError : public Error { using Error::Error; };  // bad flag, config, preset
class IoError     : public Error { using Error::Error; };  // missing/unreadable/unwritable file
class FormatError : public Error { using Error::Error; };  // corrupt or malformed file contents
class CommError   : public Error { using Error::Error; };  // a collective failed: a peer rank died or the transport broke

[[noreturn]] void abort_with(const char * file, int line, const char * what);

}  // namespace memfit

#define MF_ASSERT(cond) \
    do { if (!(cond)) ::memfit::abort_with(__FILE__, __LINE__, "assertion failed: " #cond); } while (0)
#define MF_UNREACHABLE() ::memfit::abort_with(__FILE__, __LINE__, "unreachable")
