#include "data/data_loader.h"

#include "core/error.h"

#include <fmt/format.h>

#include <random>
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

DataLoader::DataLoader(const std::string & path, int B, int T, uint64_t seed)
    : file_(path), B_(B), T_(T), seed_(seed) {
    if (B <= 0 || T <= 0) {
        throw ConfigError(fmt::format("batch size {} and sequence length {} must both be positive", B, T));
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

void DataLoader::start_epoch(uint64_t epoch) {
    epoch_ = epoch;
    cursor_ = 0;
    order_ = epoch_order(num_windows_, seed_, epoch);
}

void DataLoader::seek(uint64_t epoch, size_t cursor) {
    if (cursor > num_windows_) {
        throw ConfigError(fmt::format("{}: cannot resume at window {} of epoch {}: an epoch has only {} windows; "
                                      "was the checkpoint made with other data or --batch/--seq?",
                                      file_.path(), cursor, epoch, num_windows_));
    }
    if (cursor == num_windows_) { start_epoch(epoch + 1); return; }
    if (epoch != epoch_ || order_.size() != num_windows_) start_epoch(epoch);
    cursor_ = cursor;
}

void DataLoader::next(int32_t * inputs, int32_t * targets) {
    const auto T = static_cast<uint64_t>(T_);
    const uint32_t vocab = file_.vocab_size();
    for (int b = 0; b < B_; ++b) {
        if (cursor_ == num_windows_) start_epoch(epoch_ + 1);
        const uint64_t start = order_[cursor_++] * T;
        int32_t * in = inputs + static_cast<size_t>(b) * T;
        int32_t * tg = targets + static_cast<size_t>(b) * T;
        for (uint64_t t = 0; t <= T; ++t) {
            const int32_t tok = file_.token(start + t);
            if (tok < 0 || static_cast<uint32_t>(tok) >= vocab) {
                throw FormatError(fmt::format("{}: token {} at position {} is >= vocab_size {}; the file is "
                                              "corrupt, re-run `memfit prepare`",
                                              file_.path(), static_cast<uint32_t>(tok), start + t, vocab));
            }
            if (t < T) in[t] = tok;
            if (t > 0) tg[t - 1] = tok;
        }
    }
    if (cursor_ == num_windows_) start_epoch(epoch_ + 1);  // so epoch()/cursor() name the next window
}

}  // namespace memfit
