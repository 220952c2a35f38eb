// The CUDA emulator's NCCL: the calls nccl_communicator.cpp makes, over MPI on the emulated
// device memory (host memory), so that `mpirun -np N memfit_emu train --device cuda` runs the
// NCCL communicator's code. Collectives run when called (each rank calls them in the same
// order). Sends and receives (a group's at ncclGroupEnd) are posted when issued and completed as
// work of their stream (fake_cudart.cpp): the next kernel, copy or synchronisation on it waits for
// them, as it would on a GPU, and later point-to-point calls on the stream are posted behind
// them. A send completes only once its receive is posted (MPI_Issend), as NCCL's do: a schedule
// that leaves a stream waiting on a send whose receive the peer posts later hangs here too.
// ncclCommInitRank finds its peers through the unique id, which carries the root's rank in
// MPI_COMM_WORLD: every rank reports to the root, which answers with the members in NCCL rank
// order, and the members make their MPI communicator with MPI_Comm_create_group. One rank
// needs no MPI at all. Sums of 16-bit floats add in fp32 and round once per pairwise step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace emu {   // fake_cudart.cpp
void flush_stream(cudaStream_t stream);   // the stream's deferred work, all of it
void flush_copies(cudaStream_t stream);   // up to its last deferred copy (NCCL completions may stay)
void defer_nccl(cudaStream_t stream, std::function<void()> done);
}

struct ncclComm {
    MPI_Comm mpi = MPI_COMM_NULL;   // null: one rank
    int rank = 0, size = 1;
};

namespace {

constexpr int kBootTag = 7700;
int g_group_depth = 0;

struct P2p {
    bool send;
    void * buf;
    size_t bytes;
    int peer;
    ncclComm * comm;
    cudaStream_t stream;
};
std::vector<P2p> g_pending;

[[noreturn]] void fail(const char * what) {
    std::fprintf(stderr, "cuda emulator: NCCL: %s\n", what);
    std::abort();
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
        case ncclUint8: case ncclInt8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclFloat32: case ncclInt32: case ncclUint32: return 4;
        default: return 8;
    }
}

template <class H> float to_f(H h) {
    if constexpr (sizeof(H) == 2 && std::is_same_v<H, __nv_bfloat16>) return __bfloat162float(h);
    else return __half2float(h);
}
template <class H> void sum16(void * in, void * inout, int * len, MPI_Datatype *) {
    const H * a = static_cast<const H *>(in);
    H * b = static_cast<H *>(inout);
    for (int i = 0; i < *len; ++i) {
        const float s = to_f(a[i]) + to_f(b[i]);
        if constexpr (std::is_same_v<H, __nv_bfloat16>) b[i] = __float2bfloat16_rn(s);
        else b[i] = __float2half_rn(s);
    }
}

MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
        case ncclFloat32: return MPI_FLOAT;
        case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T;
        case ncclUint8: return MPI_BYTE;
        default: fail("data type not emulated");
    }
}
MPI_Op mpi_sum(ncclDataType_t t) {
    static MPI_Op bf16 = MPI_OP_NULL, f16 = MPI_OP_NULL;
    if (t == ncclBfloat16) {
        if (bf16 == MPI_OP_NULL) MPI_Op_create(&sum16<__nv_bfloat16>, 1, &bf16);
        return bf16;
    }
    if (t == ncclFloat16) {
        if (f16 == MPI_OP_NULL) MPI_Op_create(&sum16<__half>, 1, &f16);
        return f16;
    }
    if (t == ncclFloat32) return MPI_SUM;
    fail("sum of this data type not emulated");
}

// A copy of n bytes (MPI takes no aliased buffers; NCCL's in-place forms alias).
std::vector<unsigned char> copy_of(const void * p, size_t n) {
    std::vector<unsigned char> v(n);
    if (n) std::memcpy(v.data(), p, n);
    return v;
}

// Posts the ops (one stream's: a group's, or one call's) and defers their completion to the stream.
void complete(std::vector<P2p> & ops) {
    std::vector<P2p *> sends, recvs;   // to oneself on a one-rank communicator: matched in order
    auto reqs = std::make_shared<std::vector<MPI_Request>>();
    for (P2p & o : ops) {
        if (o.stream != ops.front().stream) fail("one group's sends and receives on two streams");
        if (o.comm->mpi == MPI_COMM_NULL) {
            (o.send ? sends : recvs).push_back(&o);
            continue;
        }
        reqs->emplace_back();
        if (o.send) MPI_Issend(o.buf, int(o.bytes), MPI_BYTE, o.peer, 1, o.comm->mpi, &reqs->back());
        else MPI_Irecv(o.buf, int(o.bytes), MPI_BYTE, o.peer, 1, o.comm->mpi, &reqs->back());
    }
    if (sends.size() != recvs.size()) fail("unmatched send/receive to oneself");
    for (size_t i = 0; i < sends.size(); ++i) {
        if (sends[i]->bytes != recvs[i]->bytes) fail("send and receive sizes differ");
        std::memmove(recvs[i]->buf, sends[i]->buf, sends[i]->bytes);
    }
    if (!reqs->empty())
        emu::defer_nccl(ops.front().stream, [reqs] { MPI_Waitall(int(reqs->size()), reqs->data(), MPI_STATUSES_IGNORE); });
    ops.clear();
}

}  // namespace

