#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/units.h"

namespace memfit {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the reader copies it as is");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100 * MiB;
constexpr const char * kMetadataKey = "__metadata__";

[[noreturn]] void format_error(const std::string & path, const std::string & what) {
    throw FormatError(path + ": " + what);
}

[[noreturn]] void io_error(const std::string & path, const std::string & what, int err) {
    throw IoError(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
}

std::string shape_str(const std::vector<int64_t> & shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Product of the dims times the element size, or false if it does not fit in uint64.
bool checked_nbytes(const std::vector<int64_t> & shape, size_t elem, uint64_t & out) {
    uint64_t n = elem;
    for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
    }
    out = n;
    return true;
}

// A non-negative JSON integer, or false for anything else (floats, negatives, strings).
bool json_u64(const nlohmann::json & j, uint64_t & out) {
    if (j.is_number_unsigned()) { out = j.get<uint64_t>(); return true; }
    if (j.is_number_integer()) {
        int64_t v = j.get<int64_t>();
        if (v < 0) return false;
        out = uint64_t(v);
        return true;
    }
    return false;
}

}  // namespace

size_t safetensors_dtype_size(const std::string & dtype) {
    static const std::map<std::string, size_t> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
        {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},
        {"I32", 4},  {"U32", 4}, {"F32", 4},
        {"I64", 8},  {"U64", 8}, {"F64", 8},
    };
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile SafetensorsFile::open(const std::string & path) {
    SafetensorsFile f;  // owns the mapping from here on, so every throw below unmaps it
    f.path_ = path;

    // O_NONBLOCK: a FIFO (or device) named like a weights file is refused below instead of
    // blocking the open until something writes to it; a regular file's reads ignore the flag.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) io_error(path, "cannot open", errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        io_error(path, "cannot stat", err);
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw IoError(path + ": not a regular file (a pipe or a device?)");
    }
    size_t size = size_t(st.st_size);
    if (size < 8) {
        ::close(fd);
        format_error(path, fmt::format("file is {} bytes, too small for a safetensors header "
                                       "(needs at least 8)", size));
    }
    void * map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_err = errno;
    ::close(fd);
    if (map == MAP_FAILED) io_error(path, "cannot map", map_err);
    f.map_ = map;
    f.map_size_ = size;

    f.parse_header();
    return f;
}

