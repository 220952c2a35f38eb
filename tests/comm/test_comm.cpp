#include "comm/communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace memfit {
namespace {

// The MPI side is tested by memfit_mpi_tests under mpirun (tests/mpi, CTest mpi_comm_np*).

TEST(Comm, NotLaunchedByMpiMeansSingle) {
    ASSERT_FALSE(launched_by_mpi()) << "memfit_tests runs without mpirun";
    std::unique_ptr<Communicator> c = make_communicator();
    EXPECT_STREQ(c->name(), "single");
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->size(), 1);
}

TEST(Comm, LaunchedByMpiReadsTheLaunchersVariables) {
    for (const char * var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
        ASSERT_EQ(std::getenv(var), nullptr) << var;
        setenv(var, "0", 1);
        EXPECT_TRUE(launched_by_mpi()) << var;
        unsetenv(var);
        EXPECT_FALSE(launched_by_mpi()) << var;
    }
}

TEST(Comm, SingleCollectivesAreTheIdentity) {
    std::unique_ptr<Communicator> c = make_single_communicator();
    EXPECT_STREQ(c->name(), "single");
    ASSERT_EQ(c->size(), 1);

    std::vector<float> f = {1.5f, -2.25f, 3.0f};
    const std::vector<float> f0 = f;
    c->all_reduce_sum(f.data(), f.size(), DType::f32);
    EXPECT_EQ(f, f0);
    std::vector<uint16_t> h = {f32_to_bf16(1.5f), f32_to_bf16(-7.0f)};
    const std::vector<uint16_t> h0 = h;
    c->all_reduce_sum(h.data(), h.size(), DType::bf16);
    EXPECT_EQ(h, h0);
    auto req = c->iall_reduce_sum(h.data(), h.size(), DType::f16);
    req->wait();
    req->wait();
    EXPECT_EQ(h, h0);

    std::vector<float> shard(3);
    c->reduce_scatter_sum(f.data(), shard.data(), 3, DType::f32);
    EXPECT_EQ(shard, f0);
    c->reduce_scatter_sum(f.data(), f.data(), 3, DType::f32);   // in place
    EXPECT_EQ(f, f0);

    const char in[5] = "abcd";
    char out[5] = {};
    c->all_gather(in, out, 4);
    EXPECT_EQ(std::string(out, 4), "abcd");
    c->broadcast(out, 4, 0);
    EXPECT_EQ(std::string(out, 4), "abcd");
    c->barrier();

    EXPECT_EQ(c->all_gather_u64(42), std::vector<uint64_t>{42});
    EXPECT_EQ(c->all_reduce_sum(0.125), 0.125);
}

TEST(Comm, SingleSendToSelfQueuesPerTag) {
    std::unique_ptr<Communicator> c = make_single_communicator();
    const int a = 1, b = 2, d = 3;
    c->send(&a, sizeof a, 0, 7);
    c->send(&b, sizeof b, 0, 8);
    c->send(&d, sizeof d, 0, 7);
    int x = 0;
    c->recv(&x, sizeof x, 0, 8);
    EXPECT_EQ(x, 2);
    c->recv(&x, sizeof x, 0, 7);
    EXPECT_EQ(x, 1);   // first in, first out within a tag
    c->recv(&x, sizeof x, 0, 7);
    EXPECT_EQ(x, 3);
    EXPECT_THROW(c->recv(&x, sizeof x, 0, 7), CommError);   // nothing left: would hang
    c->send(&a, sizeof a, 0, 1);
    char small[2];
    EXPECT_THROW(c->recv(small, sizeof small, 0, 1), CommError);   // size mismatch
}

}  // namespace
}  // namespace memfit
