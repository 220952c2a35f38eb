// The plug-in library's own entry (only libmemfit_cuda.so and libmemfit_cuda_emu.so compile it):
// the interface version the loader checks before it uses any other entry (backend/cuda_plugin.h).
#include "backend/cuda_plugin.h"

extern "C" int memfit_cuda_plugin_interface() { return memfit::kCudaPluginInterface; }
