// `memfit prepare` as a library call: tokenize a text file into <out_dir>/train.bin, val.bin and
// meta.json. `memfit train` calls it when its data folder is missing.
#pragma once

#include <cstdint>
#include <string>

namespace memfit {

struct PrepareOptions {
    std::string input;               // text file; empty = data_dir() + "/tinyshakespeare.txt"
    std::string out_dir;             // empty = default_prepared_dir(tokenizer)
    std::string tokenizer = "gpt2";  // gpt2 | bytes | sentencepiece:PATH | PATH/tokenizer.model
    double val_fraction = 0.1;       // the last this-fraction of the tokens is validation, in (0, 1)
    std::string tokenizer_dir;       // folder holding gpt2-bpe/; empty = data_dir()
};

struct PreparedData {
    std::string train_path, val_path, meta_path;
    std::string tokenizer;
    uint32_t vocab_size = 0;
    uint64_t train_tokens = 0, val_tokens = 0;
    uint64_t input_bytes = 0;
    double seconds = 0;              // wall time of the whole preparation
};

// "runs/data-<tokenizer>" for gpt2 and bytes; for a SentencePiece model "runs/data-sp-<8 hex digits>",
// a hash of the model file's absolute path (so "sentencepiece:PATH" and a relative PATH agree).
std::string default_prepared_dir(const std::string & tokenizer);

// Errors: missing/unreadable input or unwritable out_dir -> IoError; empty input, bad
// val_fraction, a split that leaves train or val empty, unknown tokenizer -> ConfigError.
PreparedData prepare_dataset(const PrepareOptions & opts);

}  // namespace memfit
