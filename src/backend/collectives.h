// Collectives: the transfers a step's Graph issues (backend/graph.h: all_reduce_start,
// reduce_scatter_start, all_gather_start, the tensor- and pipeline-parallel ops), and the
// request they return.
//
// Why it is declared here: the Graph is in backend/, and comm/ sits above backend/ (the CUDA
// communicator is built on the CUDA backend's stream). So backend/ declares the small interface
// its Graph calls, and comm's Communicator (comm/communicator.h) derives from it, adding what
// only the callers above need (blocking sums, broadcast, blocking send/receive, barrier, split).
// A Communicator * converts to a Collectives *, so the engine hands its communicators to the
// Graph unchanged. The contracts (buffers, ordering, MPI's and NCCL's behaviour) are
// Communicator's: see comm/communicator.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

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

class Collectives {
public:
    virtual ~Collectives() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;

    // The same as all_reduce_sum (data[n] = the element-wise sum over ranks, in place), started
    // now and completed by wait(): backward keeps computing meanwhile. data must stay alive and
    // untouched until wait(); destroying the request without wait() still blocks until MPI is
    // done with the buffers, but leaves data undefined. MPI (OpenMPI 4.1, no progress thread)
    // advances the transfer only inside MPI calls: poll() between computations (the Graph does,
    // before every op).
    virtual std::unique_ptr<CommRequest> iall_reduce_sum(void * data, size_t n, DType t,
                                                         float * scratch = nullptr) = 0;
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
    // Both halves of a neighbour exchange at once: `send_bytes` of `send` to rank dst (tag
    // send_tag) while `recv_bytes` arrive into `recv` from rank src (tag recv_tag); dst or src < 0
    // skips that half. Neither half waits for the other, so pipeline stages passing activations
    // one way and gradients the other cannot deadlock. (Communicator's default: send, then recv.)
    virtual void sendrecv(const void * send, size_t send_bytes, int dst, int send_tag, void * recv,
                          size_t recv_bytes, int src, int recv_tag) = 0;
    // A send started now and completed by wait() (data untouched until then): the sender goes on
    // without waiting for the receiver. (Communicator's default: a blocking send, queued at once.)
    virtual std::unique_ptr<CommRequest> isend(const void * data, size_t bytes, int dst, int tag) = 0;
    // out[r * bytes ..] = rank r's in[rank() * bytes ..], for every rank r (expert parallelism's
    // dispatch and combine): in and out hold size() blocks of `bytes`, disjoint. Blocking. The
    // default is size() sendrecv rounds, the i-th with ranks rank() +- i (round 0: itself).
    virtual void all_to_all(const void * in, void * out, size_t bytes);
};

// fp32 elements of scratch a non-blocking 16-bit sum of n elements (all-reduce, or reduce-scatter
// of n elements in all) uses over `ranks` ranks: n, or 0 for f32 or one rank. (MPI sums the fp32
// copy in place.)
size_t comm_scratch_elems(DType t, int ranks, size_t n);
// What a step recorded with `sizing` declares for it: comm_scratch_elems, or 0 where the backend's
// collectives sum 16-bit values natively (Backend::native_16bit_sums: NCCL).
class Backend;
size_t step_scratch_elems(const Backend * sizing, DType t, int ranks, size_t n);

}  // namespace memfit
