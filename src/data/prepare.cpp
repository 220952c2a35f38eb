#include "data/prepare.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/paths.h"
#include "core/units.h"
#include "data/instruct.h"
#include "data/token_file.h"
#include "tokenizer/tokenizer.h"

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

void make_out_dir(const std::string & out_dir) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec || !fs::is_directory(out_dir)) {
        throw IoError(fmt::format("{}: cannot create output folder: {}; pass a writable --out", out_dir,
                                  ec ? ec.message() : std::string("exists and is not a folder")));
    }
}

std::string absolute_source(const std::string & input) {
    std::error_code ec;
    if (auto abs = fs::absolute(input, ec); !ec) return abs.lexically_normal().string();
    return input;
}

// text, jsonl or preference: what `--format` names, auto choosing between the first two by the
// input's name (preference data looks like jsonl's, so it is only ever asked for).
std::string input_format(const PrepareOptions & opts, const std::string & input) {
    if (opts.format == "jsonl" || opts.format == "text" || opts.format == "preference") return opts.format;
    if (opts.format != "auto")
        throw ConfigError(fmt::format("--format '{}': expected text, jsonl, preference or auto", opts.format));
    return input.ends_with(".jsonl") || input.ends_with(".json") ? "jsonl" : "text";
}

// One record (one line: a conversation, a prompt and completion): past this it is refused with
// its line number rather than rendered (a conversation's rendering is linear in its turns, so the
// bound is memory, not time).
constexpr size_t kMaxRecordBytes = size_t(64) << 20;

// The (line number, text) of the non-blank lines of a JSON lines file.
std::vector<std::pair<size_t, std::string_view>> record_lines(const std::string & text) {
    std::vector<std::pair<size_t, std::string_view>> lines;
    size_t at = 0, line = 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        ++line;
        const std::string_view l(text.data() + at, end - at);
        if (l.find_first_not_of(" \t\r") != std::string_view::npos) lines.emplace_back(line, l);
        at = end + 1;
    }
    return lines;
}

// How many of the n records go to validation: the last val_fraction of them, at least one, and
// at least one left for training.
size_t validation_records(size_t n, double val_fraction, const std::string & input) {
    const auto n_val = static_cast<size_t>(std::max<long long>(1, std::llround(double(n) * val_fraction)));
    if (n < 2 || n_val >= n)
        throw ConfigError(fmt::format("{}: {} records with --val-fraction {} leave {} for training and {} for "
                                      "validation; both need at least one: use more records or another "
                                      "--val-fraction", input, n, val_fraction, n - std::min(n_val, n), n_val));
    return n_val;
}

// One line's record, parsed (ConfigError naming `where` for a record too large or not JSON).
nlohmann::ordered_json parse_record(std::string_view line, const std::string & where) {
    if (line.size() > kMaxRecordBytes)
        throw ConfigError(fmt::format("{}: a record of {} is more than the {} memfit prepares as one example; "
                                      "split the conversation", where, format_bytes(line.size()),
                                      format_bytes(kMaxRecordBytes)));
    try {
        return parse_ordered_json(line, where);
    } catch (const FormatError & e) {
        const std::string what = e.what();
        throw ConfigError(what.find("not valid JSON") != std::string::npos
                              ? what + "; expected one JSON object per line" : what);
    }
}

// A progress line on stderr every few seconds of a long input.
class Progress {
public:
    void at(size_t i, size_t n) {
        const auto now = std::chrono::steady_clock::now();
        if (now - shown_ <= std::chrono::seconds(3)) return;
        std::fprintf(stderr, "prepare: %zu of %zu records (%.0f%%), %.0f s\n", i, n, 100.0 * double(i) / double(n),
                     std::chrono::duration<double>(now - t0_).count());
        shown_ = now;
    }

private:
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now(), shown_ = t0_;
};

// One split's documents, as write_document_file takes them.
struct DocumentSplit {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> offsets{0};
    std::vector<uint8_t> mask;

    size_t documents() const { return offsets.size() - 1; }
    void add(const Example & ex) {
        tokens.insert(tokens.end(), ex.tokens.begin(), ex.tokens.end());
        mask.insert(mask.end(), ex.trained.begin(), ex.trained.end());
        offsets.push_back(tokens.size());
    }
};

uint64_t trained_count(const Example & ex) {
    return uint64_t(std::count(ex.trained.begin(), ex.trained.end(), uint8_t{1}));
}

void write_splits(const std::string & out_dir, const DocumentSplit & train, const DocumentSplit & val,
                  const ChatFormat & fmt_, PreparedData & r) {
    make_out_dir(out_dir);
    write_document_file(r.train_path, train.tokens, train.offsets, train.mask, r.vocab_size, fmt_.pad_id);
    write_document_file(r.val_path, val.tokens, val.offsets, val.mask, r.vocab_size, fmt_.pad_id);
    r.train_tokens = train.tokens.size();
    r.val_tokens = val.tokens.size();
    r.documents = true;
    r.chat_template = fmt_.chat ? fmt_.name : "none";
}

