// memfit prepare, memfit tokenize.
#include "cli/commands.h"

#include "cli/validators.h"
#include "core/error.h"
#include "core/paths.h"
#include "tokenizer/tokenizer.h"
#include "data/prepare.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

namespace memfit::cli {

void add_data_commands(CLI::App & app) {
    // prepare
    {
        auto opts = std::make_shared<PrepareOptions>();
        CLI::App * sub = app.add_subcommand(
            "prepare", "Tokenize a text file, or JSON lines of instruction data, into train.bin, val.bin and "
                       "meta.json for `memfit train`");
        sub->add_option("--input", opts->input,
                        "Text or JSON lines file to tokenize (default: the bundled tinyshakespeare.txt)");
        sub->add_option("--format", opts->format,
                        "text, jsonl (one record per line: {\"messages\": [{\"role\", \"content\"}, ...]}, "
                        "{\"prompt\", \"completion\"}, ShareGPT's conversations or Alpaca's instruction/input/"
                        "output; the loss counts only the assistant's turns or the completion), preference (DPO "
                        "pairs, TRL's forms: {\"prompt\", \"chosen\", \"rejected\"} as strings or lists of messages, "
                        "or {\"chosen\", \"rejected\"} messages whose common first messages are the prompt; never "
                        "chosen by auto), or auto (jsonl for .jsonl and .json inputs)")
            ->capture_default_str()->check(CLI::IsMember({"auto", "text", "jsonl", "preference"}));
        sub->add_option("--chat-template", opts->chat_template,
                        "jsonl, preference: how conversations become text: auto (the chat_template of the "
                        "tokenizer_config.json beside --tokenizer), chatml, llama3, mistral (memfit's own), a Jinja "
                        "file, or none")
            ->capture_default_str();
        sub->add_option("--out", opts->out_dir,
                        "Output folder (default: runs/data-<tokenizer>, or runs/data-sp-<hash> for SentencePiece, "
                        "runs/data-hf-<hash> for a tokenizer.json)")->check(kPath);
        sub->add_option("--tokenizer", opts->tokenizer, std::string("Tokenizer: ") + tokenizer_kinds())
            ->capture_default_str();
        sub->add_option("--val-fraction", opts->val_fraction,
                        "Fraction of the tokens, taken from the end, kept for validation")
            ->capture_default_str();
        sub->callback([opts] {
            const PreparedData r = prepare_dataset(*opts);
            if (r.preference)
                fmt::print("prepared {} preference pairs ({} of {} records left out: a side without a trained token) "
                           "with chat template {}: {} tokens ({} train + {} val), {} of them trained, ",
                           r.pairs, r.skipped, r.records, r.chat_template, r.train_tokens + r.val_tokens,
                           r.train_tokens, r.val_tokens, r.trained_tokens);
            else if (r.documents)
                fmt::print("prepared {} records ({} left out: no trained token) with chat template {}: {} tokens "
                           "({} train + {} val), {} of them trained, ",
                           r.records, r.skipped, r.chat_template, r.train_tokens + r.val_tokens, r.train_tokens,
                           r.val_tokens, r.trained_tokens);
            else
                fmt::print("prepared {} tokens ({} train + {} val) ", r.train_tokens + r.val_tokens, r.train_tokens,
                           r.val_tokens);
            fmt::print("from {} bytes, {} vocab {}, in {:.2f} s: {}, {}, {}\n", r.input_bytes, r.tokenizer,
                       r.vocab_size, r.seconds, r.train_path, r.val_path, r.meta_path);
        });
    }

    // tokenize
    {
        auto kind = std::make_shared<std::string>("gpt2");
        CLI::App * sub = app.add_subcommand(
            "tokenize", "Tokenize standard input and print the token ids as a JSON array on one line");
        sub->add_option("--tokenizer", *kind, std::string("Tokenizer: ") + tokenizer_kinds())->capture_default_str();
        sub->callback([kind] {
            const auto tok = make_tokenizer(*kind, data_dir());
            std::cin >> std::noskipws;
            const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
            if (std::cin.bad()) throw IoError("standard input: read failed");
            const auto ids = tok->encode(text);
            std::string out = "[";
            for (size_t i = 0; i < ids.size(); ++i) {
                if (i) out += ',';
                out += std::to_string(ids[i]);
            }
            out += "]\n";
            std::fwrite(out.data(), 1, out.size(), stdout);
            std::fflush(stdout);
        });
    }
}

}  // namespace memfit::cli
