#include "core/units.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace memfit {
namespace {

TEST(Units, ParsesGoodSizes) {
    struct Case { const char * text; uint64_t bytes; };
    const Case cases[] = {
        {"4096", 4096},
        {"0", 0},
        {"12B", 12},
        {"12 b", 12},
        {"3k", 3 * KiB},
        {"3K", 3 * KiB},
        {"1 KiB", KiB},
        {"1kib", KiB},
        {"2KB", 2000},
        {"2kB", 2000},
        {"512MiB", 512 * MiB},
        {"512M", 512 * MiB},
        {"512mb", 512000000},
        {"2GiB", 2 * GiB},
        {"2G", 2 * GiB},
        {"2\tGiB", 2 * GiB},
        {"1.5GB", 1500000000},
        {"1.5GiB", 3 * GiB / 2},
        {"1.5 KiB", 1536},
        {"0.5MiB", 512 * KiB},
        {"1TiB", 1024 * GiB},
        {"1T", 1024 * GiB},
        {"1tb", 1000000000000},
        {"0.001KB", 1},
        {"0.5B", 1},          // fractional bytes round to nearest, half up
        {"0.4B", 0},
        {"0.1KiB", 102},      // 102.4
        {"007", 7},
        {"1.000000000000000000000001GB", 1000000000},
        {"18446744073709551615", UINT64_MAX},
        {"16777215TiB", 16777215ull * 1024 * GiB},
    };
    for (const Case & c : cases) {
        EXPECT_EQ(parse_bytes(c.text), c.bytes) << "'" << c.text << "'";
    }
}

TEST(Units, RejectsBadSizes) {
    const char * cases[] = {
        "", " ", "-1", "-1GiB", "+1", "abc", "GiB", "1.", ".5", "1.5.5", "1..5",
        "12 MiBs", "1KiBB", "1 K B", "1e9", "0x10", "1,024", "1 2", " 1KiB", "1KiB ", "12 ",
        "1PiB", "1Ki", "1kibi", "1 Bytes",
        "18446744073709551616",           // 2^64
        "99999999999999999999999999",
        "16777216TiB",                    // 2^64
        "17179869184GiB",                 // 2^64
    };
    for (const char * text : cases) {
        try {
            uint64_t v = parse_bytes(text);
            ADD_FAILURE() << "'" << text << "' parsed as " << v;
        } catch (const ConfigError & e) {
            EXPECT_EQ(std::string(e.what()), std::string("invalid size '") + text +
                      "': expected a number with an optional unit, e.g. 512MiB, 2GiB, 1.5GB");
        }
    }
}

TEST(Units, ErrorIsAMemfitError) {
    EXPECT_THROW(parse_bytes("lots"), Error);
}

TEST(Units, FormatsBytes) {
    EXPECT_EQ(format_bytes(0), "0 B");
    EXPECT_EQ(format_bytes(12), "12 B");
    EXPECT_EQ(format_bytes(1023), "1023 B");
    EXPECT_EQ(format_bytes(1024), "1.00 KiB");
    EXPECT_EQ(format_bytes(3 * KiB), "3.00 KiB");
    EXPECT_EQ(format_bytes(1536), "1.50 KiB");
    EXPECT_EQ(format_bytes(512 * MiB), "512.00 MiB");
    EXPECT_EQ(format_bytes(3 * GiB / 2), "1.50 GiB");
    EXPECT_EQ(format_bytes(1024 * GiB), "1.00 TiB");
    EXPECT_EQ(format_bytes(MiB - 1), "1.00 MiB");      // not "1024.00 KiB"
    EXPECT_EQ(format_bytes(MiB - 6 * KiB), "1018.00 KiB");
    EXPECT_EQ(format_bytes(MiB - 11), "1023.99 KiB");
    EXPECT_EQ(format_bytes(MiB - 5), "1.00 MiB");       // 1023.995 KiB
    EXPECT_EQ(format_bytes(UINT64_MAX), "16.00 EiB");
}

TEST(Units, RoundTrip) {
    for (uint64_t n : {uint64_t(0), uint64_t(1), 3 * KiB, 512 * MiB, 3 * GiB / 2, 7 * GiB}) {
        EXPECT_EQ(parse_bytes(format_bytes(n)), n) << n;
    }
}

}  // namespace
}  // namespace memfit