extern "C" {

const char * ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated NCCL error"; }
const char * ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t * r) {
    *r = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId * id) {
    static int serial = 0;
    int world = 0, init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Comm_rank(MPI_COMM_WORLD, &world);
    std::memset(id, 0, sizeof *id);
    const int v[2] = {world, ++serial};
    std::memcpy(id->internal, v, sizeof v);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t * out, int nranks, ncclUniqueId id, int rank) {
    auto * c = new ncclComm;
    c->rank = rank;
    c->size = nranks;
    if (nranks > 1) {
        int v[2];
        std::memcpy(v, id.internal, sizeof v);
        const int root = v[0], tag = kBootTag + v[1] % 1000;
        int world = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &world);
        std::vector<int> members(size_t(nranks), -1);
        if (rank == 0) {
            members[0] = world;
            for (int i = 1; i < nranks; ++i) {
                int msg[2];
                MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                members[size_t(msg[1])] = msg[0];
            }
            for (int i = 1; i < nranks; ++i) MPI_Send(members.data(), nranks, MPI_INT, members[size_t(i)], tag, MPI_COMM_WORLD);
        } else {
            const int msg[2] = {world, rank};
            MPI_Send(msg, 2, MPI_INT, root, tag, MPI_COMM_WORLD);
            MPI_Recv(members.data(), nranks, MPI_INT, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        MPI_Group all, mine;
        MPI_Comm_group(MPI_COMM_WORLD, &all);
        MPI_Group_incl(all, nranks, members.data(), &mine);
        MPI_Comm_create_group(MPI_COMM_WORLD, mine, tag, &c->mpi);
        MPI_Group_free(&mine);
        MPI_Group_free(&all);
    }
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    ++g_group_depth;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
    if (g_group_depth == 0) return ncclInvalidUsage;
    if (--g_group_depth == 0) complete(g_pending);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void * in, void * out, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t stream) {
    emu::flush_stream(stream);
    if (op != ncclSum) return ncclInvalidArgument;
    const std::vector<unsigned char> tmp = copy_of(in, n * type_size(t));
    if (c->mpi == MPI_COMM_NULL) std::memcpy(out, tmp.data(), tmp.size());
    else MPI_Allreduce(tmp.data(), out, int(n), mpi_type(t), mpi_sum(t), c->mpi);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void * in, void * out, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t stream) {
    emu::flush_stream(stream);
    if (op != ncclSum) return ncclInvalidArgument;
    const std::vector<unsigned char> tmp = copy_of(in, n * type_size(t) * size_t(c->size));
    if (c->mpi == MPI_COMM_NULL) std::memcpy(out, tmp.data(), tmp.size());
    else MPI_Reduce_scatter_block(tmp.data(), out, int(n), mpi_type(t), mpi_sum(t), c->mpi);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void * in, void * out, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t stream) {
    emu::flush_stream(stream);
    const std::vector<unsigned char> tmp = copy_of(in, n * type_size(t));
    if (c->mpi == MPI_COMM_NULL) std::memcpy(out, tmp.data(), tmp.size());
    else MPI_Allgather(tmp.data(), int(n), mpi_type(t), out, int(n), mpi_type(t), c->mpi);
    return ncclSuccess;
}

ncclResult_t ncclReduce(const void * in, void * out, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t stream) {
    emu::flush_stream(stream);
    if (op != ncclSum) return ncclInvalidArgument;
    const std::vector<unsigned char> tmp = copy_of(in, n * type_size(t));
    if (c->mpi == MPI_COMM_NULL) std::memcpy(out, tmp.data(), tmp.size());
    else MPI_Reduce(tmp.data(), c->rank == root ? out : nullptr, int(n), mpi_type(t), mpi_sum(t), root, c->mpi);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void * in, void * out, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t stream) {
    emu::flush_stream(stream);
    if (c->rank == root && in != out) std::memmove(out, in, n * type_size(t));
    if (c->mpi != MPI_COMM_NULL) MPI_Bcast(out, int(n), mpi_type(t), root, c->mpi);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void * buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
    emu::flush_copies(stream);
    g_pending.push_back(P2p{true, const_cast<void *>(buf), n * type_size(t), peer, c, stream});
    if (g_group_depth == 0) complete(g_pending);
    return ncclSuccess;
}
ncclResult_t ncclRecv(void * buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
    emu::flush_copies(stream);
    g_pending.push_back(P2p{false, buf, n * type_size(t), peer, c, stream});
    if (g_group_depth == 0) complete(g_pending);
    return ncclSuccess;
}

}  // extern "C"
