#include "data/prepare.h"

#include "core/error.h"
#include "core/paths.h"
#include "tokenizer/tokenizer.h"
#include "data/token_file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <system_error>

namespace memfit {

namespace fs = std::filesystem;

namespace {


void write_text_atomic(const std::string & path, const std::string & text) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw IoError(fmt::format("{}: cannot create; check the folder is writable", tmp));
        out << text;
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            throw IoError(fmt::format("{}: write failed; check free disk space", tmp));
        }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        std::remove(tmp.c_str());
        throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, ec.message()));
    }
}

}  // namespace

std::string default_prepared_dir(const std::string & tokenizer) {
    const std::string sp = sentencepiece_model_path(tokenizer);
    const bool hf = sp.empty() && tokenizer.size() > 5 && tokenizer.ends_with(".json");   // tokenizer.json
    if (sp.empty() && !hf) return "runs/data-" + tokenizer;
    const std::string file = hf ? fs::absolute(tokenizer).lexically_normal().string() : sp;
    uint32_t h = 2166136261u;                                // FNV-1a: stable across runs and builds
    for (const char c : file) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
    return fmt::format("runs/data-{}-{:08x}", hf ? "hf" : "sp", h);
}

PreparedData prepare_dataset(const PrepareOptions & opts) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string input = opts.input.empty() ? data_dir() + "/tinyshakespeare.txt" : opts.input;
    const std::string out_dir = opts.out_dir.empty() ? default_prepared_dir(opts.tokenizer) : opts.out_dir;
    const std::string tok_dir = opts.tokenizer_dir.empty() ? data_dir() : opts.tokenizer_dir;

    if (!(opts.val_fraction > 0.0 && opts.val_fraction < 1.0)) {
        throw ConfigError(fmt::format("--val-fraction {} is out of range; it must be strictly between 0 and 1 "
                                      "(e.g. 0.1)", opts.val_fraction));
    }
    auto tok = make_tokenizer(opts.tokenizer, tok_dir);     // before reading: fail fast on a bad kind

    const std::string text = read_whole_file(input, "a text file", "pass --input with a text file to tokenize");
    if (text.empty()) throw ConfigError(fmt::format("{} is empty: nothing to tokenize", input));

    const std::vector<int32_t> ids = tok->encode(text);
    const uint64_t n = ids.size();
    const auto n_val = static_cast<uint64_t>(std::llround(static_cast<double>(n) * opts.val_fraction));
    if (n_val == 0 || n_val >= n) {
        throw ConfigError(fmt::format("{}: {} tokens with --val-fraction {} leave {} train and {} validation "
                                      "tokens; both must be non-empty: use more text or another --val-fraction",
                                      input, n, opts.val_fraction, n - std::min(n_val, n), n_val));
    }
    const uint64_t n_train = n - n_val;

    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec || !fs::is_directory(out_dir)) {
        throw IoError(fmt::format("{}: cannot create output folder: {}; pass a writable --out", out_dir,
                                  ec ? ec.message() : std::string("exists and is not a folder")));
    }

    PreparedData r;
    r.train_path = out_dir + "/train.bin";
    r.val_path = out_dir + "/val.bin";
    r.meta_path = out_dir + "/meta.json";
    r.tokenizer = tok->name();
    r.vocab_size = static_cast<uint32_t>(tok->vocab_size());
    r.train_tokens = n_train;
    r.val_tokens = n_val;
    r.input_bytes = text.size();

    const std::span<const int32_t> all(ids);
    write_token_file(r.train_path, all.first(n_train), r.vocab_size);
    write_token_file(r.val_path, all.subspan(n_train), r.vocab_size);

    std::string source = input;
    if (auto abs = fs::absolute(input, ec); !ec) source = abs.lexically_normal().string();
    const nlohmann::json meta = {
        {"tokenizer", r.tokenizer},
        {"vocab_size", r.vocab_size},
        {"source", source},
        {"train_tokens", r.train_tokens},
        {"val_tokens", r.val_tokens},
    };
    write_text_atomic(r.meta_path, meta.dump(2) + "\n");

    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

}  // namespace memfit
