// The NCCL communicator: Communicator's collectives on device buffers of one CUDA device per
// rank, bootstrapped through an MPI (or single) communicator over the same ranks. Built when
// MEMFIT_HAVE_CUDA is defined; like mpi_communicator.h this header includes neither nccl.h nor
// a CUDA header, so any translation unit may include it.
//
// Ordering: every NCCL call is enqueued on the CUDA backend's stream (CudaBackend::stream()),
// after the kernels that produced its data and before those that consume it. "Blocking" calls
// return once enqueued: the result is there for everything ordered after it on that stream,
// which includes CudaBackend::download (it synchronises the stream). A request's wait() adds
// nothing to the stream; see nccl_communicator.cpp for the details and the limits (sums of
// 16-bit values, tags, isend).
//
// Host memory: a call whose buffers are host memory (cudaPointerGetAttributes says so) goes to
// the MPI communicator instead, with MPI's semantics, and so do all_gather_u64 and
// all_reduce_sum(double). Code that exchanges host vectors (checkpoints, reports) keeps working
// unchanged over an NCCL communicator.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace memfit {

// A communicator over the ranks of `mpi`, with one NCCL communicator under it: rank 0 makes the
// unique id and broadcasts it through mpi; every rank calls ncclCommInitRank(mpi.size(), id,
// mpi.rank()) on the device of `stream` (a cudaStream_t). Collective over mpi. `mpi` and the
// stream (so the CudaBackend that owns it) must outlive the result; communicators made by its
// split() own their MPI half and need only the stream. Destroy it before the backend.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator & mpi, void * stream);

}  // namespace memfit
