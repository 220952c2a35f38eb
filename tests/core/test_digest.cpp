// Content digests and fingerprints (checkpoint files, a LoRA base, the ranks' data files) and
// the non-finite scan that guards weights and state when they are read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_digest.h"
#include "core/finite.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

fs::path write_file(const std::string & name, const std::string & bytes) {
    const fs::path p = fs::temp_directory_path() / ("memfit_digest_test." + std::to_string(getpid())) / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
}

std::string pattern(size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = char((i * 131 + i / 7) & 0xff);
    return s;
}

TEST(Digest, FileAndBytesAgreeAndEveryByteAndTheLengthCount) {
    // Over one 1 MiB read piece, and an unaligned tail.
    const std::string a = pattern((1 << 20) + 13);
    const fs::path fa = write_file("a.bin", a);
    EXPECT_EQ(file_digest(fa.string()), bytes_digest(a.data(), a.size()));
    std::string b = a;
    b[a.size() / 2] ^= 1;
    EXPECT_NE(bytes_digest(b.data(), b.size()), bytes_digest(a.data(), a.size()));
    const std::string zero_tail = a + std::string(1, '\0');
    EXPECT_NE(bytes_digest(zero_tail.data(), zero_tail.size()), bytes_digest(a.data(), a.size()));
    EXPECT_EQ(bytes_digest(a.data(), a.size()).size(), 16u);
    EXPECT_THROW(file_digest((fa.parent_path() / "missing").string()), IoError);
}

TEST(Digest, FingerprintTellsOtherFilesApart) {
    const std::string a = pattern(3 << 20);
    const std::string fp = file_fingerprint(write_file("big.bin", a).string());
    EXPECT_EQ(file_fingerprint(write_file("big_copy.bin", a).string()), fp);
    std::string first = a, last = a;
    first[5] ^= 1;
    last[a.size() - 1] ^= 1;
    EXPECT_NE(file_fingerprint(write_file("first.bin", first).string()), fp);
    EXPECT_NE(file_fingerprint(write_file("last.bin", last).string()), fp);
    EXPECT_NE(file_fingerprint(write_file("shorter.bin", a.substr(0, a.size() - 8)).string()), fp);
    // Small files are read whole.
    const std::string s = pattern(1000);
    std::string s2 = s;
    s2[500] ^= 1;
    EXPECT_NE(file_fingerprint(write_file("s.bin", s).string()), file_fingerprint(write_file("s2.bin", s2).string()));
    EXPECT_THROW(file_fingerprint("/nonexistent/memfit/file"), IoError);
}

TEST(Finite, CountsNanInfAndNegativesWhenAsked) {
    const std::vector<float> x = {1, -2, NAN, 4, INFINITY, -INFINITY};
    const NonFinite f = find_non_finite(x.data(), x.size());
    EXPECT_EQ(f.count, 3u);
    EXPECT_EQ(f.first, 2u);
    EXPECT_TRUE(std::isnan(f.value));
    EXPECT_EQ(f.describe(), "3 non-finite values (the first, element 2, is nan)");
    const NonFinite g = find_non_finite(x.data(), x.size(), true);
    EXPECT_EQ(g.count, 4u);
    EXPECT_EQ(g.first, 1u);
    EXPECT_FALSE(find_non_finite(x.data(), 2));
    EXPECT_FALSE(find_non_finite(x.data(), 0));
}

}  // namespace
}  // namespace memfit
