#include "backend/collectives.h"

#include "backend/backend.h"

namespace memfit {

size_t comm_scratch_elems(DType t, int ranks, size_t n) {
    return t == DType::f32 || ranks <= 1 ? 0 : n;
}

size_t step_scratch_elems(const Backend * sizing, DType t, int ranks, size_t n) {
    return sizing && sizing->native_16bit_sums() ? 0 : comm_scratch_elems(t, ranks, n);
}

}  // namespace memfit
