// The emulator's own scheduler (emu_runtime.cpp), on kernels written here: block barriers and warp
// shuffles give CUDA's results with the lanes in either order (MEMFIT_EMU_ORDER), and a block
// whose lanes wait for each other forever is reported, not hung.
// Usage: emu_selftest            the results; exit 1 with the first wrong one
//        emu_selftest deadlock   a deadlocked block: the emulator's report, then abort
#include <cstdio>
#include <cstring>

#include "emu.h"

namespace {

constexpr int kThreads = 256, kBlocks = 3;

// Each lane reads another lane's shared-memory write after a barrier, then sums its warp's values
// by a butterfly of shuffles: every lane ends with its warp's sum of 255 - t.
int shared_then_shuffle() {
    static int out[kBlocks][kThreads];
    emu::launch([&] {
        __shared__ int s[kThreads];
        const int t = int(threadIdx.x);
        s[t] = t + int(blockIdx.x);
        __syncthreads();
        int v = s[kThreads - 1 - t];
        for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
        out[blockIdx.x][t] = v;
    }, dim3(kBlocks), dim3(kThreads));
    for (int b = 0; b < kBlocks; ++b)
        for (int t = 0; t < kThreads; ++t) {
            int want = 0;
            for (int l = t / 32 * 32; l < t / 32 * 32 + 32; ++l) want += kThreads - 1 - l + b;
            if (out[b][t] != want) {
                std::fprintf(stderr, "block %d thread %d: %d, not %d\n", b, t, out[b][t], want);
                return 1;
            }
        }
    return 0;
}

// __syncthreads_or over lanes that exit early: only the live lanes arrive, and the OR is theirs.
int barrier_or_with_exited_lanes() {
    static int got[64];
    emu::launch([&] {
        const int t = int(threadIdx.x);
        if (t >= 32) return;   // a whole warp leaves
        got[t] = __syncthreads_or(t == 7);
    }, dim3(1), dim3(64));
    for (int t = 0; t < 32; ++t)
        if (got[t] != 1) {
            std::fprintf(stderr, "__syncthreads_or: thread %d got %d\n", t, got[t]);
            return 1;
        }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc > 1 && std::strcmp(argv[1], "deadlock") == 0) {
        // Lane 0 waits at the block barrier, lanes 1-31 at a warp barrier lane 0 never reaches.
        emu::launch([] {
            if (threadIdx.x == 0) __syncthreads();
            else __syncwarp();
        }, dim3(1), dim3(64));
        std::puts("the deadlocked launch returned");
        return 1;
    }
    if (shared_then_shuffle() || barrier_or_with_exited_lanes()) return 1;
    std::puts("PASS");
    return 0;
}
