#include "comm/device_communicator.h"

#include <string>

#include "backend/cuda_plugin.h"
#include "core/error.h"

namespace memfit {

std::unique_ptr<Communicator> make_device_communicator(Communicator & host, Backend & backend) {
    if (backend.host_memory() || host.size() == 1) return nullptr;
    // The NCCL communicator, from the CUDA plug-in that made `backend` (backend/cuda_plugin.h).
    std::string why;
    using Make = Communicator * (*)(Communicator &, Backend &);
    const auto make = reinterpret_cast<Make>(cuda_plugin_entry("memfit_cuda_make_communicator", &why));
    if (!make) throw Error("the NCCL communicator: " + why);
    return std::unique_ptr<Communicator>(make(host, backend));
}

}  // namespace memfit
