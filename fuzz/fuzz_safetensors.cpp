// libFuzzer target: the safetensors reader on arbitrary bytes. Every input must either open and
// read back every tensor, or fail with memfit::Error; anything else (a crash, a sanitizer report,
// another exception) is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const std::string path = "/tmp/memfit_fuzz_st." + std::to_string(getpid()) + ".safetensors";
    std::FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
        const memfit::SafetensorsFile st = memfit::SafetensorsFile::open(path);
        for (const auto & name : st.names()) {
            const auto & info = st.info(name);
            try {
                if (info.dtype == "I32" || info.dtype == "I64") (void) st.read_i32(name);
                else (void) st.read_f32(name);
            } catch (const memfit::Error &) {}
        }
    } catch (const memfit::Error &) {}
    return 0;
}
