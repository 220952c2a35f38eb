#include "tokenizer/bpe.h"

#include "core/error.h"
#include "core/json_read.h"
#include "tokenizer/unicode_norm.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

namespace memfit {

const char * const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Words longer than this are encoded but not cached (they rarely repeat); the cache is dropped
// when it holds this many words, to bound its memory on huge inputs.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCacheEntries = size_t{1} << 20;

// Code point of GPT-2's byte alphabet -> byte (-1: not in the alphabet).
const std::vector<int> & codepoint_to_byte() {
    static const std::vector<int> table = [] {
        std::vector<int> t(512, -1);
        for (int b = 0; b < 256; ++b) t[ByteLevelBpe::byte_to_codepoint()[size_t(b)]] = b;
        return t;
    }();
    return table;
}

}  // namespace

std::string read_tokenizer_file(const std::string & path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        throw IoError(fmt::format("{}: cannot open tokenizer file; set MEMFIT_DATA_DIR to memfit's data folder",
                                  path));
    return read_text_file(path);   // a regular file, at most kMaxJsonFileBytes
}

bool byte_alphabet_to_bytes(std::string_view s, std::string & out) {
    const std::vector<int> & cp_to_byte = codepoint_to_byte();
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

struct ByteLevelBpe::Regex {
    pcre2_code * code = nullptr;
    ~Regex() { if (code) pcre2_code_free(code); }
};

const std::vector<uint32_t> & ByteLevelBpe::byte_to_codepoint() {
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

BpeParts read_gpt2_files(const std::string & encoder_json, const std::string & vocab_bpe) {
    BpeParts parts;
    parts.name = "gpt2";
    parts.source = encoder_json;
    parts.patterns = {kGpt2Pattern};
    // encoder.json: {"token in byte alphabet": id, ...}, ids 0..n-1.
    {
        const std::string text = read_tokenizer_file(encoder_json);
        const nlohmann::json j = parse_json(text, encoder_json);
        if (!j.is_object() || j.empty()) {
            throw FormatError(fmt::format("{}: expected a JSON object mapping token strings to ids", encoder_json));
        }
        const size_t n = j.size();
        parts.id_to_bytes.assign(n, std::string());
        std::vector<bool> seen(n, false);
        std::unordered_map<std::string, int64_t> ids;
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
            if (!byte_alphabet_to_bytes(key, bytes) || bytes.empty()) {
                throw FormatError(fmt::format("{}: token '{}' (id {}) is not written in GPT-2's byte alphabet",
                                              encoder_json, key, id));
            }
            if (!ids.emplace(bytes, id).second) {
                throw FormatError(fmt::format("{}: two tokens decode to the same bytes (second: '{}', id {})",
                                              encoder_json, key, id));
            }
            seen[static_cast<size_t>(id)] = true;
            parts.id_to_bytes[static_cast<size_t>(id)] = bytes;
        }
        if (auto it = ids.find("<|endoftext|>"); it != ids.end()) parts.eot_id = int32_t(it->second);
    }
    // vocab.bpe: "#version: ..." then one merge "left right" per line, in rank order.
    {
        const std::string text = read_tokenizer_file(vocab_bpe);
        std::istringstream lines(text);
        std::string line, left, right;
        int line_no = 0;
        while (std::getline(lines, line)) {
            ++line_no;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty() || line.rfind("#version", 0) == 0) continue;
            const size_t sp = line.find(' ');
            if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
                line.find(' ', sp + 1) != std::string::npos) {
                throw FormatError(fmt::format("{}:{}: expected 'left right', got '{}'", vocab_bpe, line_no, line));
            }
            if (!byte_alphabet_to_bytes(std::string_view(line).substr(0, sp), left) ||
                !byte_alphabet_to_bytes(std::string_view(line).substr(sp + 1), right)) {
                throw FormatError(fmt::format("{}:{}: merge '{}' is not written in GPT-2's byte alphabet",
                                              vocab_bpe, line_no, line));
            }
            parts.merges.emplace_back(left, right);
        }
        if (parts.merges.empty()) throw FormatError(fmt::format("{}: no merges found", vocab_bpe));
    }
    return parts;
}

