// The communicator the MPI tests share: made once by main() (tests/mpi/main.cpp) through
// make_communicator(), so MPI over every rank under mpirun, single when run directly.
#pragma once

#include "comm/communicator.h"

namespace memfit::test {

Communicator & world();

}  // namespace memfit::test
