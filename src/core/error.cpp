#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace memfit {

void abort_with(const char * file, int line, const char * what) {
    std::fprintf(stderr, "memfit: internal error at %s:%d: %s\n", file, line, what);
    std::abort();
}

}  // namespace memfit
