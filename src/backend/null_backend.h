// The null backend: every op does nothing and no query needs scratch. Plans and
// dry runs record programs against it; backends that only answer sizing queries derive from it.
#pragma once

#include "backend/backend.h"

namespace memfit {

class NullBackend : public Backend {
public:
    const char * name() const override { return "null"; }
    // The kernels (backend/kernel_list.h).
#define MF_KERNEL(name, params) void name params override {}
#include "backend/kernel_list.h"
#undef MF_KERNEL
    size_t flash_attention_workspace(int64_t, int64_t, int64_t, int, DType) const override { return 0; }
    void dora_norm_packed(Tensor, const QuantDesc &, Tensor, int64_t, Tensor, Tensor, float, Tensor) override {}
};

}  // namespace memfit
