// `memfit --version`: what this binary is and what it can use here.
#pragma once

#include <string>

namespace memfit::cli {

// Lines, the last without a newline:
//   memfit <version> (<git revision>, <build type>)     e.g. memfit 0.9.0 (e6da51c, Release)
//   cpu: this machine's features the kernels can use    (avx2, avx512f, avx512_bf16, amx)
//   build: the -march target (CMake's MEMFIT_ARCH) and the features it compiled the kernels with
//   cuda: whether the CUDA backend is built, and how many devices this process sees
// The revision is HEAD's short hash when the binary was built, "-dirty" with uncommitted changes
// to tracked files, "unknown" outside a git work tree (cmake/git_revision.cmake).
std::string version_text();

}  // namespace memfit::cli
