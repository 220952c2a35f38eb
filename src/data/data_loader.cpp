#include "data/data_loader.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>

namespace memfit {

namespace {

// Uniform draw in [0, bound] from a 64-bit generator, by rejection (no modulo bias, and unlike
// std::uniform_int_distribution the same on every standard library).
uint64_t draw_upto(std::mt19937_64 & rng, uint64_t bound) {
    if (bound == UINT64_MAX) return rng();
    const uint64_t range = bound + 1;
    const uint64_t limit = UINT64_MAX - (UINT64_MAX % range);  // accept draws below a multiple of range
    uint64_t x;
    do { x = rng(); } while (x >= limit);
    return x % range;
}

}  // namespace

std::vector<uint64_t> DataLoader::epoch_order(uint64_t num_windows, uint64_t seed, uint64_t epoch) {
    std::vector<uint64_t> order(num_windows);
    for (uint64_t i = 0; i < num_windows; ++i) order[i] = i;
    std::mt19937_64 rng(seed + epoch);
    for (uint64_t i = num_windows; i > 1; --i) {
        const uint64_t j = draw_upto(rng, i - 1);
        std::swap(order[i - 1], order[j]);
    }
    return order;
}

DataLoader::DataLoader(const std::string & path, int B, int T, uint64_t seed, bool packing, bool pairs)
    : file_(path), B_(B), T_(T), seed_(seed), packing_(packing), pairs_(pairs) {
    if (B <= 0 || T <= 0) {
        throw ConfigError(fmt::format("batch size {} and sequence length {} must both be positive", B, T));
    }
    if (pairs) {
        if (!file_.documents())
            throw ConfigError(fmt::format("{} holds text, not preference pairs; prepare them with `memfit prepare "
                                          "--format preference`", path));
        if (packing)
            throw ConfigError("--packing: preference pairs are rows of their own (DPO compares a pair's chosen and "
                              "rejected rows); leave --packing out");
        if (B % 2 != 0)
            throw ConfigError(fmt::format("batch of {} rows: a batch of B rows holds B/2 pairs (chosen, rejected); "
                                          "B must be even (2, 4, ...)", B));
        if (file_.num_docs() % 2 != 0)
            throw FormatError(fmt::format("{}: {} documents, an odd number, but preference data holds pairs as "
                                          "consecutive documents (chosen, rejected); re-run `memfit prepare --format "
                                          "preference`", path, file_.num_docs()));
    }
    if (packing && !file_.documents())
        throw ConfigError(fmt::format("--packing: {} holds text, which trains in windows of one stream already; "
                                      "packing is for instruction data (memfit prepare --format jsonl)", path));
    if (file_.documents()) {
        lay_out_documents(T);
        start_epoch(0);
        return;
    }
    const uint64_t n = file_.size();
    if (n < static_cast<uint64_t>(T) + 1) {
        throw ConfigError(fmt::format("{}: {} tokens, fewer than one window of T+1 = {}; use a smaller --seq "
                                      "or more data", path, n, static_cast<uint64_t>(T) + 1));
    }
    num_windows_ = static_cast<size_t>((n - 1) / static_cast<uint64_t>(T));
    if (num_windows_ < static_cast<size_t>(B)) {
        throw ConfigError(fmt::format("{}: {} tokens make {} windows of {}+1 tokens, fewer than the batch "
                                      "size {}; use a smaller --batch or --seq, or more data",
                                      path, n, num_windows_, T, B));
    }
    start_epoch(0);
}

// Preference pair d, d+1: how many of the prompt's first tokens both sides leave out so that
// their longer side fits T+1 tokens, at most all but the prompt's last (the first answer token
// needs one before it), the prompt being the tokens before either side's first trained target.
uint64_t DataLoader::prompt_cut(uint64_t d, uint64_t cap) const {
    uint64_t over = 0, prompt = UINT64_MAX;
    for (uint64_t k = 0; k < 2; ++k) {
        const uint64_t b = file_.doc_begin(d + k), len = file_.doc_end(d + k) - b;
        over = std::max(over, len > cap + 1 ? len - cap - 1 : 0);
        uint64_t first = 1;   // the first trained token (a target: never token 0)
        while (first < len && !file_.trained(b + first)) ++first;
        prompt = std::min(prompt, first);
    }
    return prompt == UINT64_MAX || prompt < 1 ? 0 : std::min(over, prompt - 1);
}

// Each document's (input, target) pairs within its first T+1 tokens, for those with a trained
// target there; with pairs, both sides of the pairs whose sides both have one, each pair's
// prompt cut from its start as far as prompt_cut() says.
std::vector<std::pair<uint64_t, uint64_t>> DataLoader::kept_documents(int T) {
    const auto cap = static_cast<uint64_t>(T);
    std::vector<std::pair<uint64_t, uint64_t>> kept;   // (pairs, document)
    stats_.documents = file_.num_docs();
    const uint64_t group = pairs_ ? 2 : 1;             // documents kept or dropped together
    if (pairs_) cut_.assign(file_.num_docs(), 0);
    for (uint64_t d = 0; d < file_.num_docs(); d += group) {
        uint64_t pairs[2] = {0, 0}, trained[2] = {0, 0};
        bool keep = true;
        const uint64_t cut = pairs_ ? prompt_cut(d, cap) : 0;
        if (cut > 0) stats_.prompt_cut += group;
        for (uint64_t k = 0; k < group; ++k) {
            if (pairs_) cut_[d + k] = cut;
            const uint64_t b = file_.doc_begin(d + k) + cut, len = file_.doc_end(d + k) - b;
            pairs[k] = len < 2 ? 0 : std::min(len - 1, cap);
            if (len > cap + 1) ++stats_.truncated;
            for (uint64_t p = 0; p < pairs[k]; ++p) trained[k] += file_.trained(b + p + 1) ? 1 : 0;
            keep = keep && trained[k] > 0;
        }
        if (!keep) {
            stats_.dropped += group;
            continue;
        }
        for (uint64_t k = 0; k < group; ++k) {
            kept.emplace_back(pairs[k], d + k);
            stats_.pairs += pairs[k];
            stats_.trained += trained[k];
        }
    }
    if (kept.empty() && pairs_)
        throw ConfigError(fmt::format("{}: none of its {} preference pairs has a trained token on both sides within "
                                      "--seq {} + 1 tokens; check the data's answers, or raise --seq",
                                      file_.path(), stats_.documents / 2, T));
    if (kept.empty())
        throw ConfigError(fmt::format("{}: none of its {} documents has a trained token within --seq {} + 1 tokens; "
                                      "check the data's responses, or raise --seq", file_.path(), stats_.documents, T));
    return kept;
}

void DataLoader::lay_out_documents(int T) {
    const auto cap = static_cast<uint64_t>(T);
    std::vector<std::pair<uint64_t, uint64_t>> kept = kept_documents(T);
    if (!packing_) {
        for (const auto & [pairs, d] : kept) {
            row_at_.push_back(row_docs_.size());
            row_docs_.push_back(d);
        }
    } else {
        // Best fit decreasing: each document, longest first, into the open row with the least room
        // that takes it (the earliest such row), else a new row.
        std::stable_sort(kept.begin(), kept.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
        std::vector<std::vector<uint64_t>> rows;
        std::set<std::pair<uint64_t, uint64_t>> room;     // (free pairs, row)
        for (const auto & [pairs, d] : kept) {
            auto it = room.lower_bound({pairs, 0});
            uint64_t r = rows.size();
            uint64_t left = cap;
            if (it != room.end()) {
                r = it->second;
                left = it->first;
                room.erase(it);
            } else {
                rows.emplace_back();
            }
            rows[r].push_back(d);
            if (left - pairs > 0) room.insert({left - pairs, r});
        }
        for (const auto & r : rows) {
            row_at_.push_back(row_docs_.size());
            row_docs_.insert(row_docs_.end(), r.begin(), r.end());
        }
    }
    row_at_.push_back(row_docs_.size());
    num_windows_ = row_at_.size() - 1;   // fewer rows than B: a batch runs into the next epoch's
}

int32_t DataLoader::checked(uint64_t i) const {
    const int32_t tok = file_.token(i);
    if (tok < 0 || static_cast<uint32_t>(tok) >= file_.vocab_size()) {
        throw FormatError(fmt::format("{}: token {} at position {} is >= vocab_size {}; the file is corrupt, re-run "
                                      "`memfit prepare`", file_.path(), static_cast<uint32_t>(tok), i,
                                      file_.vocab_size()));
    }
    return tok;
}

// Window w into one row: text, its T+1 tokens; documents, each document's pairs in turn, then padding.
void DataLoader::fill_window(size_t w, int32_t * in, int32_t * tg, int32_t * ds) const {
    const auto T = static_cast<uint64_t>(T_);
    if (!file_.documents()) {
        const uint64_t start = uint64_t(w) * T;
        for (uint64_t t = 0; t <= T; ++t) {
            const int32_t tok = checked(start + t);
            if (t < T) in[t] = tok;
            if (t > 0) tg[t - 1] = tok;
        }
        if (ds) std::fill(ds, ds + T, 0);
        return;
    }
    uint64_t at = 0;
    for (uint64_t k = row_at_[w]; k < row_at_[w + 1]; ++k) {
        const uint64_t d = row_docs_[k], b = file_.doc_begin(d) + (pairs_ ? cut_[d] : 0);
        const uint64_t pairs = std::min(file_.doc_end(d) - b - 1, T);
        for (uint64_t p = 0; p < pairs; ++p) {
            in[at + p] = checked(b + p);
            tg[at + p] = file_.trained(b + p + 1) ? checked(b + p + 1) : -100;
            if (ds) ds[at + p] = static_cast<int32_t>(at);
        }
        at += pairs;
    }
    for (uint64_t t = at; t < T; ++t) {   // padding: a document of its own, never trained
        in[t] = file_.pad_id();
        tg[t] = -100;
        if (ds) ds[t] = static_cast<int32_t>(at);
    }
}

void DataLoader::start_epoch(uint64_t epoch) {
    epoch_ = epoch;
    cursor_ = 0;
    if (!pairs_) {
        order_ = epoch_order(num_windows_, seed_, epoch);
        return;
    }
    // The pairs are shuffled, each staying two windows in a row: chosen, then rejected.
    const std::vector<uint64_t> pairs = epoch_order(num_windows_ / 2, seed_, epoch);
    order_.resize(num_windows_);
    for (size_t i = 0; i < pairs.size(); ++i) {
        order_[2 * i] = 2 * pairs[i];
        order_[2 * i + 1] = 2 * pairs[i] + 1;
    }
}

void DataLoader::seek(uint64_t epoch, size_t cursor) {
    if (cursor > num_windows_) {
        throw ConfigError(fmt::format("{}: cannot resume at window {} of epoch {}: an epoch has only {} windows; "
                                      "was the checkpoint made with other data or --batch/--seq?",
                                      file_.path(), cursor, epoch, num_windows_));
    }
    if (pairs_ && cursor % 2 != 0) {
        throw ConfigError(fmt::format("{}: cannot resume at window {} of epoch {}: with preference pairs the cursor "
                                      "counts rows two per pair, so it is even; was the checkpoint made with other "
                                      "data?", file_.path(), cursor, epoch));
    }
    if (cursor == num_windows_) { start_epoch(epoch + 1); return; }
    if (epoch != epoch_ || order_.size() != num_windows_) start_epoch(epoch);
    cursor_ = cursor;
}

void DataLoader::next(int32_t * inputs, int32_t * targets, int32_t * doc_start, uint64_t * windows) {
    const auto T = static_cast<size_t>(T_);
    for (int b = 0; b < B_; ++b) {
        if (cursor_ == num_windows_) start_epoch(epoch_ + 1);
        const size_t row = static_cast<size_t>(b) * T;
        const uint64_t w = order_[cursor_++];
        if (windows) windows[b] = w;
        fill_window(w, inputs + row, targets + row, doc_start ? doc_start + row : nullptr);
    }
    if (cursor_ == num_windows_) start_epoch(epoch_ + 1);  // so epoch()/cursor() name the next window
}

void DataLoader::fill_windows(size_t first, int n, int32_t * inputs, int32_t * targets, int32_t * doc_start) const {
    MF_ASSERT(n >= 0 && first + static_cast<size_t>(n) <= num_windows_);
    const auto T = static_cast<size_t>(T_);
    for (int r = 0; r < n; ++r) {
        const size_t row = static_cast<size_t>(r) * T;
        fill_window(first + static_cast<size_t>(r), inputs + row, targets + row, doc_start ? doc_start + row : nullptr);
    }
}

}  // namespace memfit
