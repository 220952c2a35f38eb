// The NCCL communicator (NCCL 2.28 from the CUDA toolkit, through its C API). The only file
// that includes nccl.h.
//
// Set-up: rank 0 of the MPI communicator calls ncclGetUniqueId and broadcasts the id through
// it; every rank calls ncclCommInitRank(size, id, rank) on the device of the stream it was
// given. The NCCL ranks are the MPI ranks. split() splits the MPI communicator (MPI_Comm_split:
// ranked by key, ties by old rank) and bootstraps a fresh NCCL communicator over the part, with a
// new unique id, so the NCCL and MPI ranks of the part agree by construction (ncclCommSplit would
// share resources with the parent but rank by its own rules; one bootstrap path is simpler).
//
// Streams and requests: every NCCL call is enqueued on the one stream given at construction, the
// CUDA backend's, so it runs after the kernels that produced its input and before every kernel
// or copy enqueued after it. A "blocking" call (all_reduce_sum, send, ...) returns once the work
// is enqueued: for the engine, whose consumers are on the same stream, that is complete. The
// host sees results through CudaBackend::download, which synchronises the stream. The
// non-blocking calls enqueue the same work and return a request whose wait() adds nothing to
// the stream (ops on one stream are ordered); wait() only reports an asynchronous NCCL error
// (ncclCommGetAsyncError, which does not block). So on one stream there is no overlap of
// communication with computation: the NCCL kernel runs between the kernels around it. Overlap
// would take a second stream with events (record on the compute stream, wait on the side
// stream, and the reverse in wait()); the interface allows it, this first version does not.
// barrier() synchronises the stream before the MPI barrier, so everything enqueued before it is
// done on every rank when it returns.
//
// Sums: f32, bf16 and f16 with ncclSum; NCCL adds 16-bit values natively, so `scratch` is
// ignored. Unlike the MPI communicator, a 16-bit sum is rounded to 16 bits after every
// reduction step of NCCL's algorithm (ring: size()-1 roundings), not once; every rank still
// receives the same bits (the reduced values are broadcast). Counts are size_t: no chunking.
//
// Per-rank counts: NCCL has no reduce_scatter_v / all_gather_v. ireduce_scatter_sum is a
// ncclReduce to each rank with its count and offset, and iall_gather a ncclBroadcast from each
// rank of its part, all in one ncclGroupStart/ncclGroupEnd (one launch); zero counts are
// skipped (every rank has the same counts, so every rank skips the same).
//
// Point-to-point: NCCL has no tags. Messages between one pair of ranks are received in the
// order they were sent, whatever their tags; a receive must be posted for every send in that
// order and with the same size (NCCL does not check sizes: a mismatch hangs or corrupts). The
// engine's schedules satisfy this: 1F1B has one sendrecv per exchange, one message per direction
// in flight; in the interleaved one each stage receives a neighbour's messages in the order that
// neighbour sends them (PipelineSchedule.InterleavedNeighboursAgreeOnMessageOrder), with several
// sends outstanding, which needs open_send_channels() (below). Tags are checked (>= 0) and
// otherwise ignored. sendrecv is a grouped ncclSend + ncclRecv, so neither half waits
// for the other. Zero-byte messages are skipped on both sides (their sizes are equal).
//
// isend: a lone ncclSend would hold the stream until the peer's receive runs, so two stages
// that each isend and then receive from the other would deadlock, which MPI's isend does not.
// An isend is therefore held, and enqueued at the start of the next call on this communicator,
// inside the same group as that call's own sends and receives when it is a point-to-point call
// (then it behaves like MPI's: the send and the receive progress together), or at its wait(),
// or when its request is destroyed, whichever comes first. Held sends keep their order. The
// data must stay untouched until wait(), as the interface already asks. That suffices for one
// send outstanding per exchange (1F1B), not for a schedule that keeps several sends out while
// it receives (interleaved): a group holding a send blocks the stream until the peer receives
// it. open_send_channels() makes isend MPI-like: each rank sends on a communicator of its colour
// (ranks of one colour never neighbour each other in the pipeline's ring: two colours, three for
// an odd ring) from a stream of its own, after an event of the main stream (the data is ready),
// and the request's wait() makes the main stream wait for the send's event; receives from rank
// r are posted on r's colour's communicator on the main stream. So a send holds up only the
// sends after it; each communicator is used on one stream per rank (NCCL's rule).
//
// Host memory: a call whose buffers are host memory (cudaPointerGetAttributes: not device or
// managed memory) is passed to the MPI communicator, with MPI's semantics (tags included), so
// code that exchanges host vectors (the engine's tensor-parallel gather of parameters for a
// checkpoint, reports) works unchanged. all_gather_u64 and all_reduce_sum(double) always go to
// MPI. Mixing host and device buffers in one call is a broken invariant (MF_ASSERT).
//
// Failures: a failed NCCL call is a broken invariant and aborts with file, line, the call and
// NCCL's message (MF_NCCL), like MF_CUDA; a rank that aborts takes the job down through mpirun
// (see mpi_communicator.cpp). The first call between ranks that have not talked yet may block
// the host until the others make it too (NCCL connects lazily). There is no timeout.
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"

