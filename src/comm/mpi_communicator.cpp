// The MPI communicator (OpenMPI 4.1 from Debian, through MPI's C API). The only file that
// includes mpi.h.
//
// Life cycle: the first make_mpi_communicator() calls MPI_Init_thread (MPI_THREAD_SERIALIZED;
// memfit calls MPI from one thread at a time, in practice the main one) and registers an exit
// handler. At exit with status 0 the handler calls MPI_Finalize; at exit with any other status
// it calls MPI_Abort, so that a rank that fails alone (a bad file, a CommError caught by the
// CLI) ends the whole job with mpirun's "MPI_ABORT was invoked on rank N" message instead of
// leaving the other ranks blocked in a collective. Each communicator works on its own duplicate
// of MPI_COMM_WORLD, or on the MPI_Comm_split of its parent (split()), whose error handler is
// MPI_ERRORS_RETURN: failed calls throw CommError naming the operation, this rank (and its world
// rank on a split communicator), the peer where there is one, and MPI's error string.
//
// A rank that dies (killed, crashed, std::abort) is noticed by mpirun, which kills the others
// and prints "mpirun noticed that process rank N ... exited on signal S"; OpenMPI 4.1 has no
// fault tolerance, so the survivors do not get to throw. A live rank that never joins a
// collective (it hangs, skips it, or exits 0 early) would block the others forever: every wait
// here is a test loop with a timeout (set_comm_timeout, --comm-timeout). A rank that times out
// asks every rank for its state on a census communicator of its own (each waiting rank answers
// from its test loop), names the ones that did not answer, and aborts the job.
//
// Sums: f32 with MPI_FLOAT/MPI_SUM. bf16 and f16 are widened to an fp32 scratch, summed with
// MPI_FLOAT/MPI_SUM and rounded back once (a user-defined MPI_Op on 16-bit values would round
// after every pairwise combination, size()-1 roundings). Blocking sums convert at most
// set_mpi_scratch_elems() elements at a time (16 MiB of fp32 by default); iall_reduce_sum and
// ireduce_scatter_sum hold fp32 copies (4 bytes per element) until wait(), in the caller's
// scratch when given.
//
// Counts: MPI counts are int; messages longer than INT_MAX elements (sums) or bytes (the rest)
// go in chunks.
#include "comm/mpi_communicator.h"

#include <mpi.h>
#include <stdlib.h>   // on_exit (glibc)

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace memfit {

namespace {

size_t g_max_count = INT_MAX;
size_t g_scratch_elems = size_t(1) << 22;
double g_timeout_s = 600;
std::atomic<long> g_step{-1};

int world_rank() {
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

// on_exit handler: status 0 finalises; anything else aborts the job (see the top of the file).
void open_census();
void close_census();

void finish_mpi(int status, void *) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (status == 0) {
        close_census();
        MPI_Finalize();
        return;
    }
    std::fprintf(stderr, "memfit: rank %d is exiting with status %d; aborting the other ranks\n",
                 world_rank(), status);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
}

std::string mpi_error_string(int rc) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
    return std::string(buf, static_cast<size_t>(len));
}

void init_mpi_once() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw CommError("MPI was already finalised in this process; it cannot start again");
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
        throw CommError(fmt::format("MPI_Init_thread failed: {}", mpi_error_string(rc)));
    if (on_exit(finish_mpi, nullptr) != 0)   // only when glibc's handler table cannot grow
        std::atexit([] { finish_mpi(0, nullptr); });
    if (provided < MPI_THREAD_FUNNELED)
        throw CommError(fmt::format("MPI provides thread level {}, memfit needs at least "
                                    "MPI_THREAD_FUNNELED ({})", provided, MPI_THREAD_FUNNELED));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    open_census();
}

bool mpi_finalized() {
    int f = 0;
    MPI_Finalized(&f);
    return f != 0;
}

// ---- the watchdog's census ----
// Every rank keeps one receive posted on its own duplicate of MPI_COMM_WORLD for a question
// ("what are you waiting for?"); a rank in a wait answers from its test loop.
MPI_Comm g_census = MPI_COMM_NULL;
MPI_Request g_ask = MPI_REQUEST_NULL;
int g_ask_from = 0;
constexpr int kAskTag = 7001, kReplyTag = 7002;
const char * g_waiting_op = nullptr;   // the wait this rank is in (nullptr: none)
struct CensusReply {
    long step;
    double waiting_s;
    char op[32];
};
using WatchClock = std::chrono::steady_clock;
WatchClock::time_point g_waiting_since;

