// Token files: the tokenized corpus, memory-mapped by the data loader. Version 1 holds text (one
// stream of tokens); version 2 documents (conversations, prompt/completion pairs) with a loss
// mask, as `memfit prepare --format jsonl` writes them.
//
//   offset  size  field
//        0     8  magic "MFTOKENS"
//        8     4  version: 1 or 2                  (all integers little-endian)
//       12     4  bytes_per_token: 2 if vocab_size <= 65536, else 4
//       16     4  vocab_size
//       20     4  version 1: reserved = 0; version 2: pad_id, the token padded positions hold
//       24     8  num_tokens
//       32     .  num_tokens tokens, uint16 or uint32
// version 2 goes on, from the next multiple of 8 bytes (zero bytes between):
//        .     8  num_docs
//        .     .  num_docs + 1 offsets, uint64: document d is tokens [off[d], off[d+1]); off[0] = 0,
//                 non-decreasing, off[num_docs] = num_tokens
//        .     .  num_tokens bytes of loss mask: 1 where the token is a trained target (the loss
//                 counts its prediction from the tokens before it), 0 where it is not (-100)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace memfit {

inline constexpr size_t kTokenFileHeaderBytes = 32;
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr uint32_t kDocumentFileVersion = 2;

// Writes path + ".tmp", fsyncs it and renames it over path, so readers never see a partial file.
// Every token must be in [0, vocab_size) (FormatError otherwise); I/O failures are IoError.
void write_token_file(const std::string & path, std::span<const int32_t> tokens, uint32_t vocab_size);

// Documents (version 2): doc_offsets has one entry more than there are documents (FormatError
// when they do not cut `tokens` as above); trained[i] != 0 marks token i as a trained target;
// pad_id in [0, vocab_size).
void write_document_file(const std::string & path, std::span<const int32_t> tokens,
                         std::span<const uint64_t> doc_offsets, std::span<const uint8_t> trained, uint32_t vocab_size,
                         int32_t pad_id);

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
    // Version 2: the documents (validated on open) and the loss mask; num_docs() 0 for text.
    bool documents() const { return offsets_ != nullptr; }
    uint64_t num_docs() const { return num_docs_; }
    uint64_t doc_begin(uint64_t d) const { return read_u64(offsets_ + 8 * d); }
    uint64_t doc_end(uint64_t d) const { return read_u64(offsets_ + 8 * (d + 1)); }
    bool trained(uint64_t i) const { return mask_[i] != 0; }   // i < size(), documents() only
    int32_t pad_id() const { return pad_id_; }

    // The i-th token, i < size() (not bounds-checked). A corrupt file can hold values >= vocab_size()
    // (or, with 4-byte tokens, >= 2^31, returned as negative numbers).
    int32_t token(uint64_t i) const {
        const unsigned char * p = body_ + i * bytes_per_token_;
        if (bytes_per_token_ == 2) return static_cast<int32_t>(p[0] | (uint32_t{p[1]} << 8));
        return static_cast<int32_t>(p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24));
    }

private:
    void release() noexcept;
    void open_documents(uint64_t file_bytes);   // version 2's sections
    static uint64_t read_u64(const unsigned char * p) {
        uint64_t v = 0;
        for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
        return v;
    }

    std::string path_;
    void * map_ = nullptr;
    size_t map_bytes_ = 0;
    const unsigned char * body_ = nullptr;
    uint64_t num_tokens_ = 0;
    uint32_t vocab_size_ = 0;
    uint32_t bytes_per_token_ = 0;
    const unsigned char * offsets_ = nullptr;   // version 2
    const unsigned char * mask_ = nullptr;
    uint64_t num_docs_ = 0;
    int32_t pad_id_ = 0;
};

}  // namespace memfit
