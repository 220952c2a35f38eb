// What memfit uses of a Hugging Face tokenizer_config.json: the special tokens, whether an
// encode adds them, and the chat template (chat_template.h).
//   bos_token, eos_token, pad_token  a string, null, or an AddedToken object {"content": ...}
//                                    (DeepSeek's form, with or without "__type"); "" when
//                                    absent or null
//   add_bos_token, add_eos_token     true, false or null; false when absent or null
//   chat_template                    a string, null, or a list of {"name", "template"} (the
//                                    one named "default"; "" when none is); a file
//                                    chat_template.jinja beside tokenizer_config.json takes
//                                    its place, as transformers reads it
// Other keys are not read.
#pragma once

#include <string>

namespace memfit {

struct TokenizerConfig {
    std::string bos_token, eos_token, pad_token;
    bool add_bos_token = false, add_eos_token = false;
    std::string chat_template;   // "" when there is none
};

// IoError when the file cannot be read; FormatError (one line naming the file and the field)
// when it is not JSON, not an object, or a field above has another type.
TokenizerConfig read_tokenizer_config(const std::string & path);

// The same from the file's text (`name` for messages).
TokenizerConfig parse_tokenizer_config(const std::string & text, const std::string & name);

}  // namespace memfit