// The records of JSON lines file `input` (read as `what`, `hint` when it cannot be), each parsed
// and handed to f(record, "FILE line N", the split it goes to), with a progress line.
template <class F>
void each_record(const PrepareOptions & opts, const std::string & input, const char * what, const char * hint,
                 DocumentSplit & train, DocumentSplit & val, PreparedData & r, F && f) {
    const std::string text = read_whole_file(input, what, hint);
    r.input_bytes = text.size();
    const auto lines = record_lines(text);
    const size_t n = lines.size();
    const size_t n_val = validation_records(n, opts.val_fraction, input);
    Progress progress;
    for (size_t i = 0; i < n; ++i) {
        const std::string where = fmt::format("{} line {}", input, lines[i].first);
        progress.at(i, n);
        f(parse_record(lines[i].second, where), where, i + n_val < n ? train : val);
    }
}

// Instruction data: one document per record (data/instruct.h), written as document files.
void prepare_jsonl(const PrepareOptions & opts, const std::string & input, const std::string & out_dir,
                   const Tokenizer & tok, PreparedData & r) {
    const ChatFormat fmt_ = load_chat_format(opts.tokenizer, tok, opts.chat_template);
    DocumentSplit train, val;
    each_record(opts, input, "a JSON lines file", "pass --input with one JSON object per line", train, val, r,
                [&](const nlohmann::ordered_json & rec, const std::string & where, DocumentSplit & split) {
                    const Example ex = encode_record(rec, fmt_, tok, where);
                    const uint64_t trained = trained_count(ex);
                    if (trained == 0) {
                        ++r.skipped;
                        return;
                    }
                    split.add(ex);
                    r.trained_tokens += trained;
                    ++r.records;
                });
    if (train.documents() == 0 || val.documents() == 0)
        throw ConfigError(fmt::format("{}: after leaving out the {} records without a trained token, the {} "
                                      "split is empty; check the records' assistant turns or completions",
                                      input, r.skipped, train.documents() == 0 ? "training" : "validation"));
    write_splits(out_dir, train, val, fmt_, r);
}

// Preference data (DPO): each record's chosen and rejected sides as two consecutive documents,
// chosen first, so that the data loader's pairs mode (data/data_loader.h) batches them together.
void prepare_preference(const PrepareOptions & opts, const std::string & input, const std::string & out_dir,
                        const Tokenizer & tok, PreparedData & r) {
    const ChatFormat fmt_ = load_chat_format(opts.tokenizer, tok, opts.chat_template);
    DocumentSplit train, val;
    each_record(opts, input, "a JSON lines file of preference pairs",
                "pass --input with one {\"prompt\", \"chosen\", \"rejected\"} per line", train, val, r,
                [&](const nlohmann::ordered_json & rec, const std::string & where, DocumentSplit & split) {
                    const PreferencePair p = encode_preference(rec, fmt_, tok, where);
                    ++r.records;
                    // DPO compares the two sides' log-probabilities of their answers: a side without
                    // an answer token has nothing to compare.
                    const uint64_t chosen = trained_count(p.chosen), rejected = trained_count(p.rejected);
                    if (chosen == 0 || rejected == 0) {
                        ++r.skipped;
                        return;
                    }
                    split.add(p.chosen);
                    split.add(p.rejected);
                    r.trained_tokens += chosen + rejected;
                    ++r.pairs;
                });
    if (train.documents() == 0 || val.documents() == 0)
        throw ConfigError(fmt::format("{}: after leaving out the {} pairs with a side without a trained token, the "
                                      "{} split is empty; check that both answers of each pair are non-empty "
                                      "completions or assistant turns", input, r.skipped,
                                      train.documents() == 0 ? "training" : "validation"));
    write_splits(out_dir, train, val, fmt_, r);
    r.preference = true;
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
    PreparedData r;
    r.train_path = out_dir + "/train.bin";
    r.val_path = out_dir + "/val.bin";
    r.meta_path = out_dir + "/meta.json";
    r.tokenizer = tok->name();
    r.vocab_size = static_cast<uint32_t>(tok->vocab_size());
    if (const std::string format = input_format(opts, input); format != "text") {
        if (format == "preference") prepare_preference(opts, input, out_dir, *tok, r);
        else prepare_jsonl(opts, input, out_dir, *tok, r);
        nlohmann::json meta = {
            {"tokenizer", r.tokenizer},   {"vocab_size", r.vocab_size},     {"source", absolute_source(input)},
            {"format", format},           {"chat_template", r.chat_template}, {"records", r.records},
            {"skipped", r.skipped},       {"trained_tokens", r.trained_tokens}, {"train_tokens", r.train_tokens},
            {"val_tokens", r.val_tokens},
        };
        if (r.preference) meta["pairs"] = r.pairs;
        write_text_atomic(r.meta_path, meta.dump(2) + "\n");
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return r;
    }

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
    make_out_dir(out_dir);
    r.train_tokens = n_train;
    r.val_tokens = n_val;
    r.input_bytes = text.size();

    const std::span<const int32_t> all(ids);
    write_token_file(r.train_path, all.first(n_train), r.vocab_size);
    write_token_file(r.val_path, all.subspan(n_train), r.vocab_size);

    const nlohmann::json meta = {
        {"tokenizer", r.tokenizer},
        {"vocab_size", r.vocab_size},
        {"source", absolute_source(input)},
        {"format", "text"},
        {"train_tokens", r.train_tokens},
        {"val_tokens", r.val_tokens},
    };
    write_text_atomic(r.meta_path, meta.dump(2) + "\n");

    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

std::string prepared_format(const std::string & meta_path) {
    const nlohmann::json meta = read_json_file(meta_path);
    if (!meta.is_object() || !meta.contains("format") || !meta["format"].is_string()) return "";
    return meta["format"].get<std::string>();
}

}  // namespace memfit
