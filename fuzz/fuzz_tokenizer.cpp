// libFuzzer target: the Hugging Face tokenizer.json reader (tokenizer/hf_tokenizer.h) on arbitrary
// bytes, written as DIR/tokenizer.json in a per-process folder (no tokenizer_config.json beside
// it). Every input must give a tokenizer or memfit::Error; a tokenizer then encodes and decodes a
// fixed text (added tokens, NFC, the pre-tokenisation regexes, the merges, the ByteLevel decoder).
// Anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string path = write_fuzz_input("tok", "tokenizer.json", data, size);
    if (path.empty()) return 0;
    try {
        const memfit::ByteLevelBpe tok(memfit::read_tokenizer_json(path));
        const std::string text = "Hello, world! <|endoftext|>  caf\xc3\xa9 e\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd 1234\n\t"
                                 "it's \xff\xfe<|im_start|>user\n";
        (void) tok.decode(tok.encode(text));
        (void) tok.vocab_size();
    } catch (const memfit::Error &) {}
    return 0;
}
