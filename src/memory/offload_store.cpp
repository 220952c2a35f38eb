#include "memory/offload_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

    void sync(bool reading, char * mem, uint64_t at, size_t n) {
        MF_ASSERT(fd_ >= 0);
        if (const int e = move_all(fd_, reading, mem, at, n))
            throw IoError(fmt::format("--offload-dir {}: {} {} of the offloaded optimizer state failed ({})", dir_,
                                      reading ? "reading" : "writing", format_bytes(n), std::strerror(e)));
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
            const int e = move_all(fd_, j.reading, j.mem, j.at, j.n);
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
};

}  // namespace

std::unique_ptr<OffloadStore> make_file_store(const std::string & dir, const std::string & tag) {
    return std::make_unique<FileStore>(dir, tag);
}

}  // namespace memfit
