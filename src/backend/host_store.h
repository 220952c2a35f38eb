// The offload store next to a device (memory/offload_store.h): one block of the backend's
// offload host memory (pinned on CUDA), moved to and from the device by Backend::copy_start (on
// CUDA a copy stream of its own, after the kernels issued before) and waited for by the step's
// offload_wait (Backend::copy_wait: the kernels issued after it wait for the slot's copies), so
// the copies overlap the optimizer's updates in between; the host's own access synchronizes first.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "memory/offload_store.h"

namespace memfit {

std::unique_ptr<OffloadStore> make_host_store(Backend & backend);

}  // namespace memfit
