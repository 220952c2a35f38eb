#include "tokenizer/bpe.h"

#include "core/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <fstream>
#include <queue>
#include <sstream>

namespace memfit {

namespace {

// GPT-2's pre-tokenisation: contractions, letters, numbers, other symbols (each optionally after
// one space), whitespace not followed by a non-space, remaining whitespace.
constexpr const char * kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Words longer than this are encoded but not cached (they rarely repeat); the cache is dropped
// when it holds this many words, to bound its memory on huge inputs.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCacheEntries = size_t{1} << 20;

std::string read_whole_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw IoError(fmt::format("{}: cannot open tokenizer file; set MEMFIT_DATA_DIR to memfit's data folder",
                                  path));
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw IoError(fmt::format("{}: read failed", path));
    return ss.str();
}

// Decodes s (UTF-8, code points of GPT-2's byte alphabet) into raw bytes; false if s is not in
// that alphabet.
bool alphabet_to_bytes(std::string_view s, const std::vector<int> & cp_to_byte, std::string & out) {
    out.clear();
    size_t i = 0;
    while (i < s.size()) {
        const auto c0 = static_cast<unsigned char>(s[i]);
        uint32_t cp = 0;
        size_t len = 0;
        if (c0 < 0x80) { cp = c0; len = 1; }
        else if ((c0 & 0xE0) == 0xC0) { cp = c0 & 0x1F; len = 2; }
        else if ((c0 & 0xF0) == 0xE0) { cp = c0 & 0x0F; len = 3; }
        else return false;                                 // alphabet code points are < 0x800
        if (i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k) {
            const auto c = static_cast<unsigned char>(s[i + k]);
            if ((c & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (c & 0x3F);
        }
        if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
        out.push_back(static_cast<char>(cp_to_byte[cp]));
        i += len;
    }
    return true;
}

}  // namespace

struct Gpt2Bpe::Regex {
    pcre2_code * code = nullptr;
    ~Regex() { if (code) pcre2_code_free(code); }
};

const std::vector<uint32_t> & Gpt2Bpe::byte_to_codepoint() {
    static const std::vector<uint32_t> table = [] {
        std::vector<uint32_t> t(256);
        uint32_t next_extra = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            t[b] = printable ? b : next_extra++;
        }
        return t;
    }();
    return table;
}

Gpt2Bpe::Gpt2Bpe(const std::string & encoder_json, const std::string & vocab_bpe) {
    std::vector<int> cp_to_byte(512, -1);
    for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_codepoint()[b]] = b;

    // encoder.json: {"token in byte alphabet": id, ...}, ids 0..n-1.
    {
        const std::string text = read_whole_file(encoder_json);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::parse_error & e) {
            throw FormatError(fmt::format("{}: not valid JSON at byte {}; the GPT-2 encoder file is corrupt",
                                          encoder_json, e.byte));
        }
        if (!j.is_object() || j.empty()) {
            throw FormatError(fmt::format("{}: expected a JSON object mapping token strings to ids", encoder_json));
        }
        const size_t n = j.size();
        id_to_bytes_.assign(n, std::string());
        std::vector<bool> seen(n, false);
        bytes_to_id_.reserve(n);
        std::string bytes;
        for (const auto & [key, value] : j.items()) {
            if (!value.is_number_integer()) {
                throw FormatError(fmt::format("{}: id of token '{}' is not an integer", encoder_json, key));
            }
            const auto id = value.get<int64_t>();
            if (id < 0 || static_cast<size_t>(id) >= n || seen[static_cast<size_t>(id)]) {
                throw FormatError(fmt::format("{}: token '{}' has id {}; ids must be unique and in [0, {})",
                                              encoder_json, key, id, n));
            }
            if (!alphabet_to_bytes(key, cp_to_byte, bytes) || bytes.empty()) {
                throw FormatError(fmt::format("{}: token '{}' (id {}) is not written in GPT-2's byte alphabet",
                                              encoder_json, key, id));
            }
            seen[static_cast<size_t>(id)] = true;
            id_to_bytes_[static_cast<size_t>(id)] = bytes;
            if (!bytes_to_id_.emplace(bytes, static_cast<int32_t>(id)).second) {
                throw FormatError(fmt::format("{}: two tokens decode to the same bytes (second: '{}', id {})",
                                              encoder_json, key, id));
            }
        }
        for (int b = 0; b < 256; ++b) {
            auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
            if (it == bytes_to_id_.end()) {
                throw FormatError(fmt::format("{}: no token for the single byte {}; byte-level BPE needs all 256",
                                              encoder_json, b));
            }
            byte_id_[b] = it->second;
        }
        if (auto it = bytes_to_id_.find("<|endoftext|>"); it != bytes_to_id_.end()) eot_id_ = it->second;
    }

    // vocab.bpe: "#version: ..." then one merge "left right" per line, in rank order.
    {
        const std::string text = read_whole_file(vocab_bpe);
        std::istringstream lines(text);
        std::string line, left, right;
        int line_no = 0;
        int32_t rank = 0;
        merges_.reserve(id_to_bytes_.size());
        while (std::getline(lines, line)) {
            ++line_no;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty() || line.rfind("#version", 0) == 0) continue;
            const size_t sp = line.find(' ');
            if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
                line.find(' ', sp + 1) != std::string::npos) {
                throw FormatError(fmt::format("{}:{}: expected 'left right', got '{}'", vocab_bpe, line_no, line));
            }
            if (!alphabet_to_bytes(std::string_view(line).substr(0, sp), cp_to_byte, left) ||
                !alphabet_to_bytes(std::string_view(line).substr(sp + 1), cp_to_byte, right)) {
                throw FormatError(fmt::format("{}:{}: merge '{}' is not written in GPT-2's byte alphabet",
                                              vocab_bpe, line_no, line));
            }
            const auto l = bytes_to_id_.find(left);
            const auto r = bytes_to_id_.find(right);
            const auto m = bytes_to_id_.find(left + right);
            if (l == bytes_to_id_.end() || r == bytes_to_id_.end() || m == bytes_to_id_.end()) {
                throw FormatError(fmt::format("{}:{}: merge '{}' uses or makes a token missing from {}; "
                                              "the two files do not belong together",
                                              vocab_bpe, line_no, line, encoder_json));
            }
            const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
            merges_.emplace(key, Merge{rank, m->second});    // a repeated pair keeps its first rank
            ++rank;
        }
        if (rank == 0) throw FormatError(fmt::format("{}: no merges found", vocab_bpe));
    }

    re_ = std::make_unique<Regex>();
    int err = 0;
    PCRE2_SIZE err_off = 0;
    re_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (!re_->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        throw Error(fmt::format("PCRE2 cannot compile the GPT-2 pattern at offset {}: {}; "
                                "libpcre2-8 must be built with Unicode support",
                                err_off, reinterpret_cast<const char *>(msg)));
    }
    pcre2_jit_compile(re_->code, PCRE2_JIT_COMPLETE);      // optional speed-up; interpreter otherwise
}

