// The CUDA plug-in's entry point of the NCCL communicator (backend/cuda_plugin.h lists them all).
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl_communicator.h"

extern "C" memfit::Communicator * memfit_cuda_make_communicator(memfit::Communicator & host,
                                                                 memfit::Backend & backend) {
    auto & cuda = dynamic_cast<memfit::CudaBackend &>(backend);
    std::unique_ptr<memfit::Communicator> comm = memfit::make_nccl_communicator(host, cuda.stream());
    cuda.remeasure_runtime();   // NCCL's buffers are the runtime's too
    return comm.release();
}
