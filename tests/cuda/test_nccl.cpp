// The NCCL communicator on one process (one rank: ncclCommInitRank with size 1), bootstrapped
// through the single communicator, on the CUDA backend's stream: every collective on device
// buffers, the per-rank-count collectives with counts {n}, split, barrier, the host-value helpers
// and host buffers (passed to the bootstrap communicator), and point-to-point to oneself (a
// grouped send and receive; an isend held until the receive). With one rank a sum is the
// identity, so these check the plumbing (pointers, offsets, in-place forms, byte counts, stream
// order), not the arithmetic, which is NCCL's. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "core/dtype.h"
#include "cuda/op_check.h"

namespace memfit {
namespace {

// cudaMalloc'd bytes, freed on scope exit.
struct DevBuf {
    explicit DevBuf(size_t n) : bytes(n) {
        EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess);
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf &) = delete;
    DevBuf & operator=(const DevBuf &) = delete;
    unsigned char * at(size_t off) const { return static_cast<unsigned char *>(p) + off; }
    void * p = nullptr;
    size_t bytes;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + 7 * i + (i >> 8));
    return v;
}

// 16-bit values that are finite in both bf16 and f16 (a sum over one rank keeps their bits).
std::vector<uint8_t> halves(size_t n) {
    std::vector<uint8_t> v(2 * n);
    for (size_t i = 0; i < n; ++i) {
        const uint16_t h = uint16_t(0x3c00 + (i % 512));   // 1.0 .. and nearby in f16; small in bf16
        std::memcpy(v.data() + 2 * i, &h, 2);
    }
    return v;
}

std::vector<uint8_t> floats(size_t n) {
    std::vector<uint8_t> v(4 * n);
    for (size_t i = 0; i < n; ++i) {
        const float f = float(i) * 0.25f - 3.0f;
        std::memcpy(v.data() + 4 * i, &f, 4);
    }
    return v;
}

std::vector<uint8_t> values(DType t, size_t n) { return t == DType::f32 ? floats(n) : halves(n); }

struct Nccl {
    CudaBackend * g = nullptr;
    std::unique_ptr<Communicator> boot, comm;
    Nccl() {
        g = test::gpu();
        boot = make_single_communicator();
        comm = make_nccl_communicator(*boot, g->stream());
    }
    std::vector<uint8_t> get(const void * dev, size_t n) const {
        std::vector<uint8_t> v(n);
        g->download(v.data(), dev, n);
        return v;
    }
    void put(void * dev, const std::vector<uint8_t> & v) const { g->upload(dev, v.data(), v.size()); }
};

TEST(Nccl, OneRank) {
    MF_REQUIRE_GPU();
    Nccl n;
    EXPECT_STREQ(n.comm->name(), "nccl");
    EXPECT_EQ(n.comm->rank(), 0);
    EXPECT_EQ(n.comm->size(), 1);
}

TEST(Nccl, AllReduceOnDevice) {
    MF_REQUIRE_GPU();
    Nccl n;
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        const size_t count = 100003;   // odd, not a multiple of any vector width
        const auto want = values(t, count);
        DevBuf d(want.size());
        n.put(d.p, want);
        n.comm->all_reduce_sum(d.p, count, t);
        EXPECT_EQ(n.get(d.p, want.size()), want) << dtype_name(t);
        auto req = n.comm->iall_reduce_sum(d.p, count, t, nullptr);
        req->wait();
        req->wait();   // idempotent
        EXPECT_EQ(n.get(d.p, want.size()), want) << dtype_name(t);
        n.comm->all_reduce_sum(d.p, 0, t);   // nothing
    }
}

TEST(Nccl, ReduceScatterAndAllGather) {
    MF_REQUIRE_GPU();
    Nccl n;
    const size_t count = 4099;
    const auto want = floats(count);
    DevBuf in(want.size()), out(want.size());
    n.put(in.p, want);
    n.comm->reduce_scatter_sum(in.p, out.p, count, DType::f32);
    EXPECT_EQ(n.get(out.p, want.size()), want);
    n.comm->reduce_scatter_sum(in.p, in.p, count, DType::f32);   // in place: this rank's shard
    EXPECT_EQ(n.get(in.p, want.size()), want);

    const auto bytes = pattern(1001, 3);
    DevBuf a(bytes.size()), b(bytes.size());
    n.put(a.p, bytes);
    n.comm->all_gather(a.p, b.p, bytes.size());
    EXPECT_EQ(n.get(b.p, bytes.size()), bytes);
    n.comm->all_gather(b.p, b.p, bytes.size());   // in place
    EXPECT_EQ(n.get(b.p, bytes.size()), bytes);
}

