#include "data/token_file.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace memfit {

namespace {

constexpr char kMagic[8] = {'M', 'F', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr const char * kHint = "run `memfit prepare` to make one";

void put_u32(unsigned char * p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char * p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char * p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
uint64_t get_u64(const unsigned char * p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

// The magic as printable text, non-printable bytes as \xNN.
std::string show_magic(const unsigned char * p) {
    std::string s;
    for (int i = 0; i < 8; ++i) {
        if (p[i] >= 0x20 && p[i] < 0x7F && p[i] != '\'' && p[i] != '\\') s.push_back(static_cast<char>(p[i]));
        else s += fmt::format("\\x{:02x}", p[i]);
    }
    return s;
}

// Closes fd on scope exit unless released.
struct Fd {
    int fd = -1;
    ~Fd() { if (fd >= 0) ::close(fd); }
};

void write_all(int fd, const unsigned char * data, size_t n, const std::string & path) {
    while (n > 0) {
        const ssize_t w = ::write(fd, data, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw IoError(fmt::format("{}: write failed: {}; check free disk space", path, std::strerror(errno)));
        }
        data += w;
        n -= static_cast<size_t>(w);
    }
}

}  // namespace

namespace {

// The tokens as bytes_per_token little-endian integers, after checking them against the vocabulary.
void check_tokens(const std::string & path, std::span<const int32_t> tokens, uint32_t vocab_size) {
    if (vocab_size == 0) throw FormatError(fmt::format("{}: cannot write a token file with vocab_size 0", path));
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= vocab_size) {
            throw FormatError(fmt::format("{}: token {} at position {} is outside the vocabulary [0, {}); "
                                          "nothing written", path, tokens[i], i, vocab_size));
        }
    }
}

// Writes the header and the tokens to path + ".tmp", then `more(fd, tmp)` (version 2's sections),
// fsyncs and renames it over path; the temporary file is removed on any failure.
template <class More>
void write_file(const std::string & path, uint32_t version, uint32_t field20, std::span<const int32_t> tokens,
                uint32_t vocab_size, More more) {
    const uint32_t bpt = vocab_size <= 65536 ? 2 : 4;
    const std::string tmp = path + ".tmp";
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) {
        throw IoError(fmt::format("{}: cannot create: {}; check the folder exists and is writable",
                                  tmp, std::strerror(errno)));
    }
    try {
        unsigned char header[kTokenFileHeaderBytes] = {};
        std::memcpy(header, kMagic, 8);
        put_u32(header + 8, version);
        put_u32(header + 12, bpt);
        put_u32(header + 16, vocab_size);
        put_u32(header + 20, field20);
        put_u64(header + 24, tokens.size());
        write_all(f.fd, header, sizeof header, tmp);

        constexpr size_t kChunk = size_t{1} << 16;        // tokens per write
        std::vector<unsigned char> buf(kChunk * bpt);
        for (size_t start = 0; start < tokens.size(); start += kChunk) {
            const size_t n = std::min(kChunk, tokens.size() - start);
            unsigned char * p = buf.data();
            for (size_t i = 0; i < n; ++i) {
                const auto v = static_cast<uint32_t>(tokens[start + i]);
                for (uint32_t b = 0; b < bpt; ++b) *p++ = static_cast<unsigned char>(v >> (8 * b));
            }
            write_all(f.fd, buf.data(), n * bpt, tmp);
        }
        more(f.fd, tmp, kTokenFileHeaderBytes + tokens.size() * bpt);
        if (::fsync(f.fd) != 0) throw IoError(fmt::format("{}: fsync failed: {}", tmp, std::strerror(errno)));
        const int fd = f.fd;
        f.fd = -1;
        if (::close(fd) != 0) throw IoError(fmt::format("{}: close failed: {}", tmp, std::strerror(errno)));
        if (::rename(tmp.c_str(), path.c_str()) != 0) {
            throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
        }
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    // Make the rename itself durable (best effort: some file systems refuse to fsync a folder).
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    Fd d;
    d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd >= 0) ::fsync(d.fd);
}

uint64_t round8(uint64_t n) { return (n + 7) / 8 * 8; }

}  // namespace

void write_token_file(const std::string & path, std::span<const int32_t> tokens, uint32_t vocab_size) {
    check_tokens(path, tokens, vocab_size);
    write_file(path, kTokenFileVersion, 0, tokens, vocab_size, [](int, const std::string &, uint64_t) {});
}

