// The single-process communicator, the convenience helpers every implementation shares, and the
// choice between single and MPI.
#include "comm/communicator.h"

#include <cstdlib>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "comm/mpi_communicator.h"

namespace memfit {

void Communicator::sendrecv(const void * send_data, size_t send_bytes, int dst, int send_tag, void * recv_data,
                            size_t recv_bytes, int src, int recv_tag) {
    if (dst >= 0) send(send_data, send_bytes, dst, send_tag);
    if (src >= 0) recv(recv_data, recv_bytes, src, recv_tag);
}

std::vector<uint64_t> Communicator::all_gather_u64(uint64_t v) {
    std::vector<uint64_t> out(static_cast<size_t>(size()));
    all_gather(&v, out.data(), sizeof v);
    return out;
}

// Gathers every rank's value and sums them in rank order: exact in double's rounding, and the
// same bits on every rank (an MPI_SUM's association may differ between algorithms).
double Communicator::all_reduce_sum(double v) {
    std::vector<double> all(static_cast<size_t>(size()));
    all_gather(&v, all.data(), sizeof v);
    double s = 0.0;
    for (double x : all) s += x;
    return s;
}

namespace {

bool summable(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

class DoneRequest final : public CommRequest {
public:
    void wait() override {}
};

class SingleCommunicator final : public Communicator {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    const char * name() const override { return "single"; }

    void all_reduce_sum(void * data, size_t n, DType t) override {
        MF_ASSERT(summable(t) && (data || n == 0));
    }
    std::unique_ptr<CommRequest> iall_reduce_sum(void * data, size_t n, DType t, float *) override {
        all_reduce_sum(data, n, t);
        return std::make_unique<DoneRequest>();
    }
    void reduce_scatter_sum(const void * in, void * out, size_t n, DType t) override {
        MF_ASSERT(summable(t));
        if (n > 0 && in != out) std::memmove(out, in, n * dtype_size(t));
    }
    void all_gather(const void * in, void * out, size_t bytes) override {
        if (bytes > 0 && in != out) std::memmove(out, in, bytes);
    }
    std::unique_ptr<CommRequest> ireduce_scatter_sum(const void * in, void * out, const std::vector<size_t> & counts,
                                                     DType t, float *) override {
        MF_ASSERT(summable(t) && counts.size() == 1);
        if (counts[0] > 0 && in != out) std::memmove(out, in, counts[0] * dtype_size(t));
        return std::make_unique<DoneRequest>();
    }
    std::unique_ptr<CommRequest> iall_gather(const void * in, void * out, const std::vector<size_t> & counts,
                                             size_t elem_bytes) override {
        MF_ASSERT(counts.size() == 1);
        all_gather(in, out, counts[0] * elem_bytes);
        return std::make_unique<DoneRequest>();
    }
    void broadcast(void *, size_t, int root) override { MF_ASSERT(root == 0); }
    // Messages to oneself queue per tag, first in first out (a blocking MPI send to oneself
    // could deadlock; here it cannot).
    void send(const void * data, size_t bytes, int dst, int tag) override {
        MF_ASSERT(dst == 0);
        const auto * p = static_cast<const unsigned char *>(data);
        mailbox_.emplace(tag, std::vector<unsigned char>(p, p + bytes));
    }
    void recv(void * data, size_t bytes, int src, int tag) override {
        MF_ASSERT(src == 0);
        auto it = mailbox_.find(tag);   // the earliest message with this tag (multimap keeps order)
        if (it == mailbox_.end())
            throw CommError(fmt::format("single communicator: recv of {} bytes with tag {} but no "
                                        "message was sent to this rank with that tag (it would hang)",
                                        bytes, tag));
        if (it->second.size() != bytes)
            throw CommError(fmt::format("single communicator: recv expected {} bytes with tag {}, "
                                        "the message has {}", bytes, tag, it->second.size()));
        if (bytes > 0) std::memcpy(data, it->second.data(), bytes);
        mailbox_.erase(it);
    }
    void barrier() override {}
    std::unique_ptr<Communicator> split(int color, int) override {
        MF_ASSERT(color >= 0);
        return std::make_unique<SingleCommunicator>();
    }

private:
    std::multimap<int, std::vector<unsigned char>> mailbox_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
    return std::make_unique<SingleCommunicator>();
}

bool launched_by_mpi() {
    // OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx launchers (mpirun, srun --mpi=pmix) set
    // PMIX_RANK; PMI-1/2 launchers (MPICH's hydra, srun --mpi=pmi2) set PMI_RANK.
    for (const char * var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
        if (std::getenv(var) != nullptr) return true;
    return false;
}

std::unique_ptr<Communicator> make_communicator() {
    return launched_by_mpi() ? make_mpi_communicator() : make_single_communicator();
}

std::unique_ptr<CommRequest> Communicator::isend(const void * data, size_t bytes, int dst, int tag) {
    send(data, bytes, dst, tag);
    return std::make_unique<DoneRequest>();
}

}  // namespace memfit
