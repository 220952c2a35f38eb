// Unicode normalisation for tokenizers whose files ask for it (tokenizer.json's "NFC"), by ICU.
#pragma once

#include <string>
#include <string_view>

namespace memfit {

// The NFC form of UTF-8 `text`. Text that is not valid UTF-8 comes back unchanged, so a
// tokenizer that normalises stays lossless on arbitrary bytes.
std::string nfc(std::string_view text);

}  // namespace memfit
