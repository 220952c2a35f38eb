// The communicator over MPI ranks (memfit_mpi_tests, run by mpirun with 2 and 4 ranks), and the
// single communicator inside an MPI job. Every rank computes the expected result of a
// collective locally from the same per-rank generator. Test values are chosen so that fp32 sums
// over up to 4 ranks are exact whatever the order MPI adds them in: the checks are bitwise, and
// 16-bit sums are the exact sum rounded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "mpi_test_env.h"

namespace memfit::test {
namespace {

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Rank r's value at index i: k * 2^-(2..6) with |k| small enough for t to hold it exactly
// (8 significant bits for bf16, 11 for f16, 17 for f32): with the 4 bits of exponent spread,
// sums over <= 8 ranks need at most 24 bits, exact in fp32 in any order.
float value(int r, size_t i, DType t, uint64_t salt = 0) {
    const uint64_t h = mix(mix(static_cast<uint64_t>(r) * 1000003u + salt) ^ i);
    const int64_t kmax = t == DType::bf16 ? 255 : t == DType::f16 ? 2047 : (1 << 16);
    const int64_t k = static_cast<int64_t>(h % static_cast<uint64_t>(2 * kmax + 1)) - kmax;
    const int e = 2 + static_cast<int>((h >> 40) % 5);
    return std::ldexp(static_cast<float>(k), -e);
}

float round_to(float x, DType t) {
    if (t == DType::bf16) return to_f32(from_f32<bf16_t>(x));
    if (t == DType::f16) return to_f32(from_f32<f16_t>(x));
    return x;
}

// A buffer of n elements of type t.
struct Buf {
    DType t;
    std::vector<unsigned char> bytes;
    Buf(DType type, size_t n) : t(type), bytes(n * dtype_size(type)) {}
    size_t n() const { return bytes.size() / dtype_size(t); }
    void * data() { return bytes.data(); }
    float get(size_t i) const {
        if (t == DType::f32) { float f; std::memcpy(&f, bytes.data() + 4 * i, 4); return f; }
        uint16_t h; std::memcpy(&h, bytes.data() + 2 * i, 2);
        return t == DType::bf16 ? to_f32(bf16_t{h}) : to_f32(f16_t{h});
    }
    void set(size_t i, float v) {
        if (t == DType::f32) { std::memcpy(bytes.data() + 4 * i, &v, 4); return; }
        const uint16_t h = t == DType::bf16 ? from_f32<bf16_t>(v).bits : from_f32<f16_t>(v).bits;
        std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
};

// This rank's input: element i of block b (offset b * n) is value(rank, b * n + i).
Buf input(DType t, size_t n, int rank, uint64_t salt = 0) {
    Buf b(t, n);
    for (size_t i = 0; i < n; ++i) b.set(i, value(rank, i, t, salt));
    return b;
}

float expected_sum(size_t i, DType t, int size, uint64_t salt = 0) {
    float s = 0.0f;
    for (int r = 0; r < size; ++r) s += value(r, i, t, salt);
    return round_to(s, t);
}

// Compares got[i] with want(i) bitwise for i < n; reports the count and the first mismatch.
template <class F>
::testing::AssertionResult all_equal(const Buf & got, size_t first, size_t n, F want) {
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < n; ++i) {
        const float g = got.get(first + i), w = want(i);
        if (std::memcmp(&g, &w, 4) != 0 && bad++ == 0) first_bad = i;
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " of " << n << " elements differ on rank " << world().rank()
                                         << "; first at " << first_bad << ": got " << got.get(first + first_bad)
                                         << ", want " << want(first_bad);
}

uint64_t fnv1a(const void * p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char *>(p)[i]) * 1099511628211ull;
    return h;
}

// Lowers the MPI chunk limits for one test, restoring them after.
struct SmallChunks {
    size_t old_count, old_scratch;
    SmallChunks(size_t count, size_t scratch)
        : old_count(detail::set_mpi_max_count(count)), old_scratch(detail::set_mpi_scratch_elems(scratch)) {}
    ~SmallChunks() {
        detail::set_mpi_max_count(old_count);
        detail::set_mpi_scratch_elems(old_scratch);
    }
    SmallChunks(const SmallChunks &) = delete;
    SmallChunks & operator=(const SmallChunks &) = delete;
};

// ---------------------------------------------------------------------------------------------

TEST(MpiComm, RanksAndSize) {
    Communicator & c = world();
    if (launched_by_mpi()) {
        EXPECT_STREQ(c.name(), "mpi");
        if (const char * s = std::getenv("OMPI_COMM_WORLD_SIZE")) {
            EXPECT_EQ(c.size(), std::atoi(s));
        }
    }
    ASSERT_GE(c.size(), 1);
    const std::vector<uint64_t> ranks = c.all_gather_u64(static_cast<uint64_t>(c.rank()));
    ASSERT_EQ(ranks.size(), static_cast<size_t>(c.size()));
    for (int r = 0; r < c.size(); ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], static_cast<uint64_t>(r));
}

TEST(MpiComm, AllGatherU64AndDoubleSum) {
    Communicator & c = world();
    const uint64_t mine = (uint64_t(1) << 40) + 3u * static_cast<uint64_t>(c.rank());
    const std::vector<uint64_t> all = c.all_gather_u64(mine);
    for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], (uint64_t(1) << 40) + 3u * uint64_t(r));
    double want = 0.0;
    for (int r = 0; r < c.size(); ++r) want += 0.1 * (r + 1);   // in rank order, like the helper
    EXPECT_EQ(c.all_reduce_sum(0.1 * (c.rank() + 1)), want);
}

