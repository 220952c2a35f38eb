// The offload store next to a device (memory/offload_store.h): one block of the backend's
// offload host memory (pinned on CUDA), moved to and from the device on the backend's stream
// (upload_async / download_async), so the copies are ordered with the kernels that read the
// staging buffers and no wait is needed in the step; the host's own access synchronizes first.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "memory/offload_store.h"

namespace memfit {

std::unique_ptr<OffloadStore> make_host_store(Backend & backend);

}  // namespace memfit
