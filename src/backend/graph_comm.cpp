// Graph's collectives (backend/graph.h): data parallelism's and ZeRO's transfers in flight, the
// tensor, pipeline, embedding and context groups' blocking ones, and the context ring's block ops.
#include "backend/graph.h"

#include <vector>

#include "backend/collectives.h"
#include "memory/step_memory.h"

namespace memfit {
namespace {
// The fp32 scratch a 16-bit transfer needs, checked against what was declared (null: none).
float * scratch_ptr(const Tensor & resolved, size_t need) {
    if (need == 0 || !resolved.valid()) return nullptr;
    MF_ASSERT(size_t(resolved.numel()) >= need && "communication scratch smaller than comm_scratch_elems");
    return resolved.f32();
}
}  // namespace

void Graph::all_reduce_start(Tensor t, int slot, Tensor scratch) {
    if (begin("all_reduce_start", double(t.numel()), {t, scratch})) {
        MF_ASSERT(comm_ && slot >= 0);
        if (pending_.size() <= size_t(slot)) pending_.resize(size_t(slot) + 1);
        const Tensor r = resolve(t);
        float * s = scratch_ptr(scratch.valid() ? resolve(scratch) : Tensor{},
                                comm_scratch_elems(r.dtype, comm_->size(), size_t(r.numel())));
        pending_[size_t(slot)] = comm_->iall_reduce_sum(r.data, size_t(r.numel()), r.dtype, s);
    }
    end();
}

void Graph::all_reduce_wait(Tensor t, int slot) {
    if (begin("all_reduce_wait", 0, {t})) {
        MF_ASSERT(size_t(slot) < pending_.size() && pending_[size_t(slot)]);
        pending_[size_t(slot)]->wait();
        pending_[size_t(slot)].reset();
    }
    end();
}

void Graph::reduce_scatter_start(Tensor in, Tensor out, const std::vector<size_t> & counts, int slot, Tensor scratch) {
    if (begin("reduce_scatter_start", double(in.numel()), {in, out, scratch})) {
        MF_ASSERT(comm_ && slot >= 0 && counts.size() == size_t(comm_->size()));
        MF_ASSERT(counts[size_t(comm_->rank())] == 0 || size_t(out.numel()) >= counts[size_t(comm_->rank())]);
        if (pending_.size() <= size_t(slot)) pending_.resize(size_t(slot) + 1);
        const Tensor i = resolve(in), o = out.valid() ? resolve(out) : Tensor{};
        float * s = scratch_ptr(scratch.valid() ? resolve(scratch) : Tensor{},
                                comm_scratch_elems(in.dtype, comm_->size(), size_t(in.numel())));
        pending_[size_t(slot)] = comm_->ireduce_scatter_sum(i.data, o.data, counts, in.dtype, s);
    }
    end();
}

void Graph::all_gather_start(Tensor out, Tensor in, const std::vector<size_t> & counts, int slot) {
    if (begin("all_gather_start", 0, {out, in})) {
        MF_ASSERT(comm_ && slot >= 0 && counts.size() == size_t(comm_->size()));
        MF_ASSERT(size_t(in.valid() ? in.numel() : 0) == counts[size_t(comm_->rank())]);
        if (pending_.size() <= size_t(slot)) pending_.resize(size_t(slot) + 1);
        const Tensor o = resolve(out), i = in.valid() ? resolve(in) : Tensor{};
        pending_[size_t(slot)] = comm_->iall_gather(i.data, o.data, counts, dtype_size(out.dtype));
    }
    end();
}

void Graph::comm_wait(int slot, std::initializer_list<Tensor> uses) {
    if (begin("comm_wait", 0, uses)) {
        MF_ASSERT(size_t(slot) < pending_.size() && pending_[size_t(slot)]);
        pending_[size_t(slot)]->wait();
        pending_[size_t(slot)].reset();
    }
    end();
}

void Graph::blocking_sum(Collectives * c, Tensor t, Tensor scratch) {
    const Tensor r = resolve(t);
    float * s = scratch_ptr(scratch.valid() ? resolve(scratch) : Tensor{},
                            comm_scratch_elems(r.dtype, c->size(), size_t(r.numel())));
    c->iall_reduce_sum(r.data, size_t(r.numel()), r.dtype, s)->wait();
}

void Graph::tp_all_reduce(Tensor t, Tensor scratch) {
    if (begin("tp_all_reduce", double(t.numel()), {t, scratch})) {
        MF_ASSERT(tp_comm_ && "set_tensor_communicator() before tensor-parallel collectives");
        blocking_sum(tp_comm_, t, scratch);
    }
    end();
}

void Graph::ep_all_reduce(Tensor t, Tensor scratch) {
    if (begin("ep_all_reduce", double(t.numel()), {t, scratch})) {
        MF_ASSERT(ep_comm_ && "set_expert_communicator() before expert-parallel collectives");
        blocking_sum(ep_comm_, t, scratch);
    }
    end();
}

void Graph::data_all_reduce(Tensor t) {
    if (begin("data_all_reduce", double(t.numel()), {t})) {
        MF_ASSERT(t.dtype == DType::f32 && ep_comm_ && comm_);
        blocking_sum(ep_comm_, t, Tensor{});
        blocking_sum(comm_, t, Tensor{});
    }
    end();
}

void Graph::ep_all_to_all(Tensor out, Tensor in) {
    if (begin("ep_all_to_all", 0, {out, in})) {
        MF_ASSERT(ep_comm_ && "set_expert_communicator() before expert-parallel collectives");
        MF_ASSERT(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % ep_comm_->size() == 0);
        ep_comm_->all_to_all(resolve(in).data, resolve(out).data, in.nbytes() / size_t(ep_comm_->size()));
    }
    end();
}

void Graph::pp_all_reduce(Tensor t, Tensor scratch) {
    if (begin("pp_all_reduce", double(t.numel()), {t, scratch})) {
        MF_ASSERT(pp_comm_ && "set_pipeline_communicator() before pipeline collectives");
        blocking_sum(pp_comm_, t, scratch);
    }
    end();
}

void Graph::emb_all_reduce(Tensor t, Tensor scratch) {
    if (begin("emb_all_reduce", double(t.numel()), {t, scratch})) {
        MF_ASSERT(emb_comm_ && "set_embedding_communicator() before summing a tied embedding");
        blocking_sum(emb_comm_, t, scratch);
    }
    end();
}

void Graph::pp_send_start(Tensor t, int dst, int tag, int slot) {
    if (begin("pp_send_start", 0, {t})) {
        MF_ASSERT(pp_comm_ && slot >= 0 && "set_pipeline_communicator() before pipeline transfers");
        if (pending_.size() <= size_t(slot)) pending_.resize(size_t(slot) + 1);
        const Tensor r = resolve(t);
        pending_[size_t(slot)] = pp_comm_->isend(r.data, r.nbytes(), dst, tag);
    }
    end();
}

void Graph::pp_exchange(Tensor send, int dst, int send_tag, Tensor recv, int src, int recv_tag) {
    if (begin("pp_exchange", 0, {send, recv})) {
        MF_ASSERT(pp_comm_ && "set_pipeline_communicator() before pipeline transfers");
        MF_ASSERT(send.valid() == (dst >= 0) && recv.valid() == (src >= 0));
        const Tensor a = send.valid() ? resolve(send) : Tensor{}, b = recv.valid() ? resolve(recv) : Tensor{};
        pp_comm_->sendrecv(a.data, a.valid() ? a.nbytes() : 0, dst, send_tag, b.data, b.valid() ? b.nbytes() : 0,
                           src, recv_tag);
    }
    end();
}

void Graph::tp_all_gather(Tensor out, Tensor in) {
    if (begin("tp_all_gather", 0, {out, in})) {
        MF_ASSERT(tp_comm_ && "set_tensor_communicator() before tensor-parallel collectives");
        MF_ASSERT(out.dtype == in.dtype && out.numel() == int64_t(tp_comm_->size()) * in.numel());
        tp_comm_->all_gather(resolve(in).data, resolve(out).data, in.nbytes());
    }
    end();
}

void Graph::tp_reduce_scatter(Tensor out, Tensor in, Tensor scratch) {
    if (begin("tp_reduce_scatter", double(in.numel()), {out, in, scratch})) {
        MF_ASSERT(tp_comm_ && "set_tensor_communicator() before tensor-parallel collectives");
        reduce_scatter_now(tp_comm_, resolve(out), resolve(in), scratch.valid() ? resolve(scratch) : Tensor{});
    }
    end();
}

void Graph::reduce_scatter_now(Collectives * c, Tensor out, Tensor in, Tensor scratch) {
    const int R = c->size();
    MF_ASSERT(out.dtype == in.dtype && in.numel() == int64_t(R) * out.numel());
    float * s = scratch_ptr(scratch, comm_scratch_elems(in.dtype, R, size_t(in.numel())));
    const std::vector<size_t> counts(size_t(R), size_t(out.numel()));
    c->ireduce_scatter_sum(in.data, out.data, counts, in.dtype, s)->wait();
}

void Graph::cp_all_gather(Tensor out, Tensor in) {
    if (begin("cp_all_gather", 0, {out, in})) {
        MF_ASSERT(cp_comm_ && "set_context_communicator() before context-parallel collectives");
        MF_ASSERT(out.dtype == in.dtype && out.numel() == int64_t(cp_comm_->size()) * in.numel());
        cp_comm_->all_gather(resolve(in).data, resolve(out).data, in.nbytes());
    }
    end();
}

void Graph::cp_ring_exchange(Tensor send, Tensor recv) {
    if (begin("cp_ring_exchange", 0, {send, recv})) {
        MF_ASSERT(cp_comm_ && "set_context_communicator() before context-parallel transfers");
        MF_ASSERT(send.nbytes() == recv.nbytes());
        const int R = cp_comm_->size(), r = cp_comm_->rank();
        const Tensor a = resolve(send), b = resolve(recv);
        cp_comm_->sendrecv(a.data, a.nbytes(), (r + 1) % R, 0, b.data, b.nbytes(), (r + R - 1) % R, 0);
    }
    end();
}

void Graph::cp_block_fwd(Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH, int KVH,
                         bool first) {
    const double hd = double(qkv.cols()) / double(NH + 2 * KVH);
    const double flops = 4.0 * double(qkv.rows()) * double(kv.dim(1)) / 2.0 * double(NH) * hd;   // about half masked
    if (begin("cp_block_fwd", flops, {acc, lse, qkv, kv, kpos, meta}))
        backend_->cp_block_fwd(resolve(acc), resolve(lse), resolve(qkv), resolve(kv), resolve(kpos), resolve(meta), NH,
                               KVH, first);
    end();
}

void Graph::cp_block_bwd(Tensor dq, Tensor dkv, Tensor dout, Tensor out, Tensor qkv, Tensor kv, Tensor lse, Tensor kpos,
                         Tensor meta, int NH, int KVH) {
    const size_t bytes = size_t(qkv.rows()) * size_t(NH) * sizeof(float);
    if (recording_) grow_workspace(bytes);
    const double hd = double(qkv.cols()) / double(NH + 2 * KVH);
    const double flops = 2.5 * 4.0 * double(qkv.rows()) * double(kv.dim(1)) / 2.0 * double(NH) * hd;
    if (begin("cp_block_bwd", flops, {dq, dkv, dout, out, qkv, kv, lse, kpos, meta}, true))
        backend_->cp_block_bwd(resolve(dq), resolve(dkv),
                               resolve(Tensor(workspace_, DType::f32, {int64_t(bytes / sizeof(float))})), resolve(dout),
                               resolve(out), resolve(qkv), resolve(kv), resolve(lse), resolve(kpos), resolve(meta), NH,
                               KVH);
    end();
}

void Graph::cp_qkv_grad(Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH) {
    if (begin("cp_qkv_grad", 0, {dqkv, dq, dkv})) backend_->cp_qkv_grad(resolve(dqkv), resolve(dq), resolve(dkv), NH, KVH);
    end();
}

void Graph::cp_reduce_scatter(Tensor out, Tensor in, Tensor scratch) {
    if (begin("cp_reduce_scatter", double(in.numel()), {out, in, scratch})) {
        MF_ASSERT(cp_comm_ && "set_context_communicator() before context-parallel collectives");
        reduce_scatter_now(cp_comm_, resolve(out), resolve(in), scratch.valid() ? resolve(scratch) : Tensor{});
    }
    end();
}

}  // namespace memfit
