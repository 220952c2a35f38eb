// `memfit prepare` as a library call: tokenize a text file, or JSON lines of instruction data
// (data/instruct.h), into <out_dir>/train.bin, val.bin and meta.json. `memfit train` calls it
// when its data folder is missing.
#pragma once

#include <cstdint>
#include <string>

namespace memfit {

struct PrepareOptions {
    std::string input;               // text file; empty = data_dir() + "/tinyshakespeare.txt"
    std::string out_dir;             // empty = default_prepared_dir(tokenizer)
    std::string tokenizer = "gpt2";  // gpt2 | bytes | sentencepiece:PATH | PATH/tokenizer.model
    double val_fraction = 0.1;       // the last this-fraction of the tokens (records) is validation, in (0, 1)
    std::string tokenizer_dir;       // folder holding gpt2-bpe/; empty = data_dir()
    // text | jsonl | preference | auto (jsonl for an input ending in .jsonl or .json; never
    // preference). jsonl writes document files (token file version 2), one document per record,
    // the last val_fraction of the records (at least one) for validation. preference (DPO: records
    // of data/instruct.h's encode_preference) writes each pair k as documents 2k (chosen) and
    // 2k+1 (rejected), the last val_fraction of the pairs (at least one) for validation.
    std::string format = "auto";
    std::string chat_template = "auto";   // load_chat_format's choice (data/instruct.h)
};

struct PreparedData {
    std::string train_path, val_path, meta_path;
    std::string tokenizer;
    uint32_t vocab_size = 0;
    uint64_t train_tokens = 0, val_tokens = 0;
    uint64_t input_bytes = 0;
    double seconds = 0;              // wall time of the whole preparation
    // jsonl: records written (train + val), records without a trained token (left out), the
    // trained tokens (train + val) and the template used ("none" when none).
    bool documents = false;
    uint64_t records = 0, skipped = 0, trained_tokens = 0;
    std::string chat_template;
    // preference: the pairs written (train + val; two documents each); `records` is then every
    // record read (pairs + skipped), `skipped` the pairs left out (a side without a trained token).
    bool preference = false;
    uint64_t pairs = 0;
};

// "runs/data-<tokenizer>" for gpt2 and bytes; for a SentencePiece model "runs/data-sp-<8 hex digits>",
// a hash of the model file's absolute path (so "sentencepiece:PATH" and a relative PATH agree).
std::string default_prepared_dir(const std::string & tokenizer);

// Errors: missing/unreadable input or unwritable out_dir -> IoError; empty input, bad
// val_fraction, a split that leaves train or val empty, unknown tokenizer -> ConfigError.
PreparedData prepare_dataset(const PrepareOptions & opts);

// The "format" a prepared folder's meta.json names ("text", "jsonl", "preference"), so that the
// trainer can tell preference pairs from other documents; "" when meta.json has no "format"
// string. IoError when the file cannot be read,
// FormatError when it is not JSON.
std::string prepared_format(const std::string & meta_path);

}  // namespace memfit