class MpiCommT : public ::testing::TestWithParam<DType> {};

TEST_P(MpiCommT, AllReduceUnevenSizes) {
    Communicator & c = world();
    const DType t = GetParam();
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(65537)}) {
        Buf b = input(t, n, c.rank(), n);
        c.all_reduce_sum(b.data(), n, t);
        EXPECT_TRUE(all_equal(b, 0, n, [&](size_t i) { return expected_sum(i, t, c.size(), n); })) << "n=" << n;
    }
    c.all_reduce_sum(nullptr, 0, t);   // an empty sum is allowed
}

TEST_P(MpiCommT, AllReduceLargeBufferSameBitsOnEveryRank) {
    Communicator & c = world();
    const DType t = GetParam();
    const size_t n = (size_t(4) << 20) / dtype_size(t) + 3;   // ~4 MB
    Buf b = input(t, n, c.rank(), 99);
    c.all_reduce_sum(b.data(), n, t);
    EXPECT_TRUE(all_equal(b, 0, n, [&](size_t i) { return expected_sum(i, t, c.size(), 99); }));
    // Arbitrary (inexact) values: whatever MPI's association, every rank holds the same bits.
    std::vector<float> f(300001);
    for (size_t i = 0; i < f.size(); ++i)
        f[i] = static_cast<float>(std::sin(double(i) * 0.37 + c.rank())) * 1e3f / float(i + 1);
    Buf r(t, f.size());
    for (size_t i = 0; i < f.size(); ++i) r.set(i, f[i]);
    c.all_reduce_sum(r.data(), r.n(), t);
    const std::vector<uint64_t> h = c.all_gather_u64(fnv1a(r.bytes.data(), r.bytes.size()));
    for (uint64_t x : h) EXPECT_EQ(x, h[0]);
}

