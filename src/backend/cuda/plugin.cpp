// The CUDA plug-in's entry points of the backend (backend/cuda_plugin.h lists them all; the NCCL
// communicator's is comm/nccl_plugin.cpp). C names, so the loader finds them with dlsym.
#include <string>

#include "backend/cuda/cuda_backend.h"

extern "C" {

memfit::Backend * memfit_cuda_make_backend(int index) { return new memfit::CudaBackend(index); }

int memfit_cuda_device_count(std::string * why) { return memfit::cuda_device_count(why); }

}  // extern "C"
