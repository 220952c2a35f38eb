// The backend a run asks for by name (`--device cpu|cuda`).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace memfit {

// "cpu" (the default) or "cuda" (device `index`: under mpirun, the rank's local index modulo
// the devices). ConfigError for other names, for cuda in a build without CUDA, and where no
// CUDA device is present.
std::unique_ptr<Backend> make_backend(const std::string & device, int index = 0);

// Whether this build has the CUDA backend (CMake option MEMFIT_CUDA).
bool cuda_built();

}  // namespace memfit
