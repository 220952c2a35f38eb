// Where memfit finds its bundled data (tokenizer files, the Shakespeare corpus):
// $MEMFIT_DATA_DIR if set, else the data/ folder of the source tree it was built from.
#pragma once

#include <string>

namespace memfit {

std::string data_dir();

// The whole file at `path`. IoError, one line: missing (with `missing_hint`), a folder (expected
// `what`), unreadable, or a failed read.
std::string read_whole_file(const std::string & path, const std::string & what, const std::string & missing_hint);

}  // namespace memfit