void SafetensorsFile::parse_header() {
    const uint8_t * base = static_cast<const uint8_t *>(map_);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);
    uint64_t room = map_size_ - 8;
    if (header_len > room) {
        format_error(path_, fmt::format("header length {} is larger than the {} bytes after the "
                                        "length field (file is {} bytes)", header_len, room, map_size_));
    }
    if (header_len > kMaxHeaderBytes) {
        format_error(path_, fmt::format("header length {} exceeds the {} byte limit",
                                        header_len, kMaxHeaderBytes));
    }
    const char * hbegin = reinterpret_cast<const char *>(base + 8);
    const uint8_t * data = base + 8 + header_len;
    uint64_t data_size = room - header_len;

    // nlohmann keeps the last of duplicate keys; a duplicate tensor name is a corrupt file.
    std::set<std::string> seen;
    std::string duplicate;
    auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json & parsed) {
        if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
            if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty()) {
                duplicate = parsed.get<std::string>();
            }
        }
    };
    const nlohmann::json header = parse_json(std::string_view(hbegin, header_len), path_ + ": header", on_event);
    if (!header.is_object()) {
        format_error(path_, fmt::format("header is a JSON {}, expected an object", header.type_name()));
    }
    if (!duplicate.empty()) format_error(path_, fmt::format("header has key '{}' twice", duplicate));

    struct Span { uint64_t begin, end; const std::string * name; };
    std::vector<Span> spans;
    for (const auto & item : header.items()) {
        // Named copies, not structured bindings: lambdas below capture them (C++20 allows
        // capturing bindings, clang 14 does not).
        const std::string name = item.key();
        const auto & entry = item.value();
        if (name == kMetadataKey) {
            if (!entry.is_object()) format_error(path_, "__metadata__ is not a JSON object");
            for (const auto & [key, value] : entry.items()) {
                if (!value.is_string()) {
                    format_error(path_, fmt::format("__metadata__ value for '{}' is a {}, expected a string",
                                                    key, value.type_name()));
                }
                metadata_[key] = value.get<std::string>();
            }
            continue;
        }
        auto bad = [&](const std::string & what) { format_error(path_, fmt::format("tensor '{}': {}", name, what)); };
        if (!entry.is_object()) bad("entry is not a JSON object");

        auto dt = entry.find("dtype");
        if (dt == entry.end() || !dt->is_string()) bad("missing string 'dtype'");
        TensorInfo info;
        info.dtype = dt->get<std::string>();
        size_t elem = safetensors_dtype_size(info.dtype);
        if (elem == 0) bad(fmt::format("unknown dtype '{}'", info.dtype));

        auto sh = entry.find("shape");
        if (sh == entry.end() || !sh->is_array()) bad("missing array 'shape'");
        for (const auto & d : *sh) {
            uint64_t v = 0;
            if (!json_u64(d, v) || v > uint64_t(std::numeric_limits<int64_t>::max())) {
                bad(fmt::format("shape {} has a dimension that is not a non-negative integer", sh->dump()));
            }
            info.shape.push_back(int64_t(v));
        }

        auto off = entry.find("data_offsets");
        uint64_t begin = 0, end = 0;
        if (off == entry.end() || !off->is_array() || off->size() != 2 ||
            !json_u64((*off)[0], begin) || !json_u64((*off)[1], end)) {
            bad("missing 'data_offsets' [begin, end] of two non-negative integers");
        }
        if (begin > end) bad(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
        if (end > data_size) {
            bad(fmt::format("data_offsets [{}, {}] run past the end of the {} byte data region",
                            begin, end, data_size));
        }
        uint64_t expect = 0;
        if (!checked_nbytes(info.shape, elem, expect) || expect != end - begin) {
            bad(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", begin, end,
                            end - begin, shape_str(info.shape), info.dtype,
                            checked_nbytes(info.shape, elem, expect) ? fmt::to_string(expect) : "more than 2^64"));
        }
        info.data = data + begin;
        info.nbytes = size_t(end - begin);
        auto it = tensors_.emplace(name, std::move(info)).first;
        spans.push_back({begin, end, &it->first});
    }

    // Overlaps: sorted by start, each non-empty span must begin at or after the furthest end
    // so far. Empty spans occupy no bytes and overlap nothing.
    std::sort(spans.begin(), spans.end(), [](const Span & a, const Span & b) {
        return std::tie(a.begin, a.end, *a.name) < std::tie(b.begin, b.end, *b.name);
    });
    const Span * furthest = nullptr;
    for (const Span & s : spans) {
        if (s.begin == s.end) continue;
        if (furthest && s.begin < furthest->end) {
            format_error(path_, fmt::format("tensor '{}' [{}, {}] overlaps tensor '{}' [{}, {}]", *s.name,
                                            s.begin, s.end, *furthest->name, furthest->begin, furthest->end));
        }
        if (!furthest || s.end > furthest->end) furthest = &s;
    }
    for (const Span & s : spans) order_.push_back(*s.name);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile && other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      metadata_(std::move(other.metadata_)),
      tensors_(std::move(other.tensors_)),
      order_(std::move(other.order_)) {}

SafetensorsFile & SafetensorsFile::operator=(SafetensorsFile && other) noexcept {
    if (this != &other) {
        unmap();
        path_ = std::move(other.path_);
        map_ = std::exchange(other.map_, nullptr);
        map_size_ = std::exchange(other.map_size_, 0);
        metadata_ = std::move(other.metadata_);
        tensors_ = std::move(other.tensors_);
        order_ = std::move(other.order_);
    }
    return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
    if (map_) ::munmap(map_, map_size_);
    map_ = nullptr;
    map_size_ = 0;
}

const SafetensorsFile::TensorInfo & SafetensorsFile::info(const std::string & name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) format_error(path_, fmt::format("no tensor '{}'", name));
    return it->second;
}

