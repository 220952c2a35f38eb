// memfit prepare, memfit tokenize.
#include "cli/commands.h"

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
            "prepare", "Tokenize a text file into train.bin, val.bin and meta.json for `memfit train`");
        sub->add_option("--input", opts->input, "Text file to tokenize (default: the bundled tinyshakespeare.txt)");
        sub->add_option("--out", opts->out_dir,
                        "Output folder (default: runs/data-<tokenizer>, or runs/data-sp-<hash> for SentencePiece, "
                        "runs/data-hf-<hash> for a tokenizer.json)");
        sub->add_option("--tokenizer", opts->tokenizer, std::string("Tokenizer: ") + tokenizer_kinds())
            ->capture_default_str();
        sub->add_option("--val-fraction", opts->val_fraction,
                        "Fraction of the tokens, taken from the end, kept for validation")
            ->capture_default_str();
        sub->callback([opts] {
            const PreparedData r = prepare_dataset(*opts);
            fmt::print("prepared {} tokens ({} train + {} val) from {} bytes, {} vocab {}, in {:.2f} s: {}, {}, {}\n",
                       r.train_tokens + r.val_tokens, r.train_tokens, r.val_tokens, r.input_bytes, r.tokenizer,
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
