#include "core/file_digest.h"

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {

// A 64-bit multiply-xorshift finalizer (the murmur3/splitmix constants, public facts).
uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

// The digest's state over a stream of bytes; pieces must be whole 8-byte words but the last.
struct Digest {
    uint64_t h = 0x9e3779b97f4a7c15ull, length = 0;
    void add(const unsigned char * p, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            h = mix(h ^ w) + 0x632be59bd9b4e019ull;
        }
        for (; i < n; ++i) h = mix(h ^ p[i]) + 0x632be59bd9b4e019ull;   // the tail (the data ends unaligned)
        length += n;
    }
    std::string hex() const { return fmt::format("{:016x}", mix(h ^ length)); }
};

}  // namespace

std::string file_digest(const std::string & path) {
    std::FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) throw IoError(fmt::format("{}: cannot read it to check its digest", path));
    std::vector<unsigned char> buf(1 << 20);
    Digest d;
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) d.add(buf.data(), n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) throw IoError(fmt::format("{}: read error while checking its digest", path));
    return d.hex();
}

std::string file_fingerprint(const std::string & path) {
    std::FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) throw IoError(fmt::format("{}: cannot read it", path));
    constexpr long kBlock = 1 << 16, kBlocks = 16;
    std::vector<unsigned char> buf(kBlock);
    Digest d;
    bool failed = std::fseek(f, 0, SEEK_END) != 0;
    const long size = failed ? 0 : std::ftell(f);
    for (long b = 0; b < kBlocks && !failed; ++b) {
        // Evenly spaced blocks, the first at the start and the last at the end.
        const long at = size <= kBlock ? 0 : (size - kBlock) * b / (kBlocks - 1);
        const size_t want = size_t(std::min(kBlock, size - at));
        failed = std::fseek(f, at, SEEK_SET) != 0 || std::fread(buf.data(), 1, want, f) != want;
        if (!failed) d.add(buf.data(), want);
        if (size <= kBlock) break;
    }
    std::fclose(f);
    if (failed) throw IoError(fmt::format("{}: read error", path));
    d.length = uint64_t(size);
    return d.hex();
}

std::string bytes_digest(const void * data, size_t n) {
    Digest d;
    d.add(static_cast<const unsigned char *>(data), n);
    return d.hex();
}

}  // namespace memfit
