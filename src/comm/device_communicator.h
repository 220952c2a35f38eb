// The communicator a backend's memory needs: NCCL for the CUDA backend, bootstrapped through a
// host communicator over the same ranks; none for host-memory backends (use the host one).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "comm/communicator.h"

namespace memfit {

// Null when `backend` computes on host memory or `host` has one rank.
std::unique_ptr<Communicator> make_device_communicator(Communicator & host, Backend & backend);

}  // namespace memfit
