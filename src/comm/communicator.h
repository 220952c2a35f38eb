// Communicator: the collectives data-parallel training needs, over one process (every
// collective is the identity) or over MPI ranks (OpenMPI from Debian; rank and world size come
// from the launcher, `mpirun -np N memfit train ...`), and over NCCL on GPUs
// (nccl_communicator.h, device buffers on the backend's stream; device_communicator.h picks it).
//
// Buffers are host memory (NCCL: device memory) of f32, bf16 or f16 elements (DType); sums of
// 16-bit values are accumulated in fp32 and rounded once, and every rank receives the same bits.
// Every rank must call every collective in the same order with the same sizes (MPI's rule);
// communicators made by separate make_communicator() calls do not interfere. Call from one
// thread at a time.
//
// Failures (MPI): a call that fails throws CommError naming the operation, the rank and the peer.
// A process that exits with a non-zero status after starting MPI aborts the whole job
// (MPI_Abort), so a rank that fails alone never leaves the others blocked. A rank that dies is
// noticed by mpirun, which kills the rest and names it ("mpirun noticed that process rank N ...
// exited on signal S"). There is no timeout: a live rank that skips a collective blocks the others.
//
// Memory (MPI): a blocking 16-bit sum converts through an fp32 scratch of at most 16 MiB;
// iall_reduce_sum and ireduce_scatter_sum on 16-bit data hold fp32 copies until wait(), in the
// caller's `scratch` when given (comm_scratch_elems; the step program declares it, so the plan
// counts it) or else allocated by the request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace memfit {

// A non-blocking collective in flight; wait() completes it (idempotent).
class CommRequest {
public:
    virtual ~CommRequest() = default;
    virtual void wait() = 0;
    // Lets the transfer advance without blocking (MPI without a progress thread moves a
    // non-blocking collective on only inside MPI calls); wait() is still required.
    virtual void poll() {}
};

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual const char * name() const = 0;   // "single" | "mpi" | "nccl"

    // data[n] = the element-wise sum over ranks (in place).
    virtual void all_reduce_sum(void * data, size_t n, DType t) = 0;
    // The same, started now and completed by wait(): backward keeps computing meanwhile. data
    // must stay alive and untouched until wait(); destroying the request without wait() still
    // blocks until MPI is done with the buffers, but leaves data undefined. MPI (OpenMPI 4.1,
    // no progress thread) advances the transfer only inside MPI calls: poll() between
    // computations (the Graph does, before every op).
    virtual std::unique_ptr<CommRequest> iall_reduce_sum(void * data, size_t n, DType t,
                                                         float * scratch = nullptr) = 0;
    // in[size() * n] summed over ranks; this rank receives its n-element shard:
    // out[i] = sum over ranks of in[rank() * n + i]. out is disjoint from in or is this rank's
    // shard of it (out == in + rank() * n elements); in is never written.
    virtual void reduce_scatter_sum(const void * in, void * out, size_t n, DType t) = 0;
    // out[size() * bytes] = every rank's `bytes` bytes of in, in rank order. in is disjoint
    // from out or is this rank's slot of it (in == out + rank() * bytes).
    virtual void all_gather(const void * in, void * out, size_t bytes) = 0;
    // ZeRO's bucket collectives, non-blocking, with a count per rank (a bucket of the flat buffer
    // cut by the shard boundaries; counts may be 0). ireduce_scatter_sum: in holds sum(counts)
    // elements; this rank receives its counts[rank()] elements, the sum over ranks of
    // in[sum(counts[0..rank())) ...], in out (disjoint from in). iall_gather: out receives every
    // rank's counts[i] elements of `elem_bytes` bytes, in rank order; in holds this rank's (it may
    // be its own place in out). Buffers stay untouched until wait(). MPI: at most INT_MAX bytes
    // per rank (else CommError); 16-bit sums hold fp32 copies of in and out until wait().
    virtual std::unique_ptr<CommRequest> ireduce_scatter_sum(const void * in, void * out,
                                                             const std::vector<size_t> & counts, DType t,
                                                             float * scratch = nullptr) = 0;
    virtual std::unique_ptr<CommRequest> iall_gather(const void * in, void * out, const std::vector<size_t> & counts,
                                                     size_t elem_bytes) = 0;
    virtual void broadcast(void * data, size_t bytes, int root) = 0;
    // Blocking point-to-point (tag >= 0); recv's size must equal the matching send's (else
    // CommError). Messages between one pair of ranks with one tag arrive in order.
    virtual void send(const void * data, size_t bytes, int dst, int tag) = 0;
    virtual void recv(void * data, size_t bytes, int src, int tag) = 0;
    virtual void barrier() = 0;
    // Both halves of a neighbour exchange at once: `send_bytes` of `send` to rank dst (tag
    // send_tag) while `recv_bytes` arrive into `recv` from rank src (tag recv_tag); dst or src < 0
    // skips that half. Neither half waits for the other, so pipeline stages passing activations
    // one way and gradients the other cannot deadlock. The default: send, then recv (single).
    virtual void sendrecv(const void * send, size_t send_bytes, int dst, int send_tag, void * recv,
                          size_t recv_bytes, int src, int recv_tag);
    // A send started now and completed by wait() (data untouched until then): the sender goes on
    // without waiting for the receiver. Single: queued at once, like send().
    virtual std::unique_ptr<CommRequest> isend(const void * data, size_t bytes, int dst, int tag);

    // A new communicator over the ranks of this one that pass the same color (>= 0), ranked by
    // key (ties by rank here), like MPI_Comm_split. Collective: every rank of this communicator
    // calls it, in the same order as its other collectives. The result is independent of this
    // one (its own messages and collectives) and may outlive it; every rank gets one. Single:
    // another single communicator (its own mailbox).
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

    // Convenience: every rank's value, in rank order; the sum of every rank's value (gathered
    // and added in rank order, so every rank gets the same bits). Host values: virtual so that a
    // communicator of device buffers (NCCL) can pass them to its host communicator.
    virtual std::vector<uint64_t> all_gather_u64(uint64_t v);
    virtual double all_reduce_sum(double v);
};

// Single process: size 1, collectives copy or do nothing; send to rank 0 queues the message
// for a later recv with the same tag.
std::unique_ptr<Communicator> make_single_communicator();
// fp32 elements of scratch a non-blocking 16-bit sum of n elements (all-reduce, or reduce-scatter
// of n elements in all) uses over `ranks` ranks: n, or 0 for f32 or one rank. (MPI sums the fp32
// copy in place.)
size_t comm_scratch_elems(DType t, int ranks, size_t n);
// MPI when this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE /
// PMIX_RANK), else single. MPI is initialised once per process and finalised at exit.
std::unique_ptr<Communicator> make_communicator();
// True when an MPI launcher started this process.
bool launched_by_mpi();

}  // namespace memfit