Gpt2Bpe::~Gpt2Bpe() = default;

// Byte-pair merging of one word, exactly as GPT-2: take the lowest-ranked adjacent pair, merge all
// its occurrences left to right, repeat. Symbols form a linked list; every adjacent pair that has a
// rank sits in a min-heap keyed (rank, position). A round pops all entries of the lowest rank
// (all the same pair, in position order) and applies those still valid, so the whole thing is
// O(n log n) even for very long words.
void Gpt2Bpe::bpe(std::string_view word, std::vector<int32_t> & out) const {
    const int n = static_cast<int>(word.size());
    if (n == 1) { out.push_back(byte_id_[static_cast<unsigned char>(word[0])]); return; }

    struct Node { int32_t id, prev, next; };
    std::vector<Node> nodes(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) nodes[i] = {byte_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};

    struct Entry { int32_t rank, left, right, a, b, merged; };
    auto later = [](const Entry & x, const Entry & y) {
        return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
    };
    std::priority_queue<Entry, std::vector<Entry>, decltype(later)> heap(later);
    auto push_pair = [&](int32_t l) {
        if (l < 0) return;
        const int32_t r = nodes[l].next;
        if (r < 0) return;
        const int32_t a = nodes[l].id, b = nodes[r].id;
        const auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
        if (it != merges_.end()) heap.push({it->second.rank, l, r, a, b, it->second.merged});
    };
    for (int i = 0; i + 1 < n; ++i) push_pair(i);

    std::vector<Entry> round;
    while (!heap.empty()) {
        const int32_t rank = heap.top().rank;
        round.clear();
        while (!heap.empty() && heap.top().rank == rank) { round.push_back(heap.top()); heap.pop(); }
        for (const Entry & e : round) {
            Node & l = nodes[e.left];
            if (l.id != e.a || l.next != e.right || nodes[e.right].id != e.b) continue;  // stale
            const int32_t after = nodes[e.right].next;
            l.id = e.merged;
            l.next = after;
            if (after >= 0) nodes[after].prev = e.left;
            nodes[e.right].id = -1;
            push_pair(l.prev);
            push_pair(e.left);
        }
    }
    for (int32_t i = 0; i >= 0; i = nodes[i].next) out.push_back(nodes[i].id);
}

void Gpt2Bpe::encode_word(std::string_view word, std::vector<int32_t> & out) const {
    if (word.size() > kMaxCachedWordBytes) { bpe(word, out); return; }
    const std::string key(word);
    {
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (auto it = cache_.find(key); it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t start = out.size();
    bpe(word, out);
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(key, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

std::vector<int32_t> Gpt2Bpe::encode(std::string_view text) const {
    std::vector<int32_t> out;
    if (text.empty()) return out;
    out.reserve(text.size() / 3 + 16);

    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(re_->code, nullptr), &pcre2_match_data_free);
    if (!md) throw Error("out of memory creating a PCRE2 match block");

    const auto * subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t len = text.size();
    size_t pos = 0;
    while (pos < len) {
        const int rc = pcre2_match(re_->code, subject, len, pos, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) {                   // only invalid UTF-8 is left
            encode_word(text.substr(pos), out);
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            throw Error(fmt::format("GPT-2 pre-tokenisation failed at byte {} of {}: {}",
                                    pos, len, reinterpret_cast<const char *>(msg)));
        }
        const PCRE2_SIZE * ov = pcre2_get_ovector_pointer(md.get());
        const size_t begin = ov[0], end = ov[1];
        if (begin > pos) encode_word(text.substr(pos, begin - pos), out);  // bytes that are not UTF-8
        if (end == begin) {                                // cannot happen with this pattern; be safe
            if (begin >= len) break;
            encode_word(text.substr(begin, 1), out);
            pos = begin + 1;
            continue;
        }
        encode_word(text.substr(begin, end - begin), out);
        pos = end;
    }
    return out;
}

std::string Gpt2Bpe::decode(const std::vector<int32_t> & ids) const {
    std::string out;
    out.reserve(ids.size() * 4);
    const int vocab = vocab_size();
    for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t id = ids[i];
        if (id < 0 || id >= vocab) {
            throw FormatError(fmt::format("token id {} at position {} is outside the gpt2 vocabulary [0, {})",
                                          id, i, vocab));
        }
        out += id_to_bytes_[static_cast<size_t>(id)];
    }
    return out;
}

}  // namespace memfit
