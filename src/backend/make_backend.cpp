#include "backend/make_backend.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#ifdef MEMFIT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/error.h"
#include "memory/budget.h"

namespace memfit {

bool cuda_built() {
#ifdef MEMFIT_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string & device, int index) {
    if (device == "cpu") return std::make_unique<CpuBackend>();
    if (device == "cuda") {
#ifdef MEMFIT_HAVE_CUDA
        return std::make_unique<CudaBackend>(index);
#else
        (void) index;
        throw ConfigError("--device cuda: this memfit was built without CUDA (nvcc was not found when it was "
                          "configured); rebuild with CUDA installed, or -DMEMFIT_CUDA=ON");
#endif
    }
    throw ConfigError("--device " + device + ": unknown device; use cpu or cuda");
}

uint64_t default_budget(const Backend & backend, uint64_t processes) {
    return backend.host_memory() ? available_memory() / std::max<uint64_t>(1, processes) : backend.device_free();
}

}  // namespace memfit
