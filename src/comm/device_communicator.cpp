#include "comm/device_communicator.h"

#ifdef MEMFIT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl_communicator.h"
#endif

namespace memfit {

std::unique_ptr<Communicator> make_device_communicator(Communicator & host, Backend & backend) {
    if (backend.host_memory() || host.size() == 1) return nullptr;
#ifdef MEMFIT_HAVE_CUDA
    auto & cuda = dynamic_cast<CudaBackend &>(backend);
    auto comm = make_nccl_communicator(host, cuda.stream());
    cuda.remeasure_runtime();   // NCCL's buffers are the runtime's too
    return comm;
#else
    MF_UNREACHABLE();
#endif
}

}  // namespace memfit
