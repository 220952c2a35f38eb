#include "backend/cuda_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

namespace memfit {

namespace {

struct Plugin {
    std::mutex mu;
    CudaEntryTable linked = nullptr;   // link_cuda_plugin's
    bool tried = false;                // dlopen attempted
    void * handle = nullptr;           // dlopen's
    std::string why;                   // why it is not loaded
};

Plugin & plugin() {
    static Plugin p;
    return p;
}

std::string exe_dir() {
    char buf[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return ".";
    return std::filesystem::path(std::string(buf, size_t(n))).parent_path().string();
}

// Under p.mu: dlopen once. RTLD_NOW: a missing symbol is one error here, not a crash mid-run.
void load(Plugin & p) {
    if (p.tried) return;
    p.tried = true;
#ifndef MEMFIT_HAVE_CUDA
    p.why = "this memfit was built without CUDA (nvcc was not found when it was configured); rebuild with CUDA "
            "installed, or -DMEMFIT_CUDA=ON";
#else
    const std::string path = cuda_plugin_path();
    p.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!p.handle) {
        const char * err = dlerror();
        p.why = std::string("cannot load the CUDA backend: ") + (err ? err : path + ": unknown error") +
                " (hint: build the target memfit_cuda_plugin beside memfit, or set MEMFIT_CUDA_PLUGIN to its path)";
        return;
    }
    using Interface = int (*)();
    const auto interface = reinterpret_cast<Interface>(dlsym(p.handle, "memfit_cuda_plugin_interface"));
    const int got = interface ? interface() : 0;
    if (got != kCudaPluginInterface) {
        p.why = fmt::format("the CUDA backend {} has interface {}, this memfit needs {} (hint: rebuild it with "
                            "memfit: cmake --build BUILD --target memfit_cuda_plugin)", path, got, kCudaPluginInterface);
        dlclose(p.handle);
        p.handle = nullptr;
    }
#endif
}

}  // namespace

void link_cuda_plugin(CudaEntryTable table) {
    Plugin & p = plugin();
    std::lock_guard<std::mutex> lock(p.mu);
    p.linked = table;
}

std::string cuda_plugin_path() {
    if (const char * env = std::getenv("MEMFIT_CUDA_PLUGIN"); env && *env) return env;
    return (std::filesystem::path(exe_dir()) / "libmemfit_cuda.so").string();
}

void * cuda_plugin_entry(const char * name, std::string * why) {
    Plugin & p = plugin();
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.linked) {
        void * f = p.linked(name);
        if (!f && why) *why = std::string("the linked-in CUDA backend has no entry ") + name;
        return f;
    }
    load(p);
    if (!p.handle) {
        if (why) *why = p.why;
        return nullptr;
    }
    void * f = dlsym(p.handle, name);
    if (!f && why) *why = cuda_plugin_path() + " has no entry " + name + " (a plug-in from another memfit build?)";
    return f;
}

bool cuda_plugin_active() {
    Plugin & p = plugin();
    std::lock_guard<std::mutex> lock(p.mu);
    return p.linked != nullptr || p.handle != nullptr;
}

}  // namespace memfit