void write_document_file(const std::string & path, std::span<const int32_t> tokens,
                         std::span<const uint64_t> doc_offsets, std::span<const uint8_t> trained, uint32_t vocab_size,
                         int32_t pad_id) {
    check_tokens(path, tokens, vocab_size);
    if (pad_id < 0 || static_cast<uint32_t>(pad_id) >= vocab_size)
        throw FormatError(fmt::format("{}: pad id {} is outside the vocabulary [0, {}); nothing written", path, pad_id,
                                      vocab_size));
    if (trained.size() != tokens.size())
        throw FormatError(fmt::format("{}: {} mask bytes for {} tokens; nothing written", path, trained.size(),
                                      tokens.size()));
    const bool cut = !doc_offsets.empty() && doc_offsets.front() == 0 && doc_offsets.back() == tokens.size() &&
                     std::is_sorted(doc_offsets.begin(), doc_offsets.end());
    if (!cut)
        throw FormatError(fmt::format("{}: document offsets do not cut the {} tokens (from 0, non-decreasing, to the "
                                      "end); nothing written", path, tokens.size()));
    write_file(path, kDocumentFileVersion, static_cast<uint32_t>(pad_id), tokens, vocab_size,
               [&](int fd, const std::string & tmp, uint64_t written) {
                   std::vector<unsigned char> buf(round8(written) - written + 8 * (doc_offsets.size() + 1));
                   unsigned char * p = buf.data() + (round8(written) - written);
                   put_u64(p, doc_offsets.size() - 1);
                   for (size_t d = 0; d < doc_offsets.size(); ++d) put_u64(p + 8 * (d + 1), doc_offsets[d]);
                   write_all(fd, buf.data(), buf.size(), tmp);
                   std::vector<unsigned char> mask(trained.size());
                   for (size_t i = 0; i < trained.size(); ++i) mask[i] = trained[i] ? 1 : 0;
                   write_all(fd, mask.data(), mask.size(), tmp);
               });
}

TokenFile::TokenFile(const std::string & path) : path_(path) {
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) {
        throw IoError(fmt::format("{}: cannot open token file: {}; {}", path, std::strerror(errno), kHint));
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) throw IoError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) throw IoError(fmt::format("{}: not a regular file", path));
    const auto file_bytes = static_cast<uint64_t>(st.st_size);
    if (file_bytes < kTokenFileHeaderBytes) {
        throw FormatError(fmt::format("{}: {} bytes, shorter than the {}-byte token file header; {}",
                                      path, file_bytes, kTokenFileHeaderBytes, kHint));
    }

    map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        throw IoError(fmt::format("{}: mmap of {} bytes failed: {}", path, file_bytes, std::strerror(errno)));
    }
    map_bytes_ = static_cast<size_t>(file_bytes);
    try {
        const auto * h = static_cast<const unsigned char *>(map_);
        if (std::memcmp(h, kMagic, 8) != 0) {
            throw FormatError(fmt::format("{}: not a memfit token file (magic '{}', expected 'MFTOKENS'); {}",
                                          path, show_magic(h), kHint));
        }
        const uint32_t version = get_u32(h + 8);
        if (version != kTokenFileVersion && version != kDocumentFileVersion) {
            throw FormatError(fmt::format("{}: token file version {}, this memfit reads versions {} and {}; "
                                          "re-run `memfit prepare`", path, version, kTokenFileVersion,
                                          kDocumentFileVersion));
        }
        bytes_per_token_ = get_u32(h + 12);
        vocab_size_ = get_u32(h + 16);
        const uint32_t reserved = get_u32(h + 20);
        num_tokens_ = get_u64(h + 24);
        if (bytes_per_token_ != 2 && bytes_per_token_ != 4) {
            throw FormatError(fmt::format("{}: bytes_per_token is {}, must be 2 or 4; the file is corrupt, {}",
                                          path, bytes_per_token_, kHint));
        }
        if (vocab_size_ == 0 || (bytes_per_token_ == 2 && vocab_size_ > 65536)) {
            throw FormatError(fmt::format("{}: vocab_size {} does not fit bytes_per_token {}; the file is corrupt, {}",
                                          path, vocab_size_, bytes_per_token_, kHint));
        }
        if (version == kTokenFileVersion && reserved != 0) {
            throw FormatError(fmt::format("{}: reserved header field is {}, must be 0; the file is corrupt, {}",
                                          path, reserved, kHint));
        }
        if (version == kDocumentFileVersion && reserved >= vocab_size_) {
            throw FormatError(fmt::format("{}: pad id {} is outside the vocabulary of {}; the file is corrupt, {}",
                                          path, reserved, vocab_size_, kHint));
        }
        pad_id_ = version == kDocumentFileVersion ? static_cast<int32_t>(reserved) : 0;
        const uint64_t body = file_bytes - kTokenFileHeaderBytes;
        if (version == kDocumentFileVersion) {
            open_documents(file_bytes);
        } else if (num_tokens_ > body / bytes_per_token_ || body != num_tokens_ * bytes_per_token_) {
            const std::string expected = num_tokens_ <= UINT64_MAX / bytes_per_token_
                ? fmt::format("{}", num_tokens_ * bytes_per_token_) : std::string("over 2^64");
            throw FormatError(fmt::format("{}: header says {} tokens x {} bytes = {} bytes after the header, "
                                          "the file has {} (truncated or corrupt); {}",
                                          path, num_tokens_, bytes_per_token_, expected, body, kHint));
        }
    } catch (...) {
        release();
        throw;
    }
    body_ = static_cast<const unsigned char *>(map_) + kTokenFileHeaderBytes;
    // Training reads windows in random order: tell the kernel not to read ahead much.
    ::madvise(map_, map_bytes_, MADV_RANDOM);
}