TEST_P(MpiCommT, SixteenBitSumsRoundOnce) {
    // Rank 0 holds 256 (bf16) or 2048 (f16), every other rank 1: one rounding of the exact sum
    // gives 260 / 2052 on 4 ranks; pairwise 16-bit sums would stay at 256 / 2048 (ties to even).
    Communicator & c = world();
    const DType t = GetParam();
    const float big = t == DType::f16 ? 2048.0f : 256.0f;
    Buf b(t, 3);
    for (size_t i = 0; i < 3; ++i) b.set(i, c.rank() == 0 ? big : 1.0f);
    c.all_reduce_sum(b.data(), 3, t);
    const float want = round_to(big + float(c.size() - 1), t);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b.get(i), want);
    if (c.size() == 4 && t != DType::f32) {
        EXPECT_EQ(b.get(0), big + 4.0f);
    }
    // The same through reduce_scatter and iall_reduce.
    Buf in(t, 2 * static_cast<size_t>(c.size())), out(t, 2);
    for (size_t i = 0; i < in.n(); ++i) in.set(i, c.rank() == 0 ? big : 1.0f);
    c.reduce_scatter_sum(in.data(), out.data(), 2, t);
    EXPECT_EQ(out.get(0), want);
    EXPECT_EQ(out.get(1), want);
    for (size_t i = 0; i < 3; ++i) b.set(i, c.rank() == 0 ? big : 1.0f);
    c.iall_reduce_sum(b.data(), 3, t)->wait();
    EXPECT_EQ(b.get(2), want);
}

TEST_P(MpiCommT, IallReduceOverlapsLocalWork) {
    Communicator & c = world();
    const DType t = GetParam();
    const size_t n1 = (size_t(2) << 20) / dtype_size(t) + 5, n2 = 4099;
    Buf a = input(t, n1, c.rank(), 1), b = input(t, n2, c.rank(), 2);
    auto ra = c.iall_reduce_sum(a.data(), n1, t);
    auto rb = c.iall_reduce_sum(b.data(), n2, t);
    // Local work while both are in flight (backward computing the next bucket).
    std::vector<double> work(1 << 18);
    double acc = 0.0;
    for (int rep = 0; rep < 8; ++rep)
        for (size_t i = 0; i < work.size(); ++i) acc += (work[i] = std::sqrt(double(i + rep)));
    EXPECT_GT(acc, 0.0);
    rb->wait();   // completed in any order
    ra->wait();
    ra->wait();   // idempotent
    EXPECT_TRUE(all_equal(a, 0, n1, [&](size_t i) { return expected_sum(i, t, c.size(), 1); }));
    EXPECT_TRUE(all_equal(b, 0, n2, [&](size_t i) { return expected_sum(i, t, c.size(), 2); }));
    // A request destroyed without wait() still completes (no dangling MPI access).
    Buf d = input(t, 1000, c.rank(), 3);
    c.iall_reduce_sum(d.data(), 1000, t).reset();
    c.barrier();
}

TEST_P(MpiCommT, ReduceScatterUnevenAndInPlace) {
    Communicator & c = world();
    const DType t = GetParam();
    const size_t R = static_cast<size_t>(c.size()), me = static_cast<size_t>(c.rank());
    for (size_t n : {size_t(1), size_t(5), size_t(12345), (size_t(1) << 20) / dtype_size(t) + 1}) {
        const Buf in = input(t, R * n, c.rank(), 7 + n);
        Buf copy = in, out(t, n);
        c.reduce_scatter_sum(copy.data(), out.data(), n, t);
        EXPECT_TRUE(copy.bytes == in.bytes) << "input must not change";
        EXPECT_TRUE(all_equal(out, 0, n, [&](size_t i) { return expected_sum(me * n + i, t, c.size(), 7 + n); }))
            << "n=" << n;
        // In place: out is this rank's shard of in.
        Buf inplace = in;
        unsigned char * shard = inplace.bytes.data() + me * n * dtype_size(t);
        c.reduce_scatter_sum(inplace.data(), shard, n, t);
        EXPECT_TRUE(all_equal(inplace, me * n, n,
                              [&](size_t i) { return expected_sum(me * n + i, t, c.size(), 7 + n); }))
            << "in place, n=" << n;
    }
}

