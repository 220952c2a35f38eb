// TensorBoard event files: CRC-32C, the TFRecord framing and the few protobuf fields of
// tensorflow.Event / Summary / Summary.Value, encoded by hand (see tensorboard.h).
#include "report/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {
namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial, built at compile time.
constexpr std::array<uint32_t, 256> make_crc_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        t[i] = c;
    }
    return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// ---- protobuf wire format: only what Event, Summary and Summary.Value need ----
void put_varint(std::string & out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(char(uint8_t(v | 0x80)));
        v >>= 7;
    }
    out.push_back(char(uint8_t(v)));
}

void put_le(std::string & out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(char(uint8_t(v >> (8 * i))));
}

void put_double(std::string & out, uint8_t tag, double d) {   // wire type 1
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    out.push_back(char(tag));
    put_le(out, bits, 8);
}

void put_float(std::string & out, uint8_t tag, float f) {     // wire type 5
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    out.push_back(char(tag));
    put_le(out, bits, 4);
}

void put_bytes(std::string & out, uint8_t tag, const std::string & s) {   // wire type 2
    out.push_back(char(tag));
    put_varint(out, s.size());
    out += s;
}

// Event fields.
constexpr uint8_t kWallTime = 0x09, kStep = 0x10, kFileVersion = 0x1a, kSummary = 0x2a, kSessionLog = 0x32;
// SessionLog.status, and its START value.
constexpr uint8_t kStatus = 0x08, kStart = 1;
// Summary.value, and Summary.Value's tag and simple_value.
constexpr uint8_t kValue = 0x0a, kTag = 0x0a, kSimpleValue = 0x15;

double now_seconds() {
    using namespace std::chrono;
    return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
    return buf;
}

}  // namespace

uint32_t crc32c(const void * data, size_t n) {
    const auto * p = static_cast<const uint8_t *>(data);
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

uint32_t masked_crc32c(const void * data, size_t n) {
    const uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string & dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create the TensorBoard folder {}: {}", dir, ec.message()));

    const long long seconds = static_cast<long long>(now_seconds());
    const std::string host = host_name();
    for (long long s = seconds;; ++s) {
        path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}.memfit", dir, s, host, ::getpid());
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd_ >= 0 || errno != EEXIST || s - seconds > 1000) break;
    }
    if (fd_ < 0)
        throw IoError(fmt::format("cannot create the TensorBoard event file {}: {}", path_, std::strerror(errno)));

    std::string event;
    put_double(event, kWallTime, now_seconds());
    put_bytes(event, kFileVersion, "brain.Event:2");
    if (!append_record(event)) {
        ::close(fd_);
        ::unlink(path_.c_str());
        throw IoError(fmt::format("cannot write the TensorBoard event file {}: {}", path_, error_));
    }
}

TensorBoardWriter::~TensorBoardWriter() {
    if (fd_ >= 0) ::close(fd_);
}

bool TensorBoardWriter::write(int64_t step, const std::vector<std::pair<std::string, double>> & scalars) {
    std::string summary;
    for (const auto & [tag, v] : scalars) {
        std::string value;
        put_bytes(value, kTag, tag);
        put_float(value, kSimpleValue, static_cast<float>(v));
        put_bytes(summary, kValue, value);
    }
    std::string event;
    put_double(event, kWallTime, now_seconds());
    event.push_back(char(kStep));
    put_varint(event, static_cast<uint64_t>(step));
    put_bytes(event, kSummary, summary);
    return append_record(event);
}

bool TensorBoardWriter::session_start(int64_t step) {
    std::string event;
    put_double(event, kWallTime, now_seconds());
    event.push_back(char(kStep));
    put_varint(event, static_cast<uint64_t>(step));
    put_bytes(event, kSessionLog, std::string{char(kStatus), char(kStart)});
    return append_record(event);
}

bool TensorBoardWriter::append_record(const std::string & data) {
    std::string rec;
    rec.reserve(data.size() + 16);
    put_le(rec, data.size(), 8);
    put_le(rec, masked_crc32c(rec.data(), 8), 4);
    rec += data;
    put_le(rec, masked_crc32c(data.data(), data.size()), 4);

    size_t done = 0;
    while (done < rec.size()) {
        const ssize_t n = ::pwrite(fd_, rec.data() + done, rec.size() - done, off_t(size_ + done));
        if (n > 0) {
            done += size_t(n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            error_ = n < 0 ? std::strerror(errno) : "no bytes written";
            // Cut the partial record off so that readers never meet a torn one.
            if (done > 0 && ::ftruncate(fd_, off_t(size_)) != 0) error_ += "; truncating back failed too";
            return false;
        }
    }
    size_ += rec.size();
    error_.clear();
    return true;
}

}  // namespace memfit