namespace {

template <class T>
T load(const uint8_t * p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

}  // namespace

std::vector<float> SafetensorsFile::read_f32(const std::string & name) const {
    const TensorInfo & t = info(name);
    size_t elem = safetensors_dtype_size(t.dtype);
    size_t n = t.nbytes / elem;
    std::vector<float> out(n);
    if (t.dtype == "F32") {
        if (n) std::memcpy(out.data(), t.data, t.nbytes);
    } else if (t.dtype == "F16") {
        for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(load<uint16_t>(t.data + 2 * i));
    } else if (t.dtype == "BF16") {
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(load<uint16_t>(t.data + 2 * i));
    } else if (t.dtype == "F64") {
        for (size_t i = 0; i < n; i++) out[i] = float(load<double>(t.data + 8 * i));
    } else {
        format_error(path_, fmt::format("tensor '{}' has dtype {}; reading it as float needs F32, F16, "
                                        "BF16 or F64", name, t.dtype));
    }
    return out;
}

std::vector<int32_t> SafetensorsFile::read_i32(const std::string & name) const {
    const TensorInfo & t = info(name);
    std::vector<int32_t> out;
    if (t.dtype == "I32") {
        out.resize(t.nbytes / 4);
        if (!out.empty()) std::memcpy(out.data(), t.data, t.nbytes);
    } else if (t.dtype == "I64") {
        out.resize(t.nbytes / 8);
        for (size_t i = 0; i < out.size(); i++) {
            int64_t v = load<int64_t>(t.data + 8 * i);
            if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
                format_error(path_, fmt::format("tensor '{}' element {} is {}, outside the int32 range",
                                                name, i, v));
            }
            out[i] = int32_t(v);
        }
    } else {
        format_error(path_, fmt::format("tensor '{}' has dtype {}; reading it as int32 needs I32 or I64",
                                        name, t.dtype));
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// Closes fd and removes the temporary file if the write does not complete.
struct TmpFile {
    std::string path;
    int fd = -1;
    bool committed = false;
    ~TmpFile() {
        if (fd >= 0) ::close(fd);
        if (!committed) ::unlink(path.c_str());
    }
};

void write_all(const std::string & path, int fd, const void * buf, size_t n) {
    const char * p = static_cast<const char *>(buf);
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            io_error(path, "cannot write", errno);
        }
        p += w;
        n -= size_t(w);
    }
}

std::string parent_dir(const std::string & path) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

}  // namespace

void write_safetensors(const std::string & path, const std::vector<TensorToWrite> & tensors,
                       const std::map<std::string, std::string> & metadata) {
    // Header first: it checks every tensor before anything touches the disk.
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        nlohmann::ordered_json meta = nlohmann::ordered_json::object();
        for (const auto & [k, v] : metadata) meta[k] = v;
        header[kMetadataKey] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const TensorToWrite & t : tensors) {
        auto bad = [&](const std::string & what) {
            format_error(path, fmt::format("cannot write tensor '{}': {}", t.name, what));
        };
        if (t.name == kMetadataKey) bad("the name is reserved for metadata");
        if (header.contains(t.name)) bad("the name appears twice");
        size_t elem = safetensors_dtype_size(t.dtype);
        if (elem == 0) bad(fmt::format("unknown dtype '{}'", t.dtype));
        uint64_t expect = 0;
        if (!checked_nbytes(t.shape, elem, expect) || expect != t.nbytes) {
            bad(fmt::format("{} bytes given but shape {} of {} needs {}", t.nbytes, shape_str(t.shape), t.dtype,
                            checked_nbytes(t.shape, elem, expect) ? fmt::to_string(expect)
                                                                  : "an invalid or overflowing size"));
        }
        if (t.nbytes > 0 && t.data == nullptr) bad("data is null");
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
        offset += t.nbytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    uint64_t header_len = text.size();

    TmpFile tmp{path + ".tmp"};
    tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (tmp.fd < 0) io_error(tmp.path, "cannot create", errno);
    write_all(tmp.path, tmp.fd, &header_len, 8);
    write_all(tmp.path, tmp.fd, text.data(), text.size());
    for (const TensorToWrite & t : tensors) write_all(tmp.path, tmp.fd, t.data, t.nbytes);
    if (::fsync(tmp.fd) != 0) io_error(tmp.path, "cannot fsync", errno);
    int fd = std::exchange(tmp.fd, -1);
    if (::close(fd) != 0) io_error(tmp.path, "cannot close", errno);
    if (::rename(tmp.path.c_str(), path.c_str()) != 0) {
        io_error(path, fmt::format("cannot rename {} over it", tmp.path), errno);
    }
    tmp.committed = true;

    // Make the rename itself durable.
    std::string dir = parent_dir(path);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) io_error(dir, "cannot open directory to fsync", errno);
    int rc = ::fsync(dfd);
    int err = errno;
    ::close(dfd);
    if (rc != 0) io_error(dir, "cannot fsync directory", err);
}

}  // namespace memfit
