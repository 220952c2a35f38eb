// TensorBoard event files (events.out.tfevents.*): scalars per step, the format TensorBoard reads.
// The file is a sequence of TFRecords, each framed as
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// where each record's data is one serialized tensorflow.Event protobuf. The first record is
// Event {wall_time, file_version: "brain.Event:2"}; each write() appends
// Event {wall_time, step, summary {value {tag, simple_value}...}}.
// The protobuf is encoded by hand (tensorboard.cpp, ~60 lines): a dependency would buy nothing
// for so little, and Debian's libprotobuf would also need the generated .proto and a build step.
// TensorBoard reads a folder of such files as one run, so each rank writes its own folder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memfit {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78); crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void * data, size_t n);
// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void * data, size_t n);

class TensorBoardWriter {
public:
    // Creates `dir` (and parents) and a new file
    // dir/events.out.tfevents.<unix seconds>.<hostname>.<pid>.memfit (should that name exist, a
    // later second is taken, so files never clobber each other and sort in creation order), whose
    // first record is the file_version Event. Throws IoError naming the path and strerror when it
    // cannot create the folder, the file or that first record.
    explicit TensorBoardWriter(const std::string & dir);
    ~TensorBoardWriter();   // closes
    TensorBoardWriter(const TensorBoardWriter &) = delete;
    TensorBoardWriter & operator=(const TensorBoardWriter &) = delete;

    // One Event {wall_time (now, seconds since the epoch), step, summary {value {tag, simple_value}...}}
    // holding every scalar (as float), written straight to the file (no user-space buffer, so
    // nothing is pending afterwards). Returns false and keeps errno's text in error() when the
    // write failed (a full disk): the partial record is cut off again, so the file stays readable
    // and the next call tries afresh. error() is cleared by a successful write. Non-finite values
    // are written as they are (TensorBoard shows NaN).
    bool write(int64_t step, const std::vector<std::pair<std::string, double>> & scalars);

    // Event {wall_time, step, session_log {status: START}}: TensorBoard then drops the events of
    // the folder's earlier files from `step` on (a resumed run's steps replace the old ones).
    // Returns false like write().
    bool session_start(int64_t step);

    const std::string & path() const { return path_; }
    const std::string & error() const { return error_; }

private:
    bool append_record(const std::string & data);   // frames and writes one TFRecord

    std::string path_;
    std::string error_;
    int         fd_ = -1;
    uint64_t    size_ = 0;   // bytes of complete records in the file
};

}  // namespace memfit
