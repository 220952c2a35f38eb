#include "backend/make_backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef MEMFIT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/error.h"

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
        std::string why;
        const int n = cuda_device_count(&why);
        if (n == 0) throw ConfigError("--device cuda: no CUDA device (" + why + "); train on the CPU (the default)");
        return std::make_unique<CudaBackend>(index % n);
#else
        (void) index;
        throw ConfigError("--device cuda: this memfit was built without CUDA (nvcc was not found when it was "
                          "configured); rebuild with CUDA installed, or -DMEMFIT_CUDA=ON");
#endif
    }
    throw ConfigError("--device " + device + ": unknown device; use cpu or cuda");
}

}  // namespace memfit
