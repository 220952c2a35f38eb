// A reader of TensorBoard event files for the tests, written independently of
// src/report/tensorboard.h (which it does not include): its CRC-32C is computed bit by bit, not
// with a table, so that a bug in the writer's table shows. It parses every TFRecord
//   uint64 length | uint32 masked CRC-32C(length) | data | uint32 masked CRC-32C(data)
// checks both CRCs, and decodes the data as tensorflow.Event {wall_time = 1 (double), step = 2
// (varint), file_version = 3 (string), summary = 5 {value = 1 {tag = 1, simple_value = 2 (float)}}},
// skipping other fields by wire type.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace memfit::test {

struct TfEvent {
    double      wall_time = 0;
    int64_t     step = 0;
    std::string file_version;
    std::vector<std::pair<std::string, float>> values;
    int session_status = 0;   // SessionLog.status (1: START); 0 when the event has none
};

// CRC-32C, one bit at a time (reflected polynomial 0x82F63B78).
inline uint32_t bitwise_crc32c(const void * data, size_t n) {
    const auto * p = static_cast<const uint8_t *>(data);
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

inline uint32_t bitwise_masked_crc32c(const void * data, size_t n) {
    const uint32_t c = bitwise_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace tfevents_detail {

inline uint64_t le(const uint8_t * p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}

// A cursor over one protobuf message; every read checks bounds and sets `bad` with a reason.
struct Cursor {
    const uint8_t * p;
    const uint8_t * end;
    std::string     bad;

    bool varint(uint64_t & v) {
        v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p == end) return fail("truncated varint");
            const uint8_t b = *p++;
            v |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return true;
        }
        return fail("varint longer than 10 bytes");
    }
    bool fixed(uint64_t & v, int bytes) {
        if (end - p < bytes) return fail("truncated fixed-width field");
        v = le(p, bytes);
        p += bytes;
        return true;
    }
    bool bytes(Cursor & sub) {
        uint64_t n = 0;
        if (!varint(n)) return false;
        if (uint64_t(end - p) < n) return fail("length-delimited field runs past its message");
        sub = Cursor{p, p + n, {}};
        p += n;
        return true;
    }
    bool skip(uint64_t wire_type) {
        uint64_t v = 0;
        Cursor sub{};
        switch (wire_type) {
        case 0: return varint(v);
        case 1: return fixed(v, 8);
        case 2: return bytes(sub);
        case 5: return fixed(v, 4);
        default: return fail("bad wire type " + std::to_string(wire_type));
        }
    }
    bool fail(const std::string & why) {
        bad = why;
        return false;
    }
    std::string str() const { return std::string(reinterpret_cast<const char *>(p), size_t(end - p)); }
};

inline bool parse_value(Cursor c, std::pair<std::string, float> & out, std::string & bad) {
    while (c.p != c.end) {
        uint64_t key = 0, v = 0;
        Cursor sub{};
        if (!c.varint(key)) break;
        if (key == 0x0a) {
            if (!c.bytes(sub)) break;
            out.first = sub.str();
        } else if (key == 0x15) {
            if (!c.fixed(v, 4)) break;
            const auto bits = uint32_t(v);
            std::memcpy(&out.second, &bits, sizeof bits);
        } else if (!c.skip(key & 7)) {
            break;
        }
    }
    bad = c.bad;
    return bad.empty();
}

inline bool parse_event(Cursor c, TfEvent & e, std::string & bad) {
    while (c.p != c.end && c.bad.empty()) {
        uint64_t key = 0, v = 0;
        Cursor sub{};
        if (!c.varint(key)) break;
        if (key == 0x09) {
            if (!c.fixed(v, 8)) break;
            std::memcpy(&e.wall_time, &v, sizeof v);
        } else if (key == 0x10) {
            if (!c.varint(v)) break;
            e.step = int64_t(v);
        } else if (key == 0x1a) {
            if (!c.bytes(sub)) break;
            e.file_version = sub.str();
        } else if (key == 0x32) {   // session_log: its status (field 1)
            if (!c.bytes(sub)) break;
            uint64_t skey = 0, status = 0;
            while (sub.p != sub.end && sub.varint(skey)) {
                if (skey == 0x08) {
                    if (!sub.varint(status)) break;
                    e.session_status = int(status);
                } else if (!sub.skip(skey & 7)) {
                    break;
                }
            }
            if (!sub.bad.empty()) c.bad = "session_log: " + sub.bad;
        } else if (key == 0x2a) {
            if (!c.bytes(sub)) break;
            while (sub.p != sub.end) {   // Summary: only field 1, Value, is read
                uint64_t skey = 0;
                Cursor val{};
                if (!sub.varint(skey)) break;
                if (skey == 0x0a) {
                    if (!sub.bytes(val)) break;
                    std::pair<std::string, float> tv{"", 0.0f};
                    if (!parse_value(val, tv, sub.bad)) break;
                    e.values.push_back(tv);
                } else if (!sub.skip(skey & 7)) {
                    break;
                }
            }
            if (!sub.bad.empty()) c.bad = "summary: " + sub.bad;
        } else if (!c.skip(key & 7)) {
            break;
        }
    }
    bad = c.bad;
    return bad.empty();
}

}  // namespace tfevents_detail

// Every event of the file at `path`, in order. On a problem (unreadable file, a truncated
// record, a CRC mismatch, a bad wire type) returns the events before it and sets *error to one
// line naming the record's index (0 is the first record); *error is left empty otherwise.
inline std::vector<TfEvent> read_tfevents(const std::string & path, std::string * error) {
    using namespace tfevents_detail;
    std::vector<TfEvent> out;
    std::string err;
    std::ifstream in(path, std::ios::binary);
    if (!in.is_open()) err = "cannot open " + path;
    const std::string buf = err.empty() ? std::string{std::istreambuf_iterator<char>(in), {}} : std::string();
    const auto * p = reinterpret_cast<const uint8_t *>(buf.data());
    size_t at = 0;
    for (size_t rec = 0; err.empty() && at < buf.size(); ++rec) {
        const std::string where = "record " + std::to_string(rec) + " at byte " + std::to_string(at) + ": ";
        if (buf.size() - at < 12) { err = where + "truncated length header"; break; }
        const uint64_t len = le(p + at, 8);
        if (uint32_t(le(p + at + 8, 4)) != bitwise_masked_crc32c(p + at, 8)) { err = where + "length CRC mismatch"; break; }
        if (buf.size() - at - 12 < 4 || buf.size() - at - 16 < len) {
            err = where + "truncated: needs " + std::to_string(len) + " bytes of data and 4 of CRC, " +
                  std::to_string(buf.size() - at - 12) + " left";
            break;
        }
        const uint8_t * data = p + at + 12;
        if (uint32_t(le(data + len, 4)) != bitwise_masked_crc32c(data, size_t(len))) { err = where + "data CRC mismatch"; break; }
        TfEvent e;
        std::string bad;
        if (!parse_event(Cursor{data, data + len, {}}, e, bad)) { err = where + bad; break; }
        out.push_back(std::move(e));
        at += 16 + size_t(len);
    }
    if (error) *error = err;
    return out;
}

// The paths (dir/name) of the files in `dir` whose name contains "tfevents", sorted; none when
// the folder does not exist.
inline std::vector<std::string> tfevents_files(const std::string & dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto & entry : std::filesystem::directory_iterator(dir, ec))
        if (entry.path().filename().string().find("tfevents") != std::string::npos) out.push_back(entry.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace memfit::test