// ZeRO's bucket collectives: counts per rank (some 0), with the request's own fp32 copies and
// with the caller's scratch (comm_scratch_elems), which is what the step program declares.
TEST_P(MpiCommT, VariableCountReduceScatterAndAllGather) {
    Communicator & c = world();
    const DType t = GetParam();
    const size_t R = static_cast<size_t>(c.size()), me = static_cast<size_t>(c.rank()), es = dtype_size(t);
    std::vector<size_t> counts;
    for (size_t r = 0; r < R; ++r) counts.push_back(r == 1 ? 0 : 3 + 1000 * r);   // rank 1 gets none
    size_t total = 0, first = 0;
    for (size_t r = 0; r < R; ++r) {
        if (r == me) first = total;
        total += counts[r];
    }
    for (bool with_scratch : {false, true}) {
        const Buf in = input(t, total, c.rank(), 11);
        Buf copy = in, out(t, std::max<size_t>(counts[me], 1));
        std::vector<float> scratch(comm_scratch_elems(t, c.size(), total) + 1, -7.0f);
        auto req = c.ireduce_scatter_sum(copy.data(), out.data(), counts, t, with_scratch ? scratch.data() : nullptr);
        req->wait();
        EXPECT_TRUE(copy.bytes == in.bytes) << "input must not change";
        EXPECT_TRUE(all_equal(out, 0, counts[me], [&](size_t i) { return expected_sum(first + i, t, c.size(), 11); }))
            << (with_scratch ? "caller's scratch" : "own copies");
        EXPECT_EQ(scratch.back(), -7.0f) << "scratch overrun";
        // Every rank's piece gathered back, in place and not.
        Buf all(t, total), again(t, total);
        auto g1 = c.iall_gather(out.data(), all.data(), counts, es);
        g1->wait();
        EXPECT_TRUE(all_equal(all, 0, total, [&](size_t i) { return expected_sum(i, t, c.size(), 11); }));
        std::memcpy(again.bytes.data() + first * es, out.data(), counts[me] * es);
        c.iall_gather(again.bytes.data() + first * es, again.data(), counts, es)->wait();
        EXPECT_TRUE(again.bytes == all.bytes) << "in place";
    }
    EXPECT_EQ(comm_scratch_elems(DType::f32, 4, 100), 0u);
    EXPECT_EQ(comm_scratch_elems(DType::bf16, 1, 100), 0u);
    EXPECT_EQ(comm_scratch_elems(DType::bf16, 2, 100), 100u);
}

INSTANTIATE_TEST_SUITE_P(Types, MpiCommT, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType> & p) { return std::string(dtype_name(p.param)); });

TEST(MpiComm, AllGatherUnevenLargeAndInPlace) {
    Communicator & c = world();
    const size_t R = static_cast<size_t>(c.size()), me = static_cast<size_t>(c.rank());
    for (size_t bytes : {size_t(1), size_t(3), size_t(1001), size_t(3) << 20}) {
        auto byte_of = [&](size_t r, size_t i) { return static_cast<unsigned char>(mix(r * 7919u + i + bytes)); };
        std::vector<unsigned char> in(bytes), out(R * bytes, 0xAA);
        for (size_t i = 0; i < bytes; ++i) in[i] = byte_of(me, i);
        c.all_gather(in.data(), out.data(), bytes);
        size_t bad = 0;
        for (size_t r = 0; r < R; ++r)
            for (size_t i = 0; i < bytes; ++i) bad += out[r * bytes + i] != byte_of(r, i);
        EXPECT_EQ(bad, 0u) << "bytes=" << bytes;
        // In place: this rank's slot of out already holds its bytes.
        std::vector<unsigned char> io(R * bytes, 0x55);
        std::memcpy(io.data() + me * bytes, in.data(), bytes);
        c.all_gather(io.data() + me * bytes, io.data(), bytes);
        EXPECT_TRUE(io == out) << "in place, bytes=" << bytes;
    }
}

