// libFuzzer target: the tokenizer_config.json reader (tokenizer/tokenizer_config.h) on arbitrary
// bytes, written as DIR/tokenizer_config.json in a per-process folder (no chat_template.jinja
// beside it). Every input must give a config or memfit::Error; a config's chat template is then
// compiled, as loading a chat format does (rendering it is fuzz_chat_template's part). Anything
// else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string path = write_fuzz_input("tc", "tokenizer_config.json", data, size);
    if (path.empty()) return 0;
    try {
        const memfit::TokenizerConfig c = memfit::read_tokenizer_config(path);
        if (!c.chat_template.empty()) (void) memfit::ChatTemplate(c.chat_template);
    } catch (const memfit::Error &) {}
    return 0;
}
