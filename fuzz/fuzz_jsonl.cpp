// libFuzzer target: instruction records (data/instruct.h) on arbitrary bytes, read as `memfit
// prepare` reads a JSON lines file: each non-blank line parsed with parse_ordered_json, then
// encode_record with GPT-2's tokenizer and the built-in chatml format (load_chat_format, as
// prepare --tokenizer gpt2 --chat-template chatml). Every line must give an example (as many
// trained flags as tokens) or memfit::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_read.h"
#include "data/instruct.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const std::unique_ptr<memfit::Tokenizer> tok = memfit::make_tokenizer("gpt2", MEMFIT_SOURCE_DIR "/data");
    static const memfit::ChatFormat chatml = memfit::load_chat_format("gpt2", *tok, "chatml");
    const std::string_view text(reinterpret_cast<const char *>(data), size);
    size_t at = 0;
    while (at < text.size()) {   // the lines as prepare_jsonl splits them
        size_t end = text.find('\n', at);
        if (end == std::string_view::npos) end = text.size();
        const std::string_view line = text.substr(at, end - at);
        at = end + 1;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        try {
            const nlohmann::ordered_json rec = memfit::parse_ordered_json(line, "fuzz.jsonl line");
            const memfit::Example ex = memfit::encode_record(rec, chatml, *tok, "fuzz.jsonl line");
            if (ex.tokens.size() != ex.trained.size()) std::abort();   // the mask must match the tokens
        } catch (const memfit::Error &) {}
    }
    return 0;
}
