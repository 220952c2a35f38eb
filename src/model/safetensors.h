// Safetensors files: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// then the data region, with offsets relative to its start.
//
// The reader memory-maps the file read-only and checks the whole header (sizes, dtypes, shapes,
// offsets within the data, no overlaps) before handing out any pointer; a bad file throws
// FormatError naming the file and, where one is at fault, the tensor. The writer writes to
// <path>.tmp, fsyncs, and renames over <path>, so a crash leaves the old file or the new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace memfit {

class SafetensorsFile {
public:
    struct TensorInfo {
        std::string          dtype;    // "F32", "BF16", "I32", ...
        std::vector<int64_t> shape;
        const uint8_t *      data   = nullptr;  // into the mapping; not aligned beyond 1 byte
        size_t               nbytes = 0;
    };

    // Throws IoError if the file cannot be opened or mapped, FormatError if it is malformed.
    static SafetensorsFile open(const std::string & path);

    SafetensorsFile(SafetensorsFile && other) noexcept;
    SafetensorsFile & operator=(SafetensorsFile && other) noexcept;
    SafetensorsFile(const SafetensorsFile &) = delete;
    SafetensorsFile & operator=(const SafetensorsFile &) = delete;
    ~SafetensorsFile();

    const std::string & path() const { return path_; }
    const std::map<std::string, std::string> & metadata() const { return metadata_; }
    // Tensor names in the order of their data in the file.
    std::vector<std::string> names() const { return order_; }
    bool has(const std::string & name) const { return tensors_.count(name) != 0; }
    // Throws FormatError "<path>: no tensor '<name>'" for an unknown name.
    const TensorInfo & info(const std::string & name) const;

    // F32, F16, BF16 or F64 elements as float; any other dtype throws FormatError.
    std::vector<float> read_f32(const std::string & name) const;
    // I32 or I64 elements (I64 values must fit in int32); any other dtype throws FormatError.
    std::vector<int32_t> read_i32(const std::string & name) const;

private:
    SafetensorsFile() = default;
    void parse_header();
    void unmap();

    std::string path_;
    void *      map_      = nullptr;
    size_t      map_size_ = 0;
    std::map<std::string, std::string> metadata_;
    std::map<std::string, TensorInfo>  tensors_;
    std::vector<std::string>           order_;
};

struct TensorToWrite {
    std::string          name;
    std::string          dtype;   // safetensors dtype string: "F32", "BF16", "I32", ...
    std::vector<int64_t> shape;
    const void *         data   = nullptr;
    size_t               nbytes = 0;  // must equal product(shape) * dtype size
};

// Writes tensors in the given order, contiguously after a header padded with spaces to a
// multiple of 8 bytes. Throws FormatError for an inconsistent tensor (unknown dtype, nbytes not
// matching the shape, duplicate or reserved name) and IoError, with strerror, if writing fails.
void write_safetensors(const std::string & path, const std::vector<TensorToWrite> & tensors,
                       const std::map<std::string, std::string> & metadata = {});

// Bytes per element of a safetensors dtype string, or 0 if memfit does not know it.
size_t safetensors_dtype_size(const std::string & dtype);

}  // namespace memfit
