// Writing a whole file so that readers see the old contents or the new, never a torn mix:
// write PATH.tmp, flush, fsync, rename over PATH.
#pragma once

#include <string>
#include <string_view>

namespace memfit {

// Throws IoError (naming the file, with a hint) when it cannot create, write or rename; the
// temporary file is removed on failure.
void write_file_atomic(const std::string & path, std::string_view contents);

// fsyncs a directory, so renames inside it are durable. IoError if it cannot be opened.
void fsync_dir(const std::string & dir);

}  // namespace memfit
