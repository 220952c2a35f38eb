#include "core/file_digest.h"

#include <cstdint>
#include <cstdio>
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

}  // namespace

std::string file_digest(const std::string & path) {
    std::FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) throw IoError(fmt::format("{}: cannot read it to check its digest", path));
    std::vector<unsigned char> buf(1 << 20);
    uint64_t h = 0x9e3779b97f4a7c15ull, length = 0;
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, buf.data() + i, 8);
            h = mix(h ^ w) + 0x632be59bd9b4e019ull;
        }
        for (; i < n; ++i) h = mix(h ^ buf[i]) + 0x632be59bd9b4e019ull;   // the tail (file ends unaligned)
        length += n;
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) throw IoError(fmt::format("{}: read error while checking its digest", path));
    return fmt::format("{:016x}", mix(h ^ length));
}

}  // namespace memfit
