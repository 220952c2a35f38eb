// libFuzzer target: the Hugging Face config.json parser on arbitrary bytes. Every input must give a
// validated ModelConfig or memfit::Error; anything else is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const std::string path = "/tmp/memfit_fuzz_cfg." + std::to_string(getpid()) + ".json";
    std::FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
        memfit::ModelConfig c = memfit::load_hf_config(path);
        c.validate();
        (void) c.num_params();
    } catch (const memfit::Error &) {}
    return 0;
}
