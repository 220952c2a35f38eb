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

// The memory a run on `backend` may plan for when no --memory-budget is given: on the host, what
// the system has available, shared by the `processes` of this machine; on a device, what is free
// once its runtime has started.
uint64_t default_budget(const Backend & backend, uint64_t processes = 1);

// Whether this build has the CUDA backend (CMake option MEMFIT_CUDA).
bool cuda_built();

}  // namespace memfit