void post_ask() { MPI_Irecv(&g_ask_from, 1, MPI_INT, MPI_ANY_SOURCE, kAskTag, g_census, &g_ask); }

void open_census() {
    if (MPI_Comm_dup(MPI_COMM_WORLD, &g_census) != MPI_SUCCESS) {
        g_census = MPI_COMM_NULL;
        return;
    }
    MPI_Comm_set_errhandler(g_census, MPI_ERRORS_RETURN);
    post_ask();
}

void close_census() {
    if (g_census == MPI_COMM_NULL) return;
    if (g_ask != MPI_REQUEST_NULL) {
        MPI_Cancel(&g_ask);
        MPI_Wait(&g_ask, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&g_census);
}

double seconds_since(WatchClock::time_point t) { return std::chrono::duration<double>(WatchClock::now() - t).count(); }

// Answers the questions that arrived (this rank is in a wait).
void answer_census() {
    if (g_census == MPI_COMM_NULL) return;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&g_ask, &flag, &st) != MPI_SUCCESS || !flag) return;
        CensusReply r{g_step.load(), seconds_since(g_waiting_since), {}};
        std::snprintf(r.op, sizeof r.op, "%s", g_waiting_op ? g_waiting_op : "-");
        MPI_Request q = MPI_REQUEST_NULL;
        MPI_Isend(&r, int(sizeof r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, g_census, &q);
        MPI_Request_free(&q);   // small and eager: it completes on its own
        post_ask();
    }
}

