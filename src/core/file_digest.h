// A file's content digest: 64 bits over its bytes, read in 1 MiB pieces, for checkpoint files
// (meta.json records each file's, and loading compares). Catches changed, truncated and swapped
// files; not a cryptographic hash.
#pragma once

#include <string>

namespace memfit {

// 16 hex digits. IoError when the file cannot be read.
std::string file_digest(const std::string & path);

}  // namespace memfit
