#include "backend/collectives.h"

#include "backend/backend.h"

namespace memfit {

void Collectives::all_to_all(const void * in, void * out, size_t bytes) {
    const int R = size(), r = rank();
    const auto * send = static_cast<const char *>(in);
    auto * recv = static_cast<char *>(out);
    for (int i = 0; i < R; ++i) {
        const int dst = (r + i) % R, src = (r + R - i) % R;
        sendrecv(send + size_t(dst) * bytes, bytes, dst, 0, recv + size_t(src) * bytes, bytes, src, 0);
    }
}

size_t comm_scratch_elems(DType t, int ranks, size_t n) {
    return t == DType::f32 || ranks <= 1 ? 0 : n;
}

size_t step_scratch_elems(const Backend * sizing, DType t, int ranks, size_t n) {
    return sizing && sizing->native_16bit_sums() ? 0 : comm_scratch_elems(t, ranks, n);
}

}  // namespace memfit
