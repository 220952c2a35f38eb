#include "backend/host_store.h"

#include <cstring>
#include <string>

namespace memfit {

namespace {

class HostStore final : public OffloadStore {
public:
    explicit HostStore(Backend & b) : backend_(b), alloc_(b.offload_allocator()) {}
    ~HostStore() override {
        if (!p_) return;
        backend_.synchronize();
        alloc_.release(p_, bytes_);
    }
    uint64_t open(uint64_t bytes) override {
        MF_ASSERT(!p_ && "an offload store is opened once");
        p_ = static_cast<char *>(alloc_.allocate(bytes));
        bytes_ = bytes;
        return bytes;
    }
    void read_start(int slot, void * mem, uint64_t at, size_t n) override {
        backend_.copy_start(slot, mem, p_ + at, n, true);
    }
    void write_start(int slot, uint64_t at, const void * mem, size_t n) override {
        backend_.copy_start(slot, p_ + at, mem, n, false);
    }
    void wait(int slot) override { backend_.copy_wait(slot); }
    void read(void * host, uint64_t at, size_t n) override {
        backend_.synchronize();
        std::memcpy(host, p_ + at, n);
    }
    void write(uint64_t at, const void * host, size_t n) override {
        backend_.synchronize();
        std::memcpy(p_ + at, host, n);
    }
    std::string where() const override { return backend_.host_memory() ? "host memory" : "pinned host memory"; }

private:
    Backend & backend_;
    RegionAllocator & alloc_;
    char * p_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<OffloadStore> make_host_store(Backend & backend) { return std::make_unique<HostStore>(backend); }

}  // namespace memfit
