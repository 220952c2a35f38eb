// A content digest: 64 bits over a file's bytes, read in 1 MiB pieces, for checkpoint files
// (meta.json records each file's, and loading compares), or over bytes in memory (a LoRA run's
// base weights). Catches changed, truncated and swapped files; not a cryptographic hash.
#pragma once

#include <cstddef>
#include <string>

namespace memfit {

// 16 hex digits. IoError when the file cannot be read.
std::string file_digest(const std::string & path);
// A quick identity of a large file (its size and 16 evenly spaced 64 KiB blocks): different
// token files at the same path on two ranks. Not a content check (a change between the blocks
// passes). IoError when the file cannot be read.
std::string file_fingerprint(const std::string & path);
// The same digest of bytes in memory (equal to file_digest of a file holding them).
std::string bytes_digest(const void * data, size_t n);

}  // namespace memfit
