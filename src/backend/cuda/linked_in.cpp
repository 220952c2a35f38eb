// Compiled into the executables that link the CUDA backend in rather than load it as a plug-in
// (the CUDA tests; the emulator's memfit_emu and tests): registers its entry points at start-up,
// so cuda_plugin_entry finds them here and loads nothing (backend/cuda_plugin.h).
#include <cstring>
#include <string>

#include "backend/cuda_plugin.h"

namespace memfit {
class Backend;
class Communicator;
}  // namespace memfit

extern "C" {
memfit::Backend * memfit_cuda_make_backend(int index);
int memfit_cuda_device_count(std::string * why);
memfit::Communicator * memfit_cuda_make_communicator(memfit::Communicator & host, memfit::Backend & backend);
}

namespace {

void * linked_entry(const char * name) {
    struct Entry {
        const char * name;
        void * fn;
    };
    static const Entry kEntries[] = {
        {"memfit_cuda_make_backend", reinterpret_cast<void *>(&memfit_cuda_make_backend)},
        {"memfit_cuda_device_count", reinterpret_cast<void *>(&memfit_cuda_device_count)},
        {"memfit_cuda_make_communicator", reinterpret_cast<void *>(&memfit_cuda_make_communicator)},
    };
    for (const Entry & e : kEntries)
        if (std::strcmp(e.name, name) == 0) return e.fn;
    return nullptr;
}

[[maybe_unused]] const bool kLinked = (memfit::link_cuda_plugin(&linked_entry), true);

}  // namespace
