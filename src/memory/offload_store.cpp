#include "memory/offload_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace memfit {

namespace {

// A checksum of n bytes: four independent multiply-xorshift lanes over 8-byte words (several
// GB/s, beside the disk's one or two), for the offload file's writes. Not cryptographic.
uint64_t checksum(const char * p, size_t n) {
    const auto mix = [](uint64_t x) {   // the murmur3/splitmix finalizer constants (public facts)
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ull;
        return x ^ (x >> 33);
    };
    uint64_t lane[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            std::memcpy(&w, p + i + 8 * size_t(k), 8);
            lane[k] = (lane[k] ^ w) * 0x9fb21c651e98df25ull;
            lane[k] ^= lane[k] >> 29;
        }
    uint64_t h = mix(lane[0]) ^ mix(lane[1] + 1) ^ mix(lane[2] + 2) ^ mix(lane[3] + 3);
    for (; i < n; ++i) h = mix(h ^ uint8_t(p[i]));
    return mix(h ^ n);
}

// What the file's writes left: a checksum per written range [at, at + n), the ranges disjoint.
// A read checks every recorded range it covers whole; a write replaces the ranges it overlaps (a
// range it overlaps in part is no longer checked until written again). The step program reads
// and writes the same chunks, so after one step every chunk of the state is checked on each read.
class Checksums {
public:
    void wrote(uint64_t at, uint64_t n, uint64_t sum) {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = ranges_.lower_bound(at);
        if (it != ranges_.begin() && std::prev(it)->first + std::prev(it)->second.n > at) --it;
        while (it != ranges_.end() && it->first < at + n) it = ranges_.erase(it);
        ranges_[at] = Range{n, sum};
    }
    // The first recorded range within [at, at + n) whose bytes (in `mem`, holding [at, at + n))
    // differ from what was written; -1 when none.
    int64_t first_changed(uint64_t at, uint64_t n, const char * mem) const {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = ranges_.lower_bound(at); it != ranges_.end() && it->first + it->second.n <= at + n; ++it)
            if (checksum(mem + (it->first - at), it->second.n) != it->second.sum) return int64_t(it->first);
        return -1;
    }

private:
    struct Range { uint64_t n, sum; };
    mutable std::mutex mu_;
    std::map<uint64_t, Range> ranges_;
};

// pread/pwrite until all n bytes moved; an errno (or EIO on an early end of file) otherwise.
int move_all(int fd, bool reading, char * mem, uint64_t at, size_t n) {
    while (n > 0) {
        const ssize_t k = reading ? ::pread(fd, mem, n, off_t(at)) : ::pwrite(fd, mem, n, off_t(at));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : EIO;
        mem += k, at += uint64_t(k), n -= size_t(k);
    }
    return 0;
}

class FileStore final : public OffloadStore {
public:
    FileStore(std::string dir, std::string tag) : dir_(std::move(dir)), tag_(std::move(tag)) {}
    ~FileStore() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (worker_.joinable()) worker_.join();
        if (fd_ >= 0) ::close(fd_);
    }

    uint64_t open(uint64_t bytes) override {
        MF_ASSERT(fd_ < 0 && "an offload store is opened once");
        struct stat st {};
        const int found = ::stat(dir_.c_str(), &st) == 0 ? 0 : errno;
        if (found != 0 || !S_ISDIR(st.st_mode))
            throw IoError(fmt::format("--offload-dir {}: not a directory ({}); create it, or point it at one",
                                      dir_, std::strerror(found != 0 ? found : ENOTDIR)));
        std::string path = fmt::format("{}/memfit-offload-{}-XXXXXX", dir_, tag_);
        std::vector<char> name(path.begin(), path.end());
        name.push_back('\0');
        fd_ = ::mkstemp(name.data());
        if (fd_ < 0)
            throw IoError(fmt::format("--offload-dir {}: cannot create a file there ({}); check its permissions",
                                      dir_, std::strerror(errno)));
        path_ = name.data();
        ::unlink(path_.c_str());   // the open descriptor keeps it; nothing is left behind after the run
        if (bytes > 0) {
            const int e = ::posix_fallocate(fd_, 0, off_t(bytes));
            if (e != 0)
                throw IoError(fmt::format("--offload-dir {}: cannot hold the {} of offloaded optimizer state ({}); "
                                          "free space there, or lower --offload-fraction",
                                          dir_, format_bytes(bytes), std::strerror(e)));
        }
        if (::fstat(fd_, &st) != 0) throw IoError(fmt::format("{}: {}", path_, std::strerror(errno)));
        worker_ = std::thread([this] { work(); });
        return uint64_t(st.st_size);
    }

    void read_start(int slot, void * mem, uint64_t at, size_t n) override { post(Job{slot, true, static_cast<char *>(mem), at, n}); }
    void write_start(int slot, uint64_t at, const void * mem, size_t n) override {
        post(Job{slot, false, static_cast<char *>(const_cast<void *>(mem)), at, n});
    }

    void wait(int slot) override {
        std::unique_lock<std::mutex> lk(mu_);
        done_.wait(lk, [&] { return pending_[slot] == 0; });
        const int e = failed_[slot];
        failed_[slot] = 0;
        if (e == EBADMSG) throw_changed();
        if (e) throw IoError(fmt::format("--offload-dir {}: a read or write of the offloaded optimizer state failed ({})",
                                         dir_, std::strerror(e)));
    }

    void read(void * host, uint64_t at, size_t n) override { sync(true, static_cast<char *>(host), at, n); }
    void write(uint64_t at, const void * host, size_t n) override {
        sync(false, static_cast<char *>(const_cast<void *>(host)), at, n);
    }
    std::string where() const override { return "a file under " + dir_; }

