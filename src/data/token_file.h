// Token files: the tokenized corpus, memory-mapped by the data loader.
//
//   offset  size  field
//        0     8  magic "MFTOKENS"
//        8     4  version = 1                      (all integers little-endian)
//       12     4  bytes_per_token: 2 if vocab_size <= 65536, else 4
//       16     4  vocab_size
//       20     4  reserved = 0
//       24     8  num_tokens
//       32     .  num_tokens tokens, uint16 or uint32
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace memfit {

inline constexpr size_t kTokenFileHeaderBytes = 32;
inline constexpr uint32_t kTokenFileVersion = 1;

// Writes path + ".tmp", fsyncs it and renames it over path, so readers never see a partial file.
// Every token must be in [0, vocab_size) (FormatError otherwise); I/O failures are IoError.
void write_token_file(const std::string & path, std::span<const int32_t> tokens, uint32_t vocab_size);

// A read-only memory map of a token file. The header and the file size are validated on open
// (FormatError naming the file and the numbers); token values are not (that would read the whole
// file): token(i) returns whatever is stored, and callers check it against vocab_size().
class TokenFile {
public:
    explicit TokenFile(const std::string & path);
    ~TokenFile();
    TokenFile(TokenFile && other) noexcept;
    TokenFile & operator=(TokenFile && other) noexcept;
    TokenFile(const TokenFile &) = delete;
    TokenFile & operator=(const TokenFile &) = delete;

    const std::string & path() const { return path_; }
    uint64_t size() const { return num_tokens_; }            // number of tokens
    uint32_t vocab_size() const { return vocab_size_; }
    uint32_t bytes_per_token() const { return bytes_per_token_; }

    // The i-th token, i < size() (not bounds-checked). A corrupt file can hold values >= vocab_size()
    // (or, with 4-byte tokens, >= 2^31, returned as negative numbers).
    int32_t token(uint64_t i) const {
        const unsigned char * p = body_ + i * bytes_per_token_;
        if (bytes_per_token_ == 2) return static_cast<int32_t>(p[0] | (uint32_t{p[1]} << 8));
        return static_cast<int32_t>(p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24));
    }

private:
    void release() noexcept;

    std::string path_;
    void * map_ = nullptr;
    size_t map_bytes_ = 0;
    const unsigned char * body_ = nullptr;
    uint64_t num_tokens_ = 0;
    uint32_t vocab_size_ = 0;
    uint32_t bytes_per_token_ = 0;
};

}  // namespace memfit
