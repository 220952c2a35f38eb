// Internal to src/comm (and its tests): the MPI implementation behind make_communicator().
// Deliberately free of mpi.h, so that nothing outside src/comm/*.cpp compiles against MPI.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/communicator.h"

namespace memfit {

// Initialises MPI on first use (MPI_Init_thread, MPI_THREAD_SERIALIZED) and returns a
// communicator over a duplicate of MPI_COMM_WORLD. Collective: every rank calls it, in the same
// order as any other communicator construction.
std::unique_ptr<Communicator> make_mpi_communicator();

namespace detail {
// The most elements (collectives) or bytes (all_gather, broadcast, send/recv) passed to one MPI
// call; MPI counts are int, so the default is INT_MAX. Tests lower it to exercise the chunked
// paths without multi-GB buffers. Every rank must set the same value. Returns the previous one.
size_t set_mpi_max_count(size_t n);
// The most fp32 elements of scratch a blocking 16-bit sum converts at a time (default 4 Mi,
// 16 MiB). Returns the previous value.
size_t set_mpi_scratch_elems(size_t n);
}  // namespace detail

}  // namespace memfit
