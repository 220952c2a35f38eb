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

#include "backend/collectives.h"
#include "core/dtype.h"
#include "core/error.h"

namespace memfit {

// CommRequest, and the collectives the step's Graph issues (rank, size, iall_reduce_sum,
// all_gather, ireduce_scatter_sum, iall_gather, sendrecv, isend), are declared by
// backend/collectives.h (Collectives, which Communicator extends: the Graph is below comm/).
class Communicator : public Collectives {
public:
    virtual const char * name() const = 0;   // "single" | "mpi" | "nccl"

    // data[n] = the element-wise sum over ranks (in place). (iall_reduce_sum: Collectives.)
    virtual void all_reduce_sum(void * data, size_t n, DType t) = 0;
    // in[size() * n] summed over ranks; this rank receives its n-element shard:
    // out[i] = sum over ranks of in[rank() * n + i]. out is disjoint from in or is this rank's
    // shard of it (out == in + rank() * n elements); in is never written.
    virtual void reduce_scatter_sum(const void * in, void * out, size_t n, DType t) = 0;
    virtual void broadcast(void * data, size_t bytes, int root) = 0;
    // Blocking point-to-point (tag >= 0); recv's size must equal the matching send's (else
    // CommError). Messages between one pair of ranks with one tag arrive in order.
    virtual void send(const void * data, size_t bytes, int dst, int tag) = 0;
    virtual void recv(void * data, size_t bytes, int src, int tag) = 0;
    virtual void barrier() = 0;
    // The defaults of Collectives' point-to-point pair: send, then recv; a blocking send
    // (single: queued at once, like send()).
    void sendrecv(const void * send, size_t send_bytes, int dst, int send_tag, void * recv, size_t recv_bytes,
                  int src, int recv_tag) override;
    std::unique_ptr<CommRequest> isend(const void * data, size_t bytes, int dst, int tag) override;

    // A new communicator over the ranks of this one that pass the same color (>= 0), ranked by
    // key (ties by rank here), like MPI_Comm_split. Collective: every rank of this communicator
    // calls it, in the same order as its other collectives. The result is independent of this
    // one (its own messages and collectives) and may outlive it; every rank gets one. Single:
    // another single communicator (its own mailbox).
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

    // Makes isend never hold up the calls after it until the peer receives, as MPI's does (the
    // interleaved pipeline schedule, whose sends are outstanding while it receives). Collective,
    // once, before any point-to-point call. A no-op where sends already behave so (MPI, single);
    // NCCL: per-sender communicators and a stream of their own (nccl_communicator.cpp).
    virtual void open_send_channels() {}

    // Convenience: every rank's value, in rank order; the sum of every rank's value (gathered
    // and added in rank order, so every rank gets the same bits). Host values: virtual so that a
    // communicator of device buffers (NCCL) can pass them to its host communicator.
    virtual std::vector<uint64_t> all_gather_u64(uint64_t v);
    virtual double all_reduce_sum(double v);
};

// Single process: size 1, collectives copy or do nothing; send to rank 0 queues the message
// for a later recv with the same tag.
std::unique_ptr<Communicator> make_single_communicator();
// comm_scratch_elems (the fp32 scratch of a non-blocking 16-bit sum): backend/collectives.h.
// MPI when this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE /
// PMIX_RANK), else single. MPI is initialised once per process and finalised at exit.
std::unique_ptr<Communicator> make_communicator();
// True when an MPI launcher started this process.
bool launched_by_mpi();

// The watchdog (MPI): a collective or exchange that has not completed within `seconds` ends
// every rank (MPI_Abort) with one line naming the operation, the step, and the ranks that did not
// arrive (those that do not answer a census from the ranks waiting: computing elsewhere, hung or
// exited). 0: wait forever. Default 600.
void set_comm_timeout(double seconds);
// The training step the next collectives belong to (named in the watchdog's message; -1: none).
void set_comm_step(long step);

}  // namespace memfit