TEST(MpiComm, BroadcastFromEveryRoot) {
    Communicator & c = world();
    for (int root = c.size() - 1; root >= 0; --root) {   // the last rank first: a non-zero root
        for (size_t bytes : {size_t(0), size_t(13), (size_t(5) << 19) + 7}) {
            std::vector<unsigned char> v(bytes);
            for (size_t i = 0; i < bytes; ++i)
                v[i] = static_cast<unsigned char>(c.rank() == root ? mix(i + 31u * unsigned(root)) : 0);
            c.broadcast(v.data(), bytes, root);
            size_t bad = 0;
            for (size_t i = 0; i < bytes; ++i) bad += v[i] != static_cast<unsigned char>(mix(i + 31u * unsigned(root)));
            EXPECT_EQ(bad, 0u) << "root " << root << ", " << bytes << " bytes";
        }
    }
}

// Each rank sends to the next and receives from the previous. Even ranks send first, odd ranks
// receive first, so blocking sends of large (rendezvous) messages cannot deadlock.
TEST(MpiComm, SendRecvRing) {
    Communicator & c = world();
    const int R = c.size(), me = c.rank();
    const int next = (me + 1) % R, prev = (me + R - 1) % R;
    for (size_t bytes : {size_t(0), size_t(1), size_t(777), size_t(3) << 20}) {
        auto payload = [&](int from, int tag) {
            std::vector<unsigned char> v(bytes);
            for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(mix(uint64_t(from) * 131u + uint64_t(tag) + i));
            return v;
        };
        const std::vector<unsigned char> a = payload(me, 5), b = payload(me, 6);
        std::vector<unsigned char> ga(bytes), gb(bytes);
        auto sends = [&] { c.send(a.data(), bytes, next, 5); c.send(b.data(), bytes, next, 6); };
        auto recvs = [&] { c.recv(ga.data(), bytes, prev, 5); c.recv(gb.data(), bytes, prev, 6); };
        if (me % 2 == 0 && R > 1) { sends(); recvs(); } else if (R > 1) { recvs(); sends(); } else { sends(); recvs(); }
        EXPECT_TRUE(ga == payload(prev, 5)) << bytes << " bytes, tag 5";
        EXPECT_TRUE(gb == payload(prev, 6)) << bytes << " bytes, tag 6";
    }
}

TEST(MpiComm, RecvOfTheWrongSizeIsACommError) {
    Communicator & c = world();
    if (c.size() < 2) GTEST_SKIP() << "needs two ranks";
    const uint64_t eight = 42;
    if (c.rank() == 0) {
        c.send(&eight, 8, 1, 9);   // shorter than the receiver expects
        c.send(&eight, 8, 1, 10);  // longer than the receiver expects (truncation)
    } else if (c.rank() == 1) {
        unsigned char buf[16];
        EXPECT_THROW(c.recv(buf, 16, 0, 9), CommError);
        try {
            c.recv(buf, 4, 0, 10);
            ADD_FAILURE() << "a truncated recv must throw";
        } catch (const CommError & e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("Recv"), std::string::npos) << msg;
            EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
            EXPECT_NE(msg.find("peer rank 0"), std::string::npos) << msg;
        }
    }
    c.barrier();
}