void TokenFile::open_documents(uint64_t file_bytes) {
    const auto * h = static_cast<const unsigned char *>(map_);
    auto corrupt = [&](const std::string & what) {
        return FormatError(fmt::format("{}: {} (truncated or corrupt); {}", path_, what, kHint));
    };
    const uint64_t body = file_bytes - kTokenFileHeaderBytes;
    if (num_tokens_ > body / bytes_per_token_)
        throw corrupt(fmt::format("header says {} tokens, {} bytes follow it", num_tokens_, body));
    const uint64_t docs_at = round8(kTokenFileHeaderBytes + num_tokens_ * bytes_per_token_);
    if (docs_at + 8 > file_bytes) throw corrupt("no document count after the tokens");
    num_docs_ = get_u64(h + docs_at);
    const uint64_t room = (file_bytes - docs_at - 8) / 8;
    if (num_docs_ >= room) throw corrupt(fmt::format("{} documents' offsets do not fit the file", num_docs_));
    const uint64_t mask_at = docs_at + 8 + 8 * (num_docs_ + 1);
    if (file_bytes - mask_at != num_tokens_)
        throw corrupt(fmt::format("{} bytes of loss mask for {} tokens", file_bytes - mask_at, num_tokens_));
    offsets_ = h + docs_at + 8;
    mask_ = h + mask_at;
    uint64_t prev = 0;
    for (uint64_t d = 0; d <= num_docs_; ++d) {
        const uint64_t o = read_u64(offsets_ + 8 * d);
        if ((d == 0 && o != 0) || o < prev || o > num_tokens_ || (d == num_docs_ && o != num_tokens_))
            throw corrupt(fmt::format("document offset {} is {}: offsets run from 0 up to the {} tokens", d, o,
                                      num_tokens_));
        prev = o;
    }
}

void TokenFile::release() noexcept {
    if (map_) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    map_bytes_ = 0;
    body_ = nullptr;
    offsets_ = mask_ = nullptr;
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile && o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_bytes_(o.map_bytes_), body_(o.body_),
      num_tokens_(o.num_tokens_), vocab_size_(o.vocab_size_), bytes_per_token_(o.bytes_per_token_),
      offsets_(o.offsets_), mask_(o.mask_), num_docs_(o.num_docs_), pad_id_(o.pad_id_) {
    o.offsets_ = o.mask_ = nullptr;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.body_ = nullptr;
    o.num_tokens_ = 0;
}

TokenFile & TokenFile::operator=(TokenFile && o) noexcept {
    if (this != &o) {
        release();
        path_ = std::move(o.path_);
        map_ = o.map_;
        map_bytes_ = o.map_bytes_;
        body_ = o.body_;
        num_tokens_ = o.num_tokens_;
        vocab_size_ = o.vocab_size_;
        bytes_per_token_ = o.bytes_per_token_;
        offsets_ = o.offsets_;
        mask_ = o.mask_;
        num_docs_ = o.num_docs_;
        pad_id_ = o.pad_id_;
        o.offsets_ = o.mask_ = nullptr;
        o.map_ = nullptr;
        o.map_bytes_ = 0;
        o.body_ = nullptr;
        o.num_tokens_ = 0;
    }
    return *this;
}

}  // namespace memfit
