// main() of memfit_mpi_tests, run on every rank by mpirun (CTest: mpi_comm_np2, mpi_comm_np4).
// Rank 0 prints GoogleTest's usual output; the other ranks print only their failures, prefixed
// with their rank. Every rank runs every test in the same order (the collectives require it), so
// a test must not return early on one rank before a collective the others enter. The exit
// status is agreed over the ranks: non-zero when any rank had a failure.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "comm/communicator.h"
#include "mpi_test_env.h"

namespace memfit::test {

namespace {
Communicator * g_world = nullptr;

class RankFailurePrinter final : public ::testing::EmptyTestEventListener {
public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult & r) override {
        if (!r.failed()) return;
        std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                     r.line_number(), r.summary());
    }
    void OnTestEnd(const ::testing::TestInfo & info) override {
        if (info.result()->Failed())
            std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }

private:
    int rank_;
};
}  // namespace

Communicator & world() { return *g_world; }

}  // namespace memfit::test

int main(int argc, char ** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    std::unique_ptr<memfit::Communicator> comm;
    try {
        comm = memfit::make_communicator();
    } catch (const memfit::Error & e) {
        std::fprintf(stderr, "memfit_mpi_tests: %s\n", e.what());
        return 2;
    }
    memfit::test::g_world = comm.get();
    const int rank = comm->rank();
    if (rank == 0) {
        std::printf("memfit_mpi_tests: %s communicator, %d rank(s)%s\n", comm->name(), comm->size(),
                    memfit::launched_by_mpi() ? "" : " (not started by mpirun: the single communicator)");
    } else {
        auto & listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new memfit::test::RankFailurePrinter(rank));
    }
    const int rc = RUN_ALL_TESTS();
    const double failed_ranks = comm->all_reduce_sum(rc != 0 ? 1.0 : 0.0);
    if (rank == 0 && failed_ranks > 0)
        std::fprintf(stderr, "memfit_mpi_tests: failures on %.0f of %d rank(s)\n", failed_ranks, comm->size());
    std::fflush(stdout);
    std::fflush(stderr);
    comm.reset();
    return failed_ranks > 0 ? 1 : 0;
}