// Chunk limits of a few hundred elements/bytes take every chunked path (counts above INT_MAX
// in production) with small buffers.
TEST(MpiComm, ChunkedPaths) {
    Communicator & c = world();
    SmallChunks small(1000, 333);
    const size_t R = static_cast<size_t>(c.size()), me = static_cast<size_t>(c.rank());
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        const size_t n = 10007;
        Buf a = input(t, n, c.rank(), 11);
        c.all_reduce_sum(a.data(), n, t);
        EXPECT_TRUE(all_equal(a, 0, n, [&](size_t i) { return expected_sum(i, t, c.size(), 11); })) << dtype_name(t);
        Buf b = input(t, n, c.rank(), 12);
        c.iall_reduce_sum(b.data(), n, t)->wait();
        EXPECT_TRUE(all_equal(b, 0, n, [&](size_t i) { return expected_sum(i, t, c.size(), 12); })) << dtype_name(t);
        const Buf in = input(t, R * n, c.rank(), 13);
        Buf out(t, n);
        c.reduce_scatter_sum(in.bytes.data(), out.data(), n, t);
        EXPECT_TRUE(all_equal(out, 0, n, [&](size_t i) { return expected_sum(me * n + i, t, c.size(), 13); }))
            << dtype_name(t);
    }
    const size_t bytes = 4321;
    std::vector<unsigned char> in(bytes), out(R * bytes), want(R * bytes);
    for (size_t r = 0; r < R; ++r)
        for (size_t i = 0; i < bytes; ++i) want[r * bytes + i] = static_cast<unsigned char>(mix(r + 17 * i));
    std::memcpy(in.data(), want.data() + me * bytes, bytes);
    c.all_gather(in.data(), out.data(), bytes);
    EXPECT_TRUE(out == want);
    std::vector<unsigned char> io(R * bytes, 0);
    std::memcpy(io.data() + me * bytes, in.data(), bytes);
    c.all_gather(io.data() + me * bytes, io.data(), bytes);
    EXPECT_TRUE(io == want);
    std::vector<unsigned char> bc = c.rank() == 0 ? want : std::vector<unsigned char>(R * bytes);
    c.broadcast(bc.data(), bc.size(), 0);
    EXPECT_TRUE(bc == want);
    if (c.size() >= 2) {
        if (c.rank() == 0) c.send(want.data(), want.size(), 1, 3);
        if (c.rank() == 1) {
            std::vector<unsigned char> got(want.size());
            c.recv(got.data(), got.size(), 0, 3);
            EXPECT_TRUE(got == want);
        }
    }
    c.barrier();
}

// Communicators from separate make_communicator() calls have separate contexts: a message on
// one is never received on the other.
TEST(MpiComm, SeparateCommunicatorsDoNotInterfere) {
    Communicator & a = world();
    std::unique_ptr<Communicator> b = make_communicator();
    EXPECT_EQ(b->rank(), a.rank());
    EXPECT_EQ(b->size(), a.size());
    if (a.size() >= 2) {
        const uint32_t on_a = 0xA, on_b = 0xB;
        if (a.rank() == 0) {
            b->send(&on_b, 4, 1, 1);
            a.send(&on_a, 4, 1, 1);
        } else if (a.rank() == 1) {
            uint32_t x = 0, y = 0;
            a.recv(&x, 4, 0, 1);   // same source and tag, other communicator: gets a's message
            b->recv(&y, 4, 0, 1);
            EXPECT_EQ(x, on_a);
            EXPECT_EQ(y, on_b);
        }
    }
    float f = 1.0f;
    b->all_reduce_sum(&f, 1, DType::f32);
    EXPECT_EQ(f, float(a.size()));
    b->barrier();
}

TEST(MpiComm, SingleCommunicatorInsideAnMpiJob) {
    std::unique_ptr<Communicator> s = make_single_communicator();
    EXPECT_EQ(s->size(), 1);
    EXPECT_EQ(s->rank(), 0);
    EXPECT_STREQ(s->name(), "single");
    float v[3] = {1.5f, -2.0f, 3.0f};
    s->all_reduce_sum(v, 3, DType::f32);
    EXPECT_EQ(v[1], -2.0f);
    EXPECT_EQ(s->all_gather_u64(7), std::vector<uint64_t>{7});
    EXPECT_EQ(s->all_reduce_sum(2.5), 2.5);
}

}  // namespace
}  // namespace memfit::test
