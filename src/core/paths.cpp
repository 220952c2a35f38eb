#include "core/paths.h"

#include <cstdlib>

namespace memfit {

std::string data_dir() {
    if (const char * env = std::getenv("MEMFIT_DATA_DIR"); env && *env) return env;
    return std::string(MEMFIT_SOURCE_DIR) + "/data";
}

}  // namespace memfit
