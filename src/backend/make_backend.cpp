#include "backend/make_backend.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_plugin.h"
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
    if (device == "cuda") {   // the CUDA plug-in, loaded now (backend/cuda_plugin.h)
        std::string why;
        using Make = Backend * (*)(int);
        const auto make = reinterpret_cast<Make>(cuda_plugin_entry("memfit_cuda_make_backend", &why));
        if (!make) throw ConfigError("--device cuda: " + why);
        return std::unique_ptr<Backend>(make(index));
    }
    throw ConfigError("--device " + device + ": unknown device; use cpu or cuda");
}

uint64_t default_budget(const Backend & backend, uint64_t processes) {
    return backend.host_memory() ? available_memory() / std::max<uint64_t>(1, processes) : backend.device_free();
}

}  // namespace memfit
