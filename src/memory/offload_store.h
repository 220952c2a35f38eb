// Where the `offloaded` category's bytes live (--offload optimizer): the master weights and
// optimizer states that leave the device. A store is one flat range of bytes; the step program's
// offloaded buffers are placed in it like persistent buffers in a region (StepMemory gives each
// its offset), and the program moves them chunk by chunk between the store and staging buffers
// in device memory (Graph::offload_read / offload_write / offload_wait), where the optimizer
// kernels update them.
//
// Two stores: a file under a directory (make_file_store, --offload-dir; any backend whose
// kernels read host memory), read and written by one I/O thread so that the next chunk's read
// and the last chunk's write overlap the update in between; and host memory next to a device
// (backend/host_store.h, pinned on CUDA).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace memfit {

class OffloadStore {
public:
    virtual ~OffloadStore() = default;
    // Obtains the store's `bytes` (once, before any copy); returns the bytes it then holds (the
    // file's size, the host block's): what the ledger counts as reserved. Error (one line, the
    // numbers and a hint) when it cannot.
    virtual uint64_t open(uint64_t bytes) = 0;
    // Copies between the store at byte `at` and `mem` (memory the backend's kernels read),
    // started here and completed by wait(slot). Several copies may share a slot.
    virtual void read_start(int slot, void * mem, uint64_t at, size_t n) = 0;
    virtual void write_start(int slot, uint64_t at, const void * mem, size_t n) = 0;
    // Blocks until the slot's copies are done; Error if one failed (the file's name, the errno).
    virtual void wait(int slot) = 0;
    // The host's access between steps (nothing in flight): `host` is host memory.
    virtual void read(void * host, uint64_t at, size_t n) = 0;
    virtual void write(uint64_t at, const void * host, size_t n) = 0;
    // Where the bytes are, for the reports: "files under DIR", "pinned host memory".
    virtual std::string where() const = 0;
};

// A file under `dir` (created, and unlinked at once so that nothing is left behind; its blocks
// are allocated by open(), so a full disk is found then and not in the middle of a step). `tag`
// goes into the file's name (the rank). Its copies need `mem` in host memory. Each write records a
// checksum of its bytes and each read checks the recorded ranges it covers: bytes changed in the
// file after this run wrote them end the run with an IoError (wait() or read()) instead of being
// trained on.
std::unique_ptr<OffloadStore> make_file_store(const std::string & dir, const std::string & tag);

}  // namespace memfit
