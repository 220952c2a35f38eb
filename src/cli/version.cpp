#include "cli/version.h"

#include <string>

#include <fmt/format.h>

#include "backend/cuda_plugin.h"
#include "memfit_git_revision.h"   // generated in the build folder (CMakeLists.txt)

namespace memfit::cli {

namespace {

const char * yes_no(bool b) { return b ? "yes" : "no"; }

// What this CPU has, asked at run time.
std::string cpu_line() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // amx: the tile registers and their bf16 products, what oneDNN's bf16 gemms use.
    const bool amx = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16");
    return fmt::format("cpu: x86-64, avx2 {}, avx512f {}, avx512_bf16 {}, amx {}",
                       yes_no(__builtin_cpu_supports("avx2")), yes_no(__builtin_cpu_supports("avx512f")),
                       yes_no(__builtin_cpu_supports("avx512bf16")), yes_no(amx));
#elif defined(__aarch64__)
    return "cpu: aarch64 (features not probed)";
#else
    return "cpu: not x86-64 (features not probed)";
#endif
}

// What the compiler was allowed to use: -march, and the features it implies.
std::string build_line() {
    const std::string march = MEMFIT_MARCH;
    std::string used;
    auto add = [&](bool on, const char * name) {
        if (on) used += used.empty() ? name : std::string(", ") + name;
    };
#ifdef __AVX2__
    add(true, "avx2");
#endif
#ifdef __AVX512F__
    add(true, "avx512f");
#endif
#ifdef __AVX512BF16__
    add(true, "avx512_bf16");
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    add(true, "amx");
#endif
    return fmt::format("build: {} (kernels compiled with {})",
                       march.empty() ? std::string("the compiler's default -march") : "-march=" + march,
                       used.empty() ? std::string("none of avx2, avx512f, avx512_bf16, amx") : used);
}

std::string cuda_line() {
#ifdef MEMFIT_HAVE_CUDA
    std::string why;
    using Count = int (*)(std::string *);
    const auto count = reinterpret_cast<Count>(cuda_plugin_entry("memfit_cuda_device_count", &why));
    if (!count) return fmt::format("cuda: on (CUDA backend built, not loadable: {})", why);
    const int n = count(&why);
    if (n == 0) return fmt::format("cuda: on (CUDA backend built; 0 devices visible: {})", why);
    return fmt::format("cuda: on (CUDA backend built; {} device{} visible)", n, n == 1 ? "" : "s");
#else
    return "cuda: off (built without CUDA)";
#endif
}

}  // namespace

std::string version_text() {
    return fmt::format("memfit {} ({}, {})\n{}\n{}\n{}", MEMFIT_VERSION, MEMFIT_GIT_REVISION, MEMFIT_BUILD_TYPE,
                       cpu_line(), build_line(), cuda_line());
}

}  // namespace memfit::cli
