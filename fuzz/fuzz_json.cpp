// libFuzzer target: memfit's one reader of untrusted JSON (core/json_read.h) on arbitrary bytes.
// Every input must give a value or memfit::FormatError; a value is then copied, dumped and
// re-parsed (the recursive walks that a deep value used to overflow). Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/json_read.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string_view text(reinterpret_cast<const char *>(data), size);
    try {
        const nlohmann::json j = memfit::parse_json(text, "fuzz.json");
        const nlohmann::json copy = j;
        (void) memfit::parse_ordered_json(copy.dump(), "again.json");
    } catch (const memfit::FormatError &) {}
    return 0;
}
