// Hugging Face tokenizer.json (the `tokenizers` library's file, as Llama 3, Qwen 2/2.5/3,
// GPT-NeoX and DeepSeek ship it), read into a byte-level BPE (bpe.h). Implemented:
//   normalizer     null, NFC, or a Sequence of those
//   pre_tokenizer  ByteLevel (use_regex: GPT-2's pattern), or a Sequence of Split (a Regex
//                  pattern, behavior Isolated, not inverted) ending in ByteLevel (use_regex false)
//   model          BPE over the ByteLevel alphabet: vocab, merges as "a b" strings or [a, b]
//                  pairs, ignore_merges (no dropout, byte fallback or subword affixes)
//   added_tokens   matched in the raw text before anything else (no lstrip, rstrip, single_word)
//   decoder        ByteLevel (or null)
// A component or option outside this list is one FormatError naming it. post_processor (the
// special tokens an encode with add_special_tokens adds) is not applied: encode is the text's
// tokens alone. The end-of-text id is tokenizer_config.json's eos_token (beside the file) when
// it names an added token, else <|endoftext|> or <|end_of_text|> if the file has one.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/bpe.h"

namespace memfit {

// True when `kind` names a tokenizer.json (a path ending in ".json").
bool is_tokenizer_json(const std::string & kind);

// The parts of the file at `path` (its name: the absolute path). IoError when it cannot be
// read, FormatError when it is not such a file or uses what is not implemented.
BpeParts read_tokenizer_json(const std::string & path);

}  // namespace memfit