// ZeRO's bucket collectives: counts {n} (and {0}), out of place and in place, 16-bit.
TEST(Nccl, PerRankCounts) {
    MF_REQUIRE_GPU();
    Nccl n;
    for (DType t : {DType::f32, DType::bf16}) {
        const size_t count = 3001, es = dtype_size(t);
        const auto want = values(t, count);
        DevBuf in(want.size()), out(want.size());
        n.put(in.p, want);
        auto rs = n.comm->ireduce_scatter_sum(in.p, out.p, {count}, t, nullptr);
        rs->wait();
        EXPECT_EQ(n.get(out.p, want.size()), want) << dtype_name(t);
        n.comm->ireduce_scatter_sum(in.p, out.p, {0}, t, nullptr)->wait();   // nothing

        DevBuf gathered(want.size());
        auto ag = n.comm->iall_gather(in.p, gathered.p, {count}, es);
        ag->wait();
        EXPECT_EQ(n.get(gathered.p, want.size()), want) << dtype_name(t);
        n.comm->iall_gather(gathered.p, gathered.p, {count}, es)->wait();   // in place
        EXPECT_EQ(n.get(gathered.p, want.size()), want) << dtype_name(t);
        n.comm->iall_gather(nullptr, gathered.p, {0}, es)->wait();   // nothing
    }
}

TEST(Nccl, BroadcastBarrierSplit) {
    MF_REQUIRE_GPU();
    Nccl n;
    const auto bytes = pattern(777, 11);
    DevBuf d(bytes.size());
    n.put(d.p, bytes);
    n.comm->broadcast(d.p, bytes.size(), 0);
    n.comm->barrier();
    EXPECT_EQ(n.get(d.p, bytes.size()), bytes);

    auto part = n.comm->split(0, 0);
    EXPECT_STREQ(part->name(), "nccl");
    EXPECT_EQ(part->size(), 1);
    const auto want = floats(513);
    DevBuf f(want.size());
    n.put(f.p, want);
    part->all_reduce_sum(f.p, 513, DType::f32);
    part->barrier();
    EXPECT_EQ(n.get(f.p, want.size()), want);
    n.comm.reset();   // the part outlives its parent
    part->all_reduce_sum(f.p, 513, DType::f32);
    EXPECT_EQ(n.get(f.p, want.size()), want);
}

// Host values and host buffers go to the bootstrap communicator.
TEST(Nccl, HostValuesAndBuffers) {
    MF_REQUIRE_GPU();
    Nccl n;
    EXPECT_EQ(n.comm->all_gather_u64(42), std::vector<uint64_t>{42});
    EXPECT_EQ(n.comm->all_reduce_sum(2.5), 2.5);
    std::vector<float> h = {1.0f, -2.0f, 3.5f}, g(3, 0.0f);
    n.comm->all_reduce_sum(h.data(), h.size(), DType::f32);
    EXPECT_EQ(h, (std::vector<float>{1.0f, -2.0f, 3.5f}));
    n.comm->all_gather(h.data(), g.data(), h.size() * sizeof(float));
    EXPECT_EQ(g, h);
}

// Point-to-point to oneself: NCCL allows it inside one group, which sendrecv is; an isend is
// held and enqueued in the group of the next receive.
TEST(Nccl, SendToSelf) {
    MF_REQUIRE_GPU();
    Nccl n;
    const auto bytes = pattern(4096 + 5, 29);
    DevBuf a(bytes.size()), b(bytes.size()), c(bytes.size());
    n.put(a.p, bytes);
    n.comm->sendrecv(a.p, bytes.size(), 0, 1, b.p, bytes.size(), 0, 1);
    EXPECT_EQ(n.get(b.p, bytes.size()), bytes);

    auto req = n.comm->isend(b.p, bytes.size(), 0, 2);
    n.comm->recv(c.p, bytes.size(), 0, 2);
    req->wait();
    EXPECT_EQ(n.get(c.p, bytes.size()), bytes);

    n.comm->sendrecv(nullptr, 0, -1, 0, nullptr, 0, -1, 0);   // nothing either way
}

}  // namespace
}  // namespace memfit
