// The CUDA backend as a plug-in: libmemfit_cuda.so (the CUDA kernels, cuBLASLt, NCCL and the CUDA
// runtime behind them), loaded on the first `--device cuda` or device query, so that a run on the
// CPU never maps the CUDA libraries (their pages and their start-up allocations: 150 MiB of RSS).
//
// The plug-in exports C entry points, found by name (docs/design.md, "The CUDA plug-in"):
//   memfit_cuda_make_backend         Backend * (int index)               make_backend("cuda")
//   memfit_cuda_device_count         int (std::string * why)             memfit --version
//   memfit_cuda_make_communicator    Communicator * (Communicator & host, Backend &)   NCCL
//   memfit_cuda_plugin_interface     int ()                              == kCudaPluginInterface
// It is found at MEMFIT_CUDA_PLUGIN when set, else beside the executable. Executables that link
// the backend in instead (the CUDA tests, the emulator's memfit_emu) register its entry points
// at start-up with link_cuda_plugin (src/backend/cuda/linked_in.cpp), and nothing is loaded.
#pragma once

#include <string>

namespace memfit {

// The entry points' version: a plug-in that answers another (a stale libmemfit_cuda.so beside a
// newer memfit) is refused with that said. Bump it when an entry point's signature changes.
constexpr int kCudaPluginInterface = 1;

// Resolves an entry point's name to its address (nullptr: no such entry).
using CudaEntryTable = void * (*)(const char * name);

// An executable with the CUDA backend linked in: its entry points, used instead of loading one.
void link_cuda_plugin(CudaEntryTable table);

// The plug-in's entry `name`, loading the plug-in on the first call. nullptr when this build has
// no CUDA backend or the plug-in cannot be loaded, with the reason in *why (one line: the path
// tried and the loader's message) when why is given.
void * cuda_plugin_entry(const char * name, std::string * why = nullptr);

// Where the plug-in is looked for: MEMFIT_CUDA_PLUGIN, else libmemfit_cuda.so beside this
// executable (the build folder, where CMake puts both).
std::string cuda_plugin_path();

// Whether the CUDA libraries are mapped into this process: a loaded plug-in or a linked-in one.
bool cuda_plugin_active();

}  // namespace memfit