ByteLevelBpe::ByteLevelBpe(BpeParts parts)
    : name_(std::move(parts.name)), id_to_bytes_(std::move(parts.id_to_bytes)), added_(std::move(parts.added)),
      ignore_merges_(parts.ignore_merges), nfc_(parts.nfc), eot_id_(parts.eot_id) {
    const std::string & src = parts.source;
    bytes_to_id_.reserve(id_to_bytes_.size());
    std::vector<bool> is_added(id_to_bytes_.size(), false);
    for (const auto & [text, id] : added_) {
        if (id < 0 || size_t(id) >= id_to_bytes_.size() || text.empty())
            throw FormatError(fmt::format("{}: added token '{}' has id {} outside [0, {})", src, text, id,
                                          id_to_bytes_.size()));
        is_added[size_t(id)] = true;
        starts_added_[static_cast<unsigned char>(text[0])] = true;
    }
    for (size_t id = 0; id < id_to_bytes_.size(); ++id)
        if (!is_added[id] && !id_to_bytes_[id].empty()) bytes_to_id_.emplace(id_to_bytes_[id], int32_t(id));
    for (int b = 0; b < 256; ++b) {
        const auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
        if (it == bytes_to_id_.end())
            throw FormatError(fmt::format("{}: no token for the single byte {}; byte-level BPE needs all 256", src, b));
        byte_id_[b] = it->second;
    }
    merges_.reserve(parts.merges.size());
    for (size_t rank = 0; rank < parts.merges.size(); ++rank) {
        const auto & [left, right] = parts.merges[rank];
        const auto l = bytes_to_id_.find(left), r = bytes_to_id_.find(right), m = bytes_to_id_.find(left + right);
        if (l == bytes_to_id_.end() || r == bytes_to_id_.end() || m == bytes_to_id_.end())
            throw FormatError(fmt::format("{}: merge {} of '{}' and '{}' uses or makes a token missing from the "
                                          "vocabulary; the merges and the vocabulary do not belong together",
                                          src, rank, left, right));
        const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
        merges_.emplace(key, Merge{int32_t(rank), m->second});   // a repeated pair keeps its first rank
    }
    std::stable_sort(added_.begin(), added_.end(),
                     [](const auto & a, const auto & b) { return a.first.size() > b.first.size(); });
    for (const std::string & pattern : parts.patterns) {
        auto re = std::make_unique<Regex>();
        int err = 0;
        PCRE2_SIZE err_off = 0;
        re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
        if (!re->code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw FormatError(fmt::format("{}: PCRE2 cannot compile the pre-tokenisation pattern '{}' at offset {}: {}",
                                          src, pattern, err_off, reinterpret_cast<const char *>(msg)));
        }
        pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);   // optional speed-up; interpreter otherwise
        res_.push_back(std::move(re));
    }
}

ByteLevelBpe::~ByteLevelBpe() = default;

// Byte-pair merging of one word, exactly as GPT-2: take the lowest-ranked adjacent pair, merge all
// its occurrences left to right, repeat. Symbols form a linked list; every adjacent pair that has a
// rank sits in a min-heap keyed (rank, position). A round pops all entries of the lowest rank
// (all the same pair, in position order) and applies those still valid, so the whole thing is
// O(n log n) even for very long words.
void ByteLevelBpe::bpe(std::string_view word, std::vector<int32_t> & out) const {
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

void ByteLevelBpe::encode_word(std::string_view word, std::vector<int32_t> & out) const {
    if (ignore_merges_) {
        if (const auto it = bytes_to_id_.find(std::string(word)); it != bytes_to_id_.end()) {
            out.push_back(it->second);
            return;
        }
    }
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

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 16);
    size_t from = 0;   // the text since the last added token
    for (size_t pos = 0; pos < text.size() && !added_.empty();) {
        if (!starts_added_[static_cast<unsigned char>(text[pos])]) {
            ++pos;
            continue;
        }
        const auto hit = std::find_if(added_.begin(), added_.end(), [&](const auto & a) {
            return text.compare(pos, a.first.size(), a.first) == 0;
        });
        if (hit == added_.end()) {
            ++pos;
            continue;
        }
        encode_text(text.substr(from, pos - from), out);
        out.push_back(hit->second);
        pos += hit->first.size();
        from = pos;
    }
    encode_text(text.substr(from), out);
    return out;
}

void ByteLevelBpe::encode_text(std::string_view text, std::vector<int32_t> & out) const {
    if (text.empty()) return;
    if (!nfc_) return split(text, 0, out);
    const std::string normal = nfc(text);
    split(normal, 0, out);
}

// Pieces of `text` by pattern `level` ("Isolated": each match, and each stretch between matches,
// is a piece), each split further by the next pattern; past the last, BPE.
void ByteLevelBpe::split(std::string_view text, size_t level, std::vector<int32_t> & out) const {
    if (text.empty()) return;
    if (level == res_.size()) return encode_word(text, out);
    pcre2_code * code = res_[level]->code;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
    if (!md) throw Error("out of memory creating a PCRE2 match block");
    const auto * subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t len = text.size();
    size_t pos = 0, gap = 0;   // the next search, and the start of the text no match took
    while (pos < len) {
        const int rc = pcre2_match(code, subject, len, pos, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            throw Error(fmt::format("{}: pre-tokenisation failed at byte {} of {}: {}", name_, pos, len,
                                    reinterpret_cast<const char *>(msg)));
        }
        const PCRE2_SIZE * ov = pcre2_get_ovector_pointer(md.get());
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {   // an empty match takes nothing: search on from the next character
            pos = begin + 1;
            while (pos < len && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
            continue;
        }
        split(text.substr(gap, begin - gap), level + 1, out);   // bytes no match took (not UTF-8, say)
        split(text.substr(begin, end - begin), level + 1, out);
        pos = gap = end;
    }
    split(text.substr(gap), level + 1, out);
}

std::string ByteLevelBpe::decode(const std::vector<int32_t> & ids) const {
    std::string out;
    out.reserve(ids.size() * 4);
    const int vocab = vocab_size();
    for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t id = ids[i];
        if (id < 0 || id >= vocab) {
            throw FormatError(fmt::format("token id {} at position {} is outside the {} vocabulary [0, {})",
                                          id, i, name_, vocab));
        }
        out += id_to_bytes_[static_cast<size_t>(id)];
    }
    return out;
}

}  // namespace memfit