// The wait of `op` timed out: ask every rank, name those that did not answer, end the job.
[[noreturn]] void time_out(const char * op, const std::string & who) {
    const int me = world_rank();
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    std::vector<int> answered(size_t(world), 0);
    std::vector<CensusReply> replies(static_cast<size_t>(world));
    answered[size_t(me)] = 1;
    if (g_census != MPI_COMM_NULL) {
        for (int r = 0; r < world; ++r) {
            if (r == me) continue;
            MPI_Request q = MPI_REQUEST_NULL;
            MPI_Isend(&me, 1, MPI_INT, r, kAskTag, g_census, &q);
            MPI_Request_free(&q);
        }
        const auto t0 = WatchClock::now();
        while (seconds_since(t0) < 2.0) {   // the ranks in a wait answer within their test loop
            answer_census();
            int flag = 0;
            MPI_Status st;
            MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, g_census, &flag, &st);
            if (flag) {
                CensusReply r{};
                MPI_Recv(&r, int(sizeof r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, g_census, MPI_STATUS_IGNORE);
                answered[size_t(st.MPI_SOURCE)] = 1;
                replies[size_t(st.MPI_SOURCE)] = r;
            } else {
                sched_yield();
            }
        }
    }
    std::string missing, waiting;
    for (int r = 0; r < world; ++r) {
        if (!answered[size_t(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
        else if (r != me)
            waiting += fmt::format("{}{} ({} for {:.0f} s)", waiting.empty() ? "" : ", ", r, replies[size_t(r)].op,
                                   replies[size_t(r)].waiting_s);
    }
    const long step = g_step.load();
    std::fprintf(stderr,
                 "memfit: error: MPI %s on %s%s has not completed in %g s (--comm-timeout); world ranks that did "
                 "not arrive: %s; waiting too: %s; ending every rank\n",
                 op, who.c_str(), step >= 0 ? fmt::format(" at step {}", step).c_str() : "", g_timeout_s,
                 missing.empty() ? "none found (all answered: a collective mismatch?)"
                                 : (missing + " (no answer: computing elsewhere, hung or exited)").c_str(),
                 waiting.empty() ? "none" : waiting.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
}

// Waits for `n` requests like MPI_Waitall, answering census questions, within the timeout.
int timed_wait(int n, MPI_Request * reqs, MPI_Status * st, const char * op, const std::string & who) {
    if (g_timeout_s <= 0) return MPI_Waitall(n, reqs, st);
    g_waiting_op = op;
    g_waiting_since = WatchClock::now();
    for (unsigned spins = 0;; ++spins) {
        int flag = 0;
        const int rc = MPI_Testall(n, reqs, &flag, st);
        if (rc != MPI_SUCCESS || flag) {
            g_waiting_op = nullptr;
            return rc;
        }
        if (spins % 256 == 0) {
            answer_census();
            if (seconds_since(g_waiting_since) > g_timeout_s) time_out(op, who);
        }
        if (spins % 64 == 63) sched_yield();   // oversubscribed ranks share the cores
    }
}

bool summable(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// 16-bit <-> fp32 for n elements.
void widen(const void * src, float * dst, size_t n, DType t) {
    if (t == DType::bf16) {
        const auto * s = static_cast<const bf16_t *>(src);
        for (size_t i = 0; i < n; ++i) dst[i] = to_f32(s[i]);
    } else if (t == DType::f16) {
        const auto * s = static_cast<const f16_t *>(src);
        for (size_t i = 0; i < n; ++i) dst[i] = to_f32(s[i]);
    } else {
        std::memcpy(dst, src, n * sizeof(float));
    }
}
void narrow(const float * src, void * dst, size_t n, DType t) {
    if (t == DType::bf16) {
        auto * d = static_cast<bf16_t *>(dst);
        for (size_t i = 0; i < n; ++i) d[i] = from_f32<bf16_t>(src[i]);
    } else if (t == DType::f16) {
        auto * d = static_cast<f16_t *>(dst);
        for (size_t i = 0; i < n; ++i) d[i] = from_f32<f16_t>(src[i]);
    } else {
        std::memcpy(dst, src, n * sizeof(float));
    }
}

int as_int(size_t c) {
    MF_ASSERT(c <= size_t(INT_MAX));
    return static_cast<int>(c);
}

// Where a call failed: the operation, and the peer rank and tag of a point-to-point call.
struct Site {
    const char * op;
    int peer = -1;
    int tag = -1;
};

// "rank R of N", and the world rank on a communicator made by split() (its ranks are the
// group's; mpirun's messages name world ranks).
std::string rank_label(int rank, int size, int world) {
    if (world < 0 || world == rank) return fmt::format("rank {} of {}", rank, size);
    return fmt::format("rank {} of {} (world rank {})", rank, size, world);
}

std::string comm_error_message(const Site & s, const std::string & who, int rc) {
    std::string peer;
    if (s.peer >= 0 && s.tag >= 0) peer = fmt::format(" (peer rank {}, tag {})", s.peer, s.tag);
    else if (s.peer >= 0) peer = fmt::format(" (root rank {})", s.peer);
    return fmt::format("MPI {} failed on {}{}: {}; a peer rank may have died or the "
                       "transport broke (see mpirun's messages)", s.op, who, peer,
                       mpi_error_string(rc));
}

class MpiRequest final : public CommRequest {
public:
    MpiRequest(std::string who, void * data, size_t n, DType t, const char * op = "Iallreduce")
        : who_(std::move(who)), data_(data), n_(n), t_(t), op_(op) {}
    ~MpiRequest() override {
        // Not waited for: MPI may still write the buffers, so complete before freeing them.
        if (!done_ && !reqs_.empty() && !mpi_finalized())
            MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    }
    MpiRequest(const MpiRequest &) = delete;
    MpiRequest & operator=(const MpiRequest &) = delete;

    // MPI_Testall: completed requests become MPI_REQUEST_NULL, which wait()'s Waitall accepts.
    // An error here is left for wait() to report.
    void poll() override {
        if (done_ || reqs_.empty()) return;
        int flag = 0;
        MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
    }

    void wait() override {
        if (done_) {
            if (!error_.empty()) throw CommError(error_);
            return;
        }
        done_ = true;
        const int rc = reqs_.empty() ? MPI_SUCCESS
            : timed_wait(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE, op_, who_);
        if (rc != MPI_SUCCESS) {
            error_ = comm_error_message({op_}, who_, rc);
            throw CommError(error_);
        }
        if (wide_) narrow(wide_, data_, n_, t_);
        wide_ = nullptr;
        own_ = {};
    }

    // fp32 space for a 16-bit transfer: the caller's scratch, or owned (n elements).
    float * space(float * scratch, size_t n) {
        if (scratch) return scratch;
        own_.resize(n);
        return own_.data();
    }

    std::vector<MPI_Request> reqs_;
    float * wide_ = nullptr;       // the fp32 result of a 16-bit sum, rounded into data on wait()
    std::vector<float> own_;       // fp32 copies when the caller gave no scratch
    std::vector<int> counts_, displs_;   // per-rank arrays MPI reads until completion

private:
    std::string who_;   // rank_label() of the communicator
    void * data_;
    size_t n_;
    DType t_;
    const char * op_;
    bool done_ = false;
    std::string error_;
};

class MpiCommunicator final : public Communicator {
public:
    // Over a duplicate of MPI_COMM_WORLD.
    MpiCommunicator() {
        init_mpi_once();
        world_ = world_rank();
        check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), {"Comm_dup"});
        adopt();
    }
    // Takes ownership of comm (made by split()).
    MpiCommunicator(MPI_Comm comm, int world) : comm_(comm), world_(world) { adopt(); }
    ~MpiCommunicator() override {
        if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
    }
    MpiCommunicator(const MpiCommunicator &) = delete;
    MpiCommunicator & operator=(const MpiCommunicator &) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const char * name() const override { return "mpi"; }

    void all_reduce_sum(void * data, size_t n, DType t) override {
        MF_ASSERT(summable(t) && (data || n == 0));
        if (t == DType::f32) {
            auto * p = static_cast<float *>(data);
            for (size_t off = 0; off < n; off += g_max_count) {
                const size_t c = std::min(g_max_count, n - off);
                run({"Allreduce"}, [&](MPI_Request * r) {
                    return MPI_Iallreduce(MPI_IN_PLACE, p + off, as_int(c), MPI_FLOAT, MPI_SUM, comm_, r);
                });
            }
            return;
        }
        const size_t chunk = std::min(g_max_count, g_scratch_elems);
        std::vector<float> scratch(std::min(chunk, n));
        auto * p = static_cast<unsigned char *>(data);
        for (size_t off = 0; off < n; off += chunk) {
            const size_t c = std::min(chunk, n - off);
            widen(p + off * 2, scratch.data(), c, t);
            run({"Allreduce"}, [&](MPI_Request * r) {
                return MPI_Iallreduce(MPI_IN_PLACE, scratch.data(), as_int(c), MPI_FLOAT, MPI_SUM, comm_, r);
            });
            narrow(scratch.data(), p + off * 2, c, t);
        }
    }

    std::unique_ptr<CommRequest> iall_reduce_sum(void * data, size_t n, DType t, float * scratch) override {
        MF_ASSERT(summable(t) && (data || n == 0));
        auto req = std::make_unique<MpiRequest>(who(), data, n, t);
        float * p = static_cast<float *>(data);
        if (t != DType::f32) {
            p = req->space(scratch, n);
            widen(data, p, n, t);
            req->wide_ = p;
        }
        for (size_t off = 0; off < n; off += g_max_count) {
            const size_t c = std::min(g_max_count, n - off);
            MPI_Request r = MPI_REQUEST_NULL;
            check(MPI_Iallreduce(MPI_IN_PLACE, p + off, as_int(c), MPI_FLOAT, MPI_SUM, comm_, &r),
                  {"Iallreduce"});
            req->reqs_.push_back(r);
        }
        return req;
    }

    void reduce_scatter_sum(const void * in, void * out, size_t n, DType t) override {
        MF_ASSERT(summable(t));
        if (n == 0) return;
        const size_t es = dtype_size(t), R = static_cast<size_t>(size_);
        const auto * pin = static_cast<const unsigned char *>(in);
        auto * pout = static_cast<unsigned char *>(out);
        const bool overlap = pout < pin + R * n * es && pin < pout + n * es;
        MF_ASSERT(!overlap || pout == pin + static_cast<size_t>(rank_) * n * es);
        if (t == DType::f32 && !overlap && n <= g_max_count) {
            run({"Reduce_scatter_block"}, [&](MPI_Request * r) {
                return MPI_Ireduce_scatter_block(in, out, as_int(n), MPI_FLOAT, MPI_SUM, comm_, r);
            });
            return;
        }
        // Packed: chunk c of every rank's block into an fp32 scratch[R * c], summed in place
        // (MPI_IN_PLACE: the result lands in scratch[0, c)). Writing out chunk by chunk is safe
        // when out is this rank's shard of in: later chunks read only later offsets.
        const size_t chunk = std::max<size_t>(1, std::min(g_max_count, g_scratch_elems / R));
        std::vector<float> scratch(R * std::min(chunk, n));
        for (size_t off = 0; off < n; off += chunk) {
            const size_t c = std::min(chunk, n - off);
            for (size_t r = 0; r < R; ++r) widen(pin + (r * n + off) * es, scratch.data() + r * c, c, t);
            run({"Reduce_scatter_block"}, [&](MPI_Request * r) {
                return MPI_Ireduce_scatter_block(MPI_IN_PLACE, scratch.data(), as_int(c), MPI_FLOAT, MPI_SUM, comm_, r);
            });
            narrow(scratch.data(), pout + off * es, c, t);
        }
    }

    std::unique_ptr<CommRequest> ireduce_scatter_sum(const void * in, void * out, const std::vector<size_t> & counts,
                                                     DType t, float * scratch) override {
        MF_ASSERT(summable(t) && counts.size() == size_t(size_));
        const size_t mine = counts[size_t(rank_)];
        auto req = std::make_unique<MpiRequest>(who(), out, mine, t, "Ireduce_scatter");
        size_t total = 0;
        for (size_t c : counts) {
            if (c > size_t(INT_MAX)) throw CommError(fmt::format("MPI Ireduce_scatter: {} elements for one rank exceed MPI's int count", c));
            req->counts_.push_back(int(c));
            total += c;
        }
        const void * src = in;
        void * dst = out;
        if (t != DType::f32) {
            // The input's fp32 copy, summed in place: this rank's result lands at its start.
            float * wide = req->space(scratch, total);
            widen(in, wide, total, t);
            src = MPI_IN_PLACE;
            dst = req->wide_ = wide;
        }
        MPI_Request r = MPI_REQUEST_NULL;
        check(MPI_Ireduce_scatter(src, dst, req->counts_.data(), MPI_FLOAT, MPI_SUM, comm_, &r), {"Ireduce_scatter"});
        req->reqs_.push_back(r);
        return req;
    }

    std::unique_ptr<CommRequest> iall_gather(const void * in, void * out, const std::vector<size_t> & counts,
                                             size_t elem_bytes) override {
        MF_ASSERT(counts.size() == size_t(size_));
        auto req = std::make_unique<MpiRequest>(who(), nullptr, 0, DType::f32, "Iallgatherv");
        size_t off = 0;
        for (size_t c : counts) {
            const size_t b = c * elem_bytes;
            if (b > size_t(INT_MAX) || off > size_t(INT_MAX))
                throw CommError(fmt::format("MPI Iallgatherv: {} bytes at offset {} exceed MPI's int count", b, off));
            req->counts_.push_back(int(b));
            req->displs_.push_back(int(off));
            off += b;
        }
        const auto * pin = static_cast<const unsigned char *>(in);
        auto * pout = static_cast<unsigned char *>(out);
        const bool in_place = pin == pout + req->displs_[size_t(rank_)];
        MPI_Request r = MPI_REQUEST_NULL;
        check(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : in, req->counts_[size_t(rank_)], MPI_BYTE, out,
                              req->counts_.data(), req->displs_.data(), MPI_BYTE, comm_, &r),
              {"Iallgatherv"});
        req->reqs_.push_back(r);
        return req;
    }

    void all_gather(const void * in, void * out, size_t bytes) override {
        if (bytes == 0) return;
        const size_t R = static_cast<size_t>(size_);
        const auto * pin = static_cast<const unsigned char *>(in);
        auto * pout = static_cast<unsigned char *>(out);
        const bool in_place = pin == pout + static_cast<size_t>(rank_) * bytes;
        MF_ASSERT(in_place || pin + bytes <= pout || pout + R * bytes <= pin);
        if (bytes <= g_max_count) {
            run({"Allgather"}, [&](MPI_Request * r) {
                return MPI_Iallgather(in_place ? MPI_IN_PLACE : in, as_int(bytes), MPI_BYTE, out, as_int(bytes),
                                      MPI_BYTE, comm_, r);
            });
            return;
        }
        // Chunk [off, off + c) of every rank: received as one element of a c-byte type whose
        // extent is `bytes`, so rank r's piece lands at out + r * bytes + off.
        for (size_t off = 0; off < bytes; off += g_max_count) {
            const size_t c = std::min(g_max_count, bytes - off);
            MPI_Datatype contig = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
            check(MPI_Type_contiguous(as_int(c), MPI_BYTE, &contig), {"Type_contiguous"});
            check(MPI_Type_create_resized(contig, 0, static_cast<MPI_Aint>(bytes), &strided),
                  {"Type_create_resized"});
            MPI_Type_free(&contig);
            check(MPI_Type_commit(&strided), {"Type_commit"});
            MPI_Request r = MPI_REQUEST_NULL;
            int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : pin + off, as_int(c), MPI_BYTE, pout + off, 1,
                                    strided, comm_, &r);
            if (rc == MPI_SUCCESS) rc = timed_wait(1, &r, MPI_STATUS_IGNORE, "Allgather", who());
            MPI_Type_free(&strided);
            check(rc, {"Allgather"});
        }
    }

    void broadcast(void * data, size_t bytes, int root) override {
        MF_ASSERT(root >= 0 && root < size_);
        auto * p = static_cast<unsigned char *>(data);
        for (size_t off = 0; off < bytes; off += g_max_count) {
            const size_t c = std::min(g_max_count, bytes - off);
            run({"Bcast", root, -1},
                [&](MPI_Request * r) { return MPI_Ibcast(p + off, as_int(c), MPI_BYTE, root, comm_, r); });
        }
    }

    // A message longer than the chunk limit is several MPI messages with the same tag; MPI keeps
    // them in order between one pair of ranks.
    void send(const void * data, size_t bytes, int dst, int tag) override {
        MF_ASSERT(dst >= 0 && dst < size_ && tag >= 0);
        const auto * p = static_cast<const unsigned char *>(data);
        size_t off = 0;
        do {
            const size_t c = std::min(g_max_count, bytes - off);
            run({"Send", dst, tag},
                [&](MPI_Request * r) { return MPI_Isend(p + off, as_int(c), MPI_BYTE, dst, tag, comm_, r); });
            off += c;
        } while (off < bytes);
    }

    void recv(void * data, size_t bytes, int src, int tag) override {
        MF_ASSERT(src >= 0 && src < size_ && tag >= 0);
        auto * p = static_cast<unsigned char *>(data);
        size_t off = 0;
        do {
            const size_t c = std::min(g_max_count, bytes - off);
            MPI_Status st;
            run({"Recv", src, tag},
                [&](MPI_Request * r) { return MPI_Irecv(p + off, as_int(c), MPI_BYTE, src, tag, comm_, r); }, &st);
            int got = 0;
            MPI_Get_count(&st, MPI_BYTE, &got);
            if (static_cast<size_t>(got) != c)
                throw CommError(fmt::format("MPI Recv on {} from rank {} (tag {}): expected {} "
                                            "bytes, the message has {}; the sender's size differs",
                                            who(), src, tag, c, got));
            off += c;
        } while (off < bytes);
    }

    void sendrecv(const void * send_data, size_t send_bytes, int dst, int send_tag, void * recv_data,
                  size_t recv_bytes, int src, int recv_tag) override {
        MF_ASSERT(dst < size_ && src < size_);
        // Every chunk's receive and send posted first, then all completed together.
        std::vector<MPI_Request> reqs;
        std::vector<size_t> expect;
        auto * in = static_cast<unsigned char *>(recv_data);
        const auto * out = static_cast<const unsigned char *>(send_data);
        for (size_t off = 0; src >= 0 && (off < recv_bytes || off == 0); off += g_max_count) {
            const size_t c = std::min(g_max_count, recv_bytes - off);
            reqs.push_back(MPI_REQUEST_NULL);
            expect.push_back(c);
            check(MPI_Irecv(in + off, as_int(c), MPI_BYTE, src, recv_tag, comm_, &reqs.back()), {"Irecv", src, recv_tag});
            if (recv_bytes == 0) break;
        }
        const size_t nrecv = reqs.size();
        for (size_t off = 0; dst >= 0 && (off < send_bytes || off == 0); off += g_max_count) {
            const size_t c = std::min(g_max_count, send_bytes - off);
            reqs.push_back(MPI_REQUEST_NULL);
            check(MPI_Isend(out + off, as_int(c), MPI_BYTE, dst, send_tag, comm_, &reqs.back()), {"Isend", dst, send_tag});
            if (send_bytes == 0) break;
        }
        std::vector<MPI_Status> st(reqs.size());
        check(timed_wait(static_cast<int>(reqs.size()), reqs.data(), st.data(), "Sendrecv", who()),
              {"Waitall", src >= 0 ? src : dst, -1});
        for (size_t i = 0; i < nrecv; ++i) {
            int got = 0;
            MPI_Get_count(&st[i], MPI_BYTE, &got);
            if (static_cast<size_t>(got) != expect[i])
                throw CommError(fmt::format("MPI Irecv on {} from rank {} (tag {}): expected {} bytes, the message "
                                            "has {}; the sender's size differs", who(), src, recv_tag, expect[i], got));
        }
    }

    std::unique_ptr<CommRequest> isend(const void * data, size_t bytes, int dst, int tag) override {
        MF_ASSERT(dst >= 0 && dst < size_ && tag >= 0);
        auto req = std::make_unique<MpiRequest>(who(), nullptr, 0, DType::f32, "Isend");
        const auto * p = static_cast<const unsigned char *>(data);
        size_t off = 0;
        do {
            const size_t c = std::min(g_max_count, bytes - off);
            MPI_Request r = MPI_REQUEST_NULL;
            check(MPI_Isend(p + off, as_int(c), MPI_BYTE, dst, tag, comm_, &r), {"Isend", dst, tag});
            req->reqs_.push_back(r);
            off += c;
        } while (off < bytes);
        return req;
    }

    void barrier() override {
        run({"Barrier"}, [&](MPI_Request * r) { return MPI_Ibarrier(comm_, r); });
    }

    std::unique_ptr<Communicator> split(int color, int key) override {
        MF_ASSERT(color >= 0);   // MPI_UNDEFINED (negative) would leave this rank without one
        MPI_Comm sub = MPI_COMM_NULL;
        check(MPI_Comm_split(comm_, color, key, &sub), {"Comm_split"});
        MF_ASSERT(sub != MPI_COMM_NULL);
        return std::make_unique<MpiCommunicator>(sub, world_);
    }

private:
    // Errors return (as CommError) on comm_, then rank and size. A constructor that throws runs
    // no destructor, so comm_ is freed here on failure.
    void adopt() {
        try {
            check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), {"Comm_set_errhandler"});
            check(MPI_Comm_rank(comm_, &rank_), {"Comm_rank"});
            check(MPI_Comm_size(comm_, &size_), {"Comm_size"});
        } catch (...) {
            MPI_Comm_free(&comm_);
            throw;
        }
    }
    std::string who() const { return rank_label(rank_, size_, world_); }
    // A blocking call as its nonblocking form and a timed wait (the watchdog's).
    template <class Start>
    void run(const Site & s, Start start, MPI_Status * st = MPI_STATUS_IGNORE) const {
        MPI_Request r = MPI_REQUEST_NULL;
        check(start(&r), s);
        check(timed_wait(1, &r, st, s.op, who()), s);
    }
    void check(int rc, const Site & s) const {
        if (rc != MPI_SUCCESS) throw CommError(comm_error_message(s, who(), rc));
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = -1, size_ = 0;
    int world_ = -1;   // this process's rank in MPI_COMM_WORLD
};

}  // namespace

void set_comm_timeout(double seconds) { g_timeout_s = seconds; }
void set_comm_step(long step) { g_step.store(step); }

std::unique_ptr<Communicator> make_mpi_communicator() {
    return std::make_unique<MpiCommunicator>();
}

namespace detail {
size_t set_mpi_max_count(size_t n) {
    MF_ASSERT(n >= 1 && n <= size_t(INT_MAX));
    return std::exchange(g_max_count, n);
}
size_t set_mpi_scratch_elems(size_t n) {
    MF_ASSERT(n >= 1);
    return std::exchange(g_scratch_elems, n);
}
}  // namespace detail

}  // namespace memfit