private:
    struct Job { int slot; bool reading; char * mem; uint64_t at; size_t n; };

    // move_all, then the checksums: a write records its bytes', a read checks what it covers
    // (EBADMSG, with changed_at_, when bytes differ from what this run wrote there).
    int move_checked(bool reading, char * mem, uint64_t at, size_t n) {
        if (!reading) sums_.wrote(at, n, checksum(mem, n));
        const int e = move_all(fd_, reading, mem, at, n);
        if (e || !reading) return e;
        const int64_t changed = sums_.first_changed(at, n, mem);
        if (changed < 0) return 0;
        changed_at_ = uint64_t(changed);
        return EBADMSG;
    }
    [[noreturn]] void throw_changed() const {
        throw IoError(fmt::format("--offload-dir {}: the offloaded optimizer state changed on disk after this run wrote "
                                  "it (at byte {} of {}): something else wrote the file, or the disk returned other "
                                  "bytes; the run stops before training on them (resume from its last checkpoint)",
                                  dir_, changed_at_.load(), path_));
    }
    void sync(bool reading, char * mem, uint64_t at, size_t n) {
        MF_ASSERT(fd_ >= 0);
        if (const int e = move_checked(reading, mem, at, n)) {
            if (e == EBADMSG) throw_changed();
            throw IoError(fmt::format("--offload-dir {}: {} {} of the offloaded optimizer state failed ({})", dir_,
                                      reading ? "reading" : "writing", format_bytes(n), std::strerror(e)));
        }
    }
    void post(Job j) {
        MF_ASSERT(fd_ >= 0 && "open() the offload store before copying");
        {
            std::lock_guard<std::mutex> lk(mu_);
            ++pending_[j.slot];
            jobs_.push_back(j);
        }
        cv_.notify_one();
    }
    void work() {
        for (;;) {
            Job j;
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
                if (jobs_.empty()) return;
                j = jobs_.front();
                jobs_.pop_front();
            }
            const int e = move_checked(j.reading, j.mem, j.at, j.n);
            {
                std::lock_guard<std::mutex> lk(mu_);
                if (e && !failed_[j.slot]) failed_[j.slot] = e;
                --pending_[j.slot];
            }
            done_.notify_all();
        }
    }

    std::string dir_, tag_, path_;
    int fd_ = -1;
    std::thread worker_;
    std::mutex mu_;
    std::condition_variable cv_, done_;
    std::deque<Job> jobs_;
    std::map<int, int> pending_, failed_;
    bool stop_ = false;
    Checksums sums_;
    std::atomic<uint64_t> changed_at_{0};
};

}  // namespace

std::unique_ptr<OffloadStore> make_file_store(const std::string & dir, const std::string & tag) {
    return std::make_unique<FileStore>(dir, tag);
}

}  // namespace memfit