namespace memfit {

namespace {

[[noreturn]] void nccl_fail(const char * file, int line, const char * call, ncclResult_t r) {
    const char * last = ncclGetLastError(nullptr);
    const std::string msg = last && *last ? fmt::format("{} ({})", ncclGetErrorString(r), last)
                                          : std::string(ncclGetErrorString(r));
    cuda::fail(file, line, "NCCL", call, int(r), msg.c_str());
}

}  // namespace

}  // namespace memfit

// A checked NCCL call: aborts with file, line, the call and NCCL's message (and its last error
// string, which says more, e.g. which transport failed) unless it returns ncclSuccess.
#define MF_NCCL(...)                                                                    \
    do {                                                                                \
        const ncclResult_t mf_nccl_r_ = (__VA_ARGS__);                                  \
        if (mf_nccl_r_ != ncclSuccess) ::memfit::nccl_fail(__FILE__, __LINE__, #__VA_ARGS__, mf_nccl_r_); \
    } while (0)

namespace memfit {

namespace {

bool summable(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::f32: return ncclFloat32;
        case DType::bf16: return ncclBfloat16;
        case DType::f16: return ncclFloat16;
        default: break;
    }
    MF_UNREACHABLE();
}

// Device (or managed) memory, which NCCL takes; false for host memory and null.
bool on_device(const void * p) {
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();   // the failed query's error must not surface at the next check
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Whether a call's buffers are device memory; both must agree where both are given.
bool device_call(const void * a, const void * b = nullptr) {
    const bool da = on_device(a);
    if (a != nullptr && b != nullptr) MF_ASSERT(da == on_device(b) && "one call mixes host and device buffers");
    return a != nullptr ? da : on_device(b);
}

const unsigned char * bytes_of(const void * p) { return static_cast<const unsigned char *>(p); }
unsigned char * bytes_of(void * p) { return static_cast<unsigned char *>(p); }

// The NCCL communicator and what outlives a call: shared by the communicator and its requests,
// so a request waited on after its communicator is gone still finds the NCCL communicator.
struct NcclState {
    struct Held {
        const void * data;
        size_t bytes;
        int dst;
    };

    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    std::vector<Held> held;   // isends not enqueued yet, in call order
    // open_send_channels(): one communicator per colour, and this rank's sending stream.
    std::vector<ncclComm_t> channels;
    cudaStream_t send_stream = nullptr;

    NcclState() = default;
    NcclState(const NcclState &) = delete;
    NcclState & operator=(const NcclState &) = delete;
    ~NcclState() {
        flush();
        // Work still in the stream uses comm: finish it first (the stream must still exist,
        // so destroy the communicator before the backend). Errors are ignored on the way out.
        if (stream) (void)cudaStreamSynchronize(stream);
        if (send_stream) (void)cudaStreamSynchronize(send_stream);
        if (comm) (void)ncclCommDestroy(comm);
        for (ncclComm_t c : channels) (void)ncclCommDestroy(c);
        if (send_stream) (void)cudaStreamDestroy(send_stream);
    }

    // The held sends, then the point-to-point calls of `more`, in one group.
    template <class F>
    void p2p(F && more) {
        MF_NCCL(ncclGroupStart());
        for (const Held & h : held) MF_NCCL(ncclSend(h.data, h.bytes, ncclUint8, h.dst, comm, stream));
        held.clear();
        more();
        MF_NCCL(ncclGroupEnd());
    }
    void flush() {
        if (!held.empty()) p2p([] {});
    }

    // An error from NCCL's kernels or proxy thread (a peer gone, a network failure).
    void check_async() const {
        auto check = [](ncclComm_t c) {
            ncclResult_t a = ncclSuccess;
            MF_NCCL(ncclCommGetAsyncError(c, &a));
            if (a != ncclSuccess && a != ncclInProgress) nccl_fail(__FILE__, __LINE__, "ncclCommGetAsyncError", a);
        };
        check(comm);
        for (ncclComm_t c : channels) check(c);
    }
};

// A request for work already enqueued on the stream (see the top of the file): wait() adds
// nothing to the stream. An isend's request enqueues the held sends first.
class NcclRequest final : public CommRequest {
public:
    NcclRequest(std::shared_ptr<NcclState> st, bool holds_send) : st_(std::move(st)), holds_send_(holds_send) {}
    ~NcclRequest() override {
        if (!done_ && holds_send_) st_->flush();   // the peer is waiting for it
    }
    NcclRequest(const NcclRequest &) = delete;
    NcclRequest & operator=(const NcclRequest &) = delete;

    void wait() override {
        if (done_) return;
        done_ = true;
        if (holds_send_) st_->flush();
        st_->check_async();
    }

private:
    std::shared_ptr<NcclState> st_;
    bool holds_send_;
    bool done_ = false;
};

// A send on a channel: wait() (or the destructor) orders the main stream after its event.
class ChannelRequest final : public CommRequest {
public:
    ChannelRequest(std::shared_ptr<NcclState> st, cudaEvent_t sent) : st_(std::move(st)), sent_(sent) {}
    ~ChannelRequest() override {
        if (!done_) (void)cudaStreamWaitEvent(st_->stream, sent_, 0);
        (void)cudaEventDestroy(sent_);
    }
    ChannelRequest(const ChannelRequest &) = delete;
    ChannelRequest & operator=(const ChannelRequest &) = delete;

    void wait() override {
        if (done_) return;
        done_ = true;
        MF_CUDA(cudaStreamWaitEvent(st_->stream, sent_, 0));
        st_->check_async();
    }

private:
    std::shared_ptr<NcclState> st_;
    cudaEvent_t sent_;
    bool done_ = false;
};

class DoneRequest final : public CommRequest {
public:
    void wait() override {}
};

class NcclCommunicator final : public Communicator {
public:
    // Over the ranks of *host (owned when `owned` holds it), on `stream`.
    NcclCommunicator(Communicator & host, std::unique_ptr<Communicator> owned, cudaStream_t stream)
        : host_(&host), owned_(std::move(owned)), st_(std::make_shared<NcclState>()) {
        rank_ = host_->rank();
        size_ = host_->size();
        st_->stream = stream;
        ncclUniqueId id{};
        if (rank_ == 0) MF_NCCL(ncclGetUniqueId(&id));
        host_->broadcast(&id, sizeof id, 0);
        int device = -1;
        MF_CUDA(cudaStreamGetDevice(stream, &device));
        MF_CUDA(cudaSetDevice(device));
        MF_NCCL(ncclCommInitRank(&st_->comm, size_, id, rank_));
    }
    NcclCommunicator(const NcclCommunicator &) = delete;
    NcclCommunicator & operator=(const NcclCommunicator &) = delete;
    // st_ (the NCCL communicator, synchronised and destroyed once no request holds it) goes
    // before owned_ (the MPI communicator of a split): members are destroyed in reverse order.
    ~NcclCommunicator() override = default;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const char * name() const override { return "nccl"; }

    void all_reduce_sum(void * data, size_t n, DType t) override {
        MF_ASSERT(summable(t) && (data || n == 0));
        st_->flush();
        if (n == 0) return;
        if (!device_call(data)) return host_->all_reduce_sum(data, n, t);
        MF_NCCL(ncclAllReduce(data, data, n, nccl_type(t), ncclSum, st_->comm, st_->stream));
    }

    std::unique_ptr<CommRequest> iall_reduce_sum(void * data, size_t n, DType t, float * scratch) override {
        MF_ASSERT(summable(t) && (data || n == 0));
        st_->flush();
        if (n == 0) return std::make_unique<DoneRequest>();
        if (!device_call(data)) return host_->iall_reduce_sum(data, n, t, scratch);
        MF_NCCL(ncclAllReduce(data, data, n, nccl_type(t), ncclSum, st_->comm, st_->stream));
        return std::make_unique<NcclRequest>(st_, false);
    }

    // In place when out is this rank's shard of in: NCCL's in-place rule is the interface's.
    void reduce_scatter_sum(const void * in, void * out, size_t n, DType t) override {
        MF_ASSERT(summable(t));
        st_->flush();
        if (n == 0) return;
        if (!device_call(in, out)) return host_->reduce_scatter_sum(in, out, n, t);
        MF_NCCL(ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, st_->comm, st_->stream));
    }

    // In place when in is this rank's slot of out: NCCL's in-place rule is the interface's.
    void all_gather(const void * in, void * out, size_t bytes) override {
        st_->flush();
        if (bytes == 0) return;
        if (!device_call(out, in)) return host_->all_gather(in, out, bytes);
        MF_NCCL(ncclAllGather(in, out, bytes, ncclUint8, st_->comm, st_->stream));
    }

    std::unique_ptr<CommRequest> ireduce_scatter_sum(const void * in, void * out, const std::vector<size_t> & counts,
                                                     DType t, float * scratch) override {
        MF_ASSERT(summable(t) && counts.size() == size_t(size_));
        st_->flush();
        size_t total = 0;
        for (size_t c : counts) total += c;
        if (total == 0) return std::make_unique<DoneRequest>();
        if (!device_call(in, counts[size_t(rank_)] > 0 ? out : nullptr))
            return host_->ireduce_scatter_sum(in, out, counts, t, scratch);
        const size_t es = dtype_size(t);
        MF_NCCL(ncclGroupStart());
        size_t off = 0;
        for (int r = 0; r < size_; ++r) {
            const size_t c = counts[size_t(r)];
            // recvbuff is used on the root only (NCCL's documentation), so null elsewhere.
            if (c > 0)
                MF_NCCL(ncclReduce(bytes_of(in) + off * es, r == rank_ ? out : nullptr, c, nccl_type(t), ncclSum, r,
                                   st_->comm, st_->stream));
            off += c;
        }
        MF_NCCL(ncclGroupEnd());
        return std::make_unique<NcclRequest>(st_, false);
    }

    std::unique_ptr<CommRequest> iall_gather(const void * in, void * out, const std::vector<size_t> & counts,
                                             size_t elem_bytes) override {
        MF_ASSERT(counts.size() == size_t(size_));
        st_->flush();
        size_t total = 0;
        for (size_t c : counts) total += c;
        if (total == 0 || elem_bytes == 0) return std::make_unique<DoneRequest>();
        if (!device_call(out, counts[size_t(rank_)] > 0 ? in : nullptr))
            return host_->iall_gather(in, out, counts, elem_bytes);
        MF_NCCL(ncclGroupStart());
        size_t off = 0;
        for (int r = 0; r < size_; ++r) {
            const size_t b = counts[size_t(r)] * elem_bytes;
            // sendbuff is used on the root only; in place when in is this rank's place in out.
            if (b > 0)
                MF_NCCL(ncclBroadcast(r == rank_ ? in : nullptr, bytes_of(out) + off, b, ncclUint8, r, st_->comm,
                                      st_->stream));
            off += b;
        }
        MF_NCCL(ncclGroupEnd());
        return std::make_unique<NcclRequest>(st_, false);
    }

    void broadcast(void * data, size_t bytes, int root) override {
        MF_ASSERT(root >= 0 && root < size_);
        st_->flush();
        if (bytes == 0) return;
        if (!device_call(data)) return host_->broadcast(data, bytes, root);
        MF_NCCL(ncclBroadcast(data, data, bytes, ncclUint8, root, st_->comm, st_->stream));
    }

    // Tags are not sent (see the top of the file): messages between a pair arrive in order.
    void send(const void * data, size_t bytes, int dst, int tag) override {
        MF_ASSERT(dst >= 0 && dst < size_ && tag >= 0);
        if (bytes == 0) return st_->flush();
        if (!device_call(data)) {
            st_->flush();
            return host_->send(data, bytes, dst, tag);
        }
        if (!st_->channels.empty()) return isend(data, bytes, dst, tag)->wait();
        st_->p2p([&] { MF_NCCL(ncclSend(data, bytes, ncclUint8, dst, st_->comm, st_->stream)); });
    }

    void recv(void * data, size_t bytes, int src, int tag) override {
        MF_ASSERT(src >= 0 && src < size_ && tag >= 0);
        if (bytes == 0) return st_->flush();
        if (!device_call(data)) {
            st_->flush();
            return host_->recv(data, bytes, src, tag);
        }
        st_->p2p([&] { MF_NCCL(ncclRecv(data, bytes, ncclUint8, src, recv_comm(src), st_->stream)); });
    }

    void sendrecv(const void * send_data, size_t send_bytes, int dst, int send_tag, void * recv_data,
                  size_t recv_bytes, int src, int recv_tag) override {
        MF_ASSERT(dst < size_ && src < size_);
        const bool do_send = dst >= 0 && send_bytes > 0, do_recv = src >= 0 && recv_bytes > 0;
        const bool dev = device_call(do_send ? send_data : nullptr, do_recv ? recv_data : nullptr);
        if ((do_send || do_recv) && !dev) {
            st_->flush();
            return host_->sendrecv(send_data, do_send ? send_bytes : 0, do_send ? dst : -1, send_tag, recv_data,
                                   do_recv ? recv_bytes : 0, do_recv ? src : -1, recv_tag);
        }
        if (!st_->channels.empty()) {   // the send on its channel, the receive here, then both done
            std::unique_ptr<CommRequest> sent = do_send ? isend(send_data, send_bytes, dst, send_tag) : nullptr;
            if (do_recv) recv(recv_data, recv_bytes, src, recv_tag);
            if (sent) sent->wait();
            return;
        }
        st_->p2p([&] {
            if (do_send) MF_NCCL(ncclSend(send_data, send_bytes, ncclUint8, dst, st_->comm, st_->stream));
            if (do_recv) MF_NCCL(ncclRecv(recv_data, recv_bytes, ncclUint8, src, st_->comm, st_->stream));
        });
    }

    // Held until the next call on this communicator or wait() (see the top of the file).
    std::unique_ptr<CommRequest> isend(const void * data, size_t bytes, int dst, int tag) override {
        MF_ASSERT(dst >= 0 && dst < size_ && tag >= 0);
        if (bytes == 0) return std::make_unique<DoneRequest>();
        if (!device_call(data)) {
            st_->flush();
            return host_->isend(data, bytes, dst, tag);
        }
        if (!st_->channels.empty()) {
            cudaEvent_t ready = nullptr, sent = nullptr;
            MF_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
            MF_CUDA(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming));
            MF_CUDA(cudaEventRecord(ready, st_->stream));
            MF_CUDA(cudaStreamWaitEvent(st_->send_stream, ready, 0));
            MF_CUDA(cudaEventDestroy(ready));   // released once recorded work is done
            MF_NCCL(ncclSend(data, bytes, ncclUint8, dst, st_->channels[size_t(colour(rank_))], st_->send_stream));
            MF_CUDA(cudaEventRecord(sent, st_->send_stream));
            return std::make_unique<ChannelRequest>(st_, sent);
        }
        st_->held.push_back({data, bytes, dst});
        return std::make_unique<NcclRequest>(st_, true);
    }

    void open_send_channels() override {
        st_->flush();
        if (!st_->channels.empty() || size_ < 2) return;
        const int colours = size_ % 2 == 0 ? 2 : 3;
        for (int c = 0; c < colours; ++c) {
            ncclUniqueId id{};
            if (rank_ == 0) MF_NCCL(ncclGetUniqueId(&id));
            host_->broadcast(&id, sizeof id, 0);
            st_->channels.push_back(nullptr);
            MF_NCCL(ncclCommInitRank(&st_->channels.back(), size_, id, rank_));
        }
        MF_CUDA(cudaStreamCreateWithFlags(&st_->send_stream, cudaStreamNonBlocking));
    }

    void barrier() override {
        st_->flush();
        MF_CUDA(cudaStreamSynchronize(st_->stream));
        st_->check_async();
        host_->barrier();
    }

    std::unique_ptr<Communicator> split(int color, int key) override {
        MF_ASSERT(color >= 0);
        st_->flush();
        std::unique_ptr<Communicator> part = host_->split(color, key);
        Communicator & h = *part;
        return std::make_unique<NcclCommunicator>(h, std::move(part), st_->stream);
    }

    // Host values: through MPI.
    std::vector<uint64_t> all_gather_u64(uint64_t v) override {
        st_->flush();
        return host_->all_gather_u64(v);
    }
    double all_reduce_sum(double v) override {
        st_->flush();
        return host_->all_reduce_sum(v);
    }

private:
    // A rank's sending colour: neighbours in the ring 0, 1, ..., size - 1, 0 differ.
    int colour(int r) const { return size_ % 2 == 1 && r == size_ - 1 ? 2 : r % 2; }
    // Where receives from src are posted: src's channel once opened, else the communicator.
    ncclComm_t recv_comm(int src) const {
        return st_->channels.empty() ? st_->comm : st_->channels[size_t(colour(src))];
    }
    Communicator * host_;                     // MPI (or single) over the same ranks
    std::unique_ptr<Communicator> owned_;     // host_ when this communicator owns it (split)
    std::shared_ptr<NcclState> st_;
    int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator & mpi, void * stream) {
    return std::make_unique<NcclCommunicator>(mpi, nullptr, static_cast<cudaStream_t>(stream));
}

}  // namespace memfit
