// The CUDA emulator's scheduler: blocks on OpenMP threads, a block's threads as fibers, barriers,
// warp exchanges and the m16n8k16 tensor-core product (emu.h says what is emulated and checked).
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "emu.h"

// Fiber switch (x86-64 System V): saves the callee-saved registers on the current stack, stores
// its pointer in *save, and continues on the stack `load` (as left by emu_switch or by
// fiber_stack()). Much cheaper than swapcontext, which makes a system call per switch.
#if !defined(__x86_64__)
#error "the CUDA emulator's fibers are written for x86-64"
#endif
extern "C" void emu_switch(void ** save, void * load);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {

namespace {

[[noreturn]] void fail(const char * fmt, ...) {
    std::va_list ap;
    va_start(ap, fmt);
    std::fputs("cuda emulator: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    std::abort();
}

constexpr size_t kStackBytes = 256 << 10;    // per fiber (a guard page below it)
constexpr size_t kMaxDynamicShared = 232448;  // an H200's opt-in limit per block
constexpr unsigned kFull = 0xffffffffu;

enum class Wait { kNone, kBlock, kWarp };
enum class WarpOp { kNone, kExchange, kMma };

}  // namespace

struct Lane {
    void * sp = nullptr;   // saved stack pointer while switched out
    uint3 tid;
    int index = 0;
    int next = 0, prev = 0;   // the live lanes' ring, in the order they run
    Wait wait = Wait::kNone;
    uint64_t wait_gen = 0;
    bool done = false;
};

struct Warp {
    int live = 0, arrived = 0;
    uint64_t gen = 0;
    WarpOp op = WarpOp::kNone;
    uint64_t val[32], snap[32];
    unsigned ballot = 0, ballot_snap = 0;
    uint32_t a[32][4], b[32][2];
    float c[32][4];
    bool bf16 = false;
};

struct BlockState {
    uint3 bid;
    dim3 bdim, gdim;
    const std::function<void()> * body = nullptr;
    std::vector<Lane> lanes;
    std::vector<Warp> warps;
    int live = 0, arrived = 0, acc_or = 0, snap_or = 0;
    uint64_t gen = 0;
    unsigned char * shared = nullptr;
    void * sched_sp = nullptr;
};

thread_local Lane * tl_lane = nullptr;
thread_local BlockState * tl_block = nullptr;

namespace {

// Per OpenMP thread: fiber stacks and the dynamic shared memory, kept from launch to launch.
struct ThreadRes {
    std::vector<char *> stacks;
    unsigned char * shared = nullptr;
    BlockState block;
    ThreadRes() {
        void * p = nullptr;
        if (posix_memalign(&p, 128, kMaxDynamicShared) != 0) fail("no host memory for shared memory");
        shared = static_cast<unsigned char *>(p);
    }
    char * stack(size_t i) {
        while (stacks.size() <= i) {
            const size_t page = size_t(sysconf(_SC_PAGESIZE));
            void * m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (m == MAP_FAILED) fail("no host memory for a fiber stack");
            mprotect(m, page, PROT_NONE);   // overflowing a stack faults instead of corrupting
            stacks.push_back(static_cast<char *>(m) + page);
        }
        return stacks[i];
    }
};
thread_local ThreadRes * tl_res = nullptr;

Warp & my_warp() { return tl_block->warps[size_t(tl_lane->index / 32)]; }

bool ready(const BlockState & b, const Lane & l) {
    switch (l.wait) {
        case Wait::kNone: return true;
        case Wait::kBlock: return b.gen > l.wait_gen;
        case Wait::kWarp: return b.warps[size_t(l.index / 32)].gen > l.wait_gen;
    }
    return false;
}

// MEMFIT_EMU_ORDER=reverse resumes the threads last to first: a missing barrier that the usual
// order happens to satisfy shows in the other.
bool reverse_order() {
    static const bool reverse = [] {
        const char * e = std::getenv("MEMFIT_EMU_ORDER");
        return e && std::strcmp(e, "reverse") == 0;
    }();
    return reverse;
}

// The first ready lane after lane `from` in the live lanes' ring, or nullptr. A lane that is done
// leaves the ring (its own `next` still leads on), so a block whose lanes mostly exited early
// does not scan them at every switch.
Lane * next_ready(BlockState & b, int from) {
    for (int k = 0, i = b.lanes[size_t(from)].next; k < b.live; ++k, i = b.lanes[size_t(i)].next) {
        Lane & l = b.lanes[size_t(i)];
        if (ready(b, l)) return &l;
    }
    return nullptr;
}

// Leaves the running lane (its stack pointer stored in *save) for the next ready lane, switching
// straight to it (one switch, not two through the scheduler: the emulator 1.6x faster), or for
// the scheduler when none is ready: every lane done, or a deadlock.
void yield_lane(void ** save) {
    Lane * next = next_ready(*tl_block, tl_lane->index);
    if (next) tl_lane = next;
    emu_switch(save, next ? next->sp : tl_block->sched_sp);
}

void wait_for(Wait w, uint64_t gen) {
    Lane * l = tl_lane;
    l->wait = w;
    l->wait_gen = gen;
    yield_lane(&l->sp);
    l->wait = Wait::kNone;
}

void release_block(BlockState & b) {
    b.snap_or = b.acc_or;
    b.acc_or = b.arrived = 0;
    ++b.gen;
}

void release_warp(Warp & w) {
    if (w.op == WarpOp::kMma) {
        // Fragments (PTX ISA, mma.m16n8k16, 16-bit A/B, f32 C/D): lane l, g = l / 4, t = l % 4.
        // A[16][16]: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..].
        // B[16][8]: b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g].  C: c0,c1 = C[g][2t..], c2,c3 = C[g+8][2t..].
        auto f16 = [&](uint32_t bits) {
            if (w.bf16) return from_bits<float>(uint64_t(bits) << 16);
            __half_raw r;
            r.x = static_cast<unsigned short>(bits);
            return __half2float(__half(r));
        };
        float A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; ++l) {
            const int g = l / 4, t = l % 4;
            for (int h = 0; h < 2; ++h) {
                A[g][2 * t + h] = f16((w.a[l][0] >> (16 * h)) & 0xffffu);
                A[g + 8][2 * t + h] = f16((w.a[l][1] >> (16 * h)) & 0xffffu);
                A[g][2 * t + 8 + h] = f16((w.a[l][2] >> (16 * h)) & 0xffffu);
                A[g + 8][2 * t + 8 + h] = f16((w.a[l][3] >> (16 * h)) & 0xffffu);
                B[2 * t + h][g] = f16((w.b[l][0] >> (16 * h)) & 0xffffu);
                B[2 * t + 8 + h][g] = f16((w.b[l][1] >> (16 * h)) & 0xffffu);
                C[g][2 * t + h] = w.c[l][h];
                C[g + 8][2 * t + h] = w.c[l][2 + h];
            }
        }
        for (int l = 0; l < 32; ++l) {
            const int g = l / 4, t = l % 4;
            for (int q = 0; q < 4; ++q) {
                const int row = g + (q >= 2 ? 8 : 0), col = 2 * t + (q & 1);
                float s = 0.0f;
                for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
                w.c[l][q] = C[row][col] + s;
            }
        }
    } else {
        for (int l = 0; l < 32; ++l) w.snap[l] = w.val[l];
        w.ballot_snap = w.ballot;
    }
    w.ballot = 0;
    w.arrived = 0;
    w.op = WarpOp::kNone;
    ++w.gen;
}

// Joins the warp operation `op` (the lane's inputs already stored) and waits for the warp.
void warp_join(unsigned mask, WarpOp op) {
    Warp & w = my_warp();
    if (mask != kFull) fail("warp operation with mask %#x: only full-warp masks are emulated", mask);
    if (w.live != 32)
        fail("warp operation (full mask) in a warp with %d live lanes of 32 (block %ux%ux%u): lanes exited early or "
             "the block size is not a multiple of 32",
             w.live, tl_block->bdim.x, tl_block->bdim.y, tl_block->bdim.z);
    if (w.arrived > 0 && w.op != op) fail("lanes of one warp are at different warp operations (divergence)");
    w.op = op;
    if (++w.arrived == w.live) release_warp(w);
    else wait_for(Wait::kWarp, w.gen);
}

void lane_main() {
    Lane * l = tl_lane;
    BlockState & b = *tl_block;
    (*b.body)();
    l->done = true;
    --b.live;
    b.lanes[size_t(l->prev)].next = l->next;
    b.lanes[size_t(l->next)].prev = l->prev;
    Warp & w = b.warps[size_t(l->index / 32)];
    --w.live;
    if (w.arrived > 0) fail("a lane exited while its warp waits at a warp operation");
    if (b.arrived > 0 && b.arrived == b.live) release_block(b);
}

// A fiber's first function, entered by emu_switch's ret; it never returns.
[[noreturn]] void fiber_start() {
    lane_main();
    void * dead = nullptr;
    yield_lane(&dead);
    __builtin_unreachable();
}

// The initial stack of a fiber: six zero registers for emu_switch to pop, then fiber_start as
// its return address; fiber_start is entered with rsp = 8 mod 16, as after a call.
void * fiber_stack(char * base, size_t bytes) {
    const uintptr_t top = (reinterpret_cast<uintptr_t>(base) + bytes) & ~uintptr_t(15);
    void ** sp = reinterpret_cast<void **>(top - 64);
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;
    sp[6] = reinterpret_cast<void *>(&fiber_start);
    sp[7] = nullptr;
    return sp;
}

void run_block(ThreadRes & r, const std::function<void()> & body, uint3 bid, dim3 grid, dim3 block, size_t smem) {
    BlockState & b = r.block;
    const int n = int(block.x * block.y * block.z);
    b.bid = bid;
    b.bdim = block;
    b.gdim = grid;
    b.body = &body;
    b.lanes.resize(size_t(n));
    b.warps.assign(size_t((n + 31) / 32), Warp{});
    for (int i = 0; i < n; i += 32) b.warps[size_t(i / 32)].live = std::min(32, n - i);
    b.live = n;
    b.arrived = b.acc_or = 0;
    b.gen = 0;
    b.shared = r.shared;
    if (smem) std::memset(r.shared, 0xff, smem);   // NaN in every float type: reading unwritten memory shows
    for (int i = 0; i < n; ++i) {
        Lane & l = b.lanes[size_t(i)];
        l.index = i;
        l.tid = uint3{unsigned(i) % block.x, unsigned(i) / block.x % block.y, unsigned(i) / (block.x * block.y)};
        l.wait = Wait::kNone;
        l.done = false;
        const int step = reverse_order() ? n - 1 : 1;   // MEMFIT_EMU_ORDER=reverse: last to first
        l.next = (i + step) % n;
        l.prev = (i + n - step) % n;
        // Each stack's top at another offset in its page: the lanes' hot stack lines fall in
        // different cache sets instead of all in one (measured: the emulator 15% faster).
        l.sp = fiber_stack(r.stack(size_t(i)), kStackBytes - size_t(i % 64) * 64);
    }
    tl_block = &b;
    // The lanes run each other in turn (yield_lane); the scheduler is back once none is ready.
    if (Lane * first = next_ready(b, reverse_order() ? 0 : n - 1)) {
        tl_lane = first;
        emu_switch(&b.sched_sp, first->sp);
    }
    if (b.live > 0) {
        int at_block = 0, at_warp = 0;
        for (const Lane & l : b.lanes) {
            if (l.done) continue;
            (l.wait == Wait::kBlock ? at_block : at_warp)++;
        }
        fail("deadlock in block (%u,%u,%u): %d threads wait at __syncthreads, %d at warp operations, %d exited",
             bid.x, bid.y, bid.z, at_block, at_warp, n - at_block - at_warp);
    }
    tl_lane = nullptr;
    tl_block = nullptr;
}

}  // namespace

const uint3 & thread_idx() { return tl_lane->tid; }
const uint3 & block_idx() { return tl_block->bid; }
const dim3 & block_dim() { return tl_block->bdim; }
const dim3 & grid_dim() { return tl_block->gdim; }
void * dynamic_shared() { return tl_block->shared; }
int lane_id() { return tl_lane->index % 32; }

int block_barrier(int pred) {
    BlockState & b = *tl_block;
    b.acc_or |= pred;
    if (++b.arrived == b.live) release_block(b);
    else wait_for(Wait::kBlock, b.gen);
    return b.snap_or;
}

uint64_t warp_exchange(unsigned mask, uint64_t v, int src) {
    const int lane = lane_id();
    Warp & w = my_warp();
    w.val[lane] = v;
    warp_join(mask, WarpOp::kExchange);
    return w.snap[src >= 0 && src < 32 ? src : lane];
}

unsigned warp_ballot(unsigned mask, int pred) {
    Warp & w = my_warp();
    if (pred) w.ballot |= 1u << lane_id();
    warp_join(mask, WarpOp::kExchange);
    return w.ballot_snap;
}

void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int lane = lane_id();
    Warp & w = my_warp();
    if (w.arrived > 0 && w.bf16 != bf16) fail("lanes of one warp issue mma with different types");
    w.bf16 = bf16;
    for (int i = 0; i < 4; ++i) {
        w.a[lane][i] = a[i];
        w.c[lane][i] = d[i];
    }
    w.b[lane][0] = b0;
    w.b[lane][1] = b1;
    warp_join(kFull, WarpOp::kMma);
    for (int i = 0; i < 4; ++i) d[i] = w.c[lane][i];
}

void launch_fn(const std::function<void()> & body, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
    flush_stream(stream);
    const uint64_t threads = uint64_t(block.x) * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64)
        fail("launch with a block of %ux%ux%u threads (1 to 1024, z at most 64)", block.x, block.y, block.z);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        fail("launch with a grid of %ux%ux%u blocks (x up to 2^31-1, y and z up to 65535)", grid.x, grid.y, grid.z);
    if (smem > kMaxDynamicShared) fail("launch with %zu bytes of dynamic shared memory (limit %zu)", smem, kMaxDynamicShared);
    const int64_t blocks = int64_t(grid.x) * grid.y * grid.z;
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
    for (int64_t i = 0; i < blocks; ++i) {
        if (!tl_res) tl_res = new ThreadRes();   // kept for the thread's life
        const uint3 bid{unsigned(i % grid.x), unsigned(i / grid.x % grid.y), unsigned(i / (int64_t(grid.x) * grid.y))};
        run_block(*tl_res, body, bid, grid, block, smem);
    }
}

}  // namespace emu
