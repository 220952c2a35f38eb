// Where memfit finds its bundled data (tokenizer files, the Shakespeare corpus):
// $MEMFIT_DATA_DIR if set, else the data/ folder of the source tree it was built from.
#pragma once

#include <string>

namespace memfit {

std::string data_dir();

}  // namespace memfit
