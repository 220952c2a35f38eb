// The pipeline-parallel part of the step program (train/step.h): one stage's forwards and
// backwards of every micro-batch in the schedule's order, with the transfers between stages.
#include "train/step_sync.h"

#include <functional>
#include <vector>

#include "core/error.h"

namespace memfit {

Tensor TrainStep::micro(BufferId id, DType dt, int mb) const {
    const int64_t n = int64_t(B_) * T_;
    return Tensor(id, dt, {n}, size_t(mb) * size_t(n) * dtype_size(dt));
}

// The data-parallel and ZeRO side of a pipeline's actions: before a forward (ZeRO 3's gathers),
// around a backward (gathers, and the gradient buckets: reduced after the last backward of each
// chunk; ZeRO >= 2 reduce-scatters every micro-batch's into the shard), and after it.
struct TrainStep::ActionSync {
    const TrainStep & st;
    Sync & sync;
    std::vector<int> last_of_chunk;
    int last_backward = -1;

    ActionSync(const TrainStep & s, Sync & y, const std::vector<PipeAction> & order, int chunks)
        : st(s), sync(y), last_of_chunk(size_t(chunks), -1) {
        for (size_t j = 0; j < order.size(); ++j)
            if (!order[j].fwd) last_of_chunk[size_t(order[j].chunk)] = last_backward = int(j);
    }
    int copy(const PipeAction & a) const { return st.copies_ > 1 ? a.mb : 0; }
    Transformer::LayerHook before_forward(Graph & g, const PipeAction & a, const Transformer & M) const {
        if (st.dp_.zero < 3) return {};
        g.phase(Phase::communication);
        g.layer(-1);
        sync.await(g, -1, false, 0);   // the rest's weights, once for the step
        sync.gather(g, M.layer_begin(), false, copy(a));
        const int c = copy(a);
        return [this, c](Graph & gg, int l) { sync.forward_begin(gg, l, c); };
    }
    void before_backward(Graph & g, const PipeAction & a, const Transformer & M) const {
        if (st.dp_.zero < 3) return;
        g.phase(Phase::communication);
        g.layer(-1);
        sync.gather(g, M.layer_end() - 1, true, copy(a));   // during the wait for the gradient
    }
    Transformer::LayerHook begin(const PipeAction & a, const Transformer & M) const {
        if (!st.reduce_scatter_ && st.dp_.zero < 3) return {};
        const int c = copy(a), lowest = M.lowest_trained_layer();
        return [this, c, lowest](Graph & gg, int l) { sync.backward_begin(gg, l, c, lowest); };
    }
    Transformer::LayerHook done(int j, const PipeAction & a) const {
        const int c = copy(a);
        if (st.reduce_scatter_)   // every micro-batch's layers; the rest's at the step's end
            return [this, c](Graph & gg, int l) { if (l >= 0) sync.backward_done(gg, l, c); };
        if (!st.all_reduce_ || last_of_chunk[size_t(a.chunk)] != j) return {};
        const bool rest = j == last_backward;   // the rest's (embedding, head) after the step's last
        return [this, rest](Graph & gg, int l) { if (l >= 0 || rest) sync.backward_done(gg, l, 0); };
    }
    void after_backward(Graph & g) const {
        if (!st.reduce_scatter_) return;
        g.phase(Phase::communication);
        g.layer(-1);
        sync.flush(g);   // the micro-batch's buckets are in the shard before the next one's open
    }
};

void TrainStep::pipeline(Graph & g, const StepScalars & s, Sync & sync, int slot) const {
    const int64_t b = B_, t = T_, n = b * t;
    const bool train = mode_ == StepMode::train;
    if (!pp_.last()) {   // the loss is the last stage's; the others report zeros
        g.phase(Phase::other);
        g.layer(-1);
        g.fill_zero(Tensor(losses, DType::f32, {n * pp_.micro_batches}));
    }
    if (train && reduce_scatter_) {   // the rest's gradients accumulate over the step
        g.phase(Phase::other);
        g.layer(-1);
        sync.zero_rest(g);
    }
    const int prev = pp_.first() ? -1 : pp_.stage - 1, next = pp_.last() ? -1 : pp_.stage + 1;
    constexpr int kActivation = 0, kGradient = 1;   // message tags
    // A send is held until the next receive, and both go in one exchange: with the neighbour's
    // matching exchange, 1F1B's opposite-direction transfers cannot wait on each other.
    struct Send { Tensor t; int peer = -1, tag = 0; } held;
    auto exchange = [&](Tensor recv, int src, int tag) {
        if (!held.t.valid() && !recv.valid()) return;
        g.phase(Phase::communication);
        g.layer(-1);
        g.pp_exchange(held.t, held.t.valid() ? held.peer : -1, held.tag, recv, recv.valid() ? src : -1, tag);
        held = {};
    };
    const int V = int(chunks_.size());
    std::vector<PipeAction> order;
    if (train) order = pipeline_schedule(pp_.schedule, pp_.stages, pp_.stage, pp_.micro_batches, V);
    else
        for (int i = 0; i < pp_.micro_batches; ++i)
            for (int c = 0; c < V; ++c) order.push_back({true, i, c});
    const ActionSync as(*this, sync, order, V);
    if (V > 1) {
        interleaved(g, s, order, as, slot);
        return;
    }
    for (size_t j = 0; j < order.size(); ++j) {
        const PipeAction a = order[j];
        const Transformer & M = *models_[size_t(a.mb)];
        const Tensor tok = micro(tokens, DType::i32, a.mb).view(0, {b, t});
        const int c = as.copy(a);
        if (a.fwd) {
            const Transformer::LayerHook begin = as.before_forward(g, a, M);
            exchange(pp_.first() ? Tensor{} : M.input(), prev, kActivation);
            M.forward(g, wf_[size_t(c)], tok, begin);
            if (pp_.last()) {
                M.head_loss(g, wf_[size_t(c)], train ? &dws_[size_t(c)] : nullptr, micro(targets, DType::i32, a.mb),
                            micro(losses, DType::f32, a.mb), s.dloss);
            } else {
                held = {M.output(), next, kActivation};
            }
            continue;
        }
        as.before_backward(g, a, M);
        exchange(pp_.last() ? Tensor{} : M.output_grad(), next, kGradient);
        M.backward(g, wb_[size_t(c)], dws_[size_t(c)], tok, as.done(int(j), a), as.begin(a, M));
        as.after_backward(g);
        if (!pp_.first()) held = {M.input_grad(), prev, kGradient};
    }
    exchange(Tensor{}, -1, 0);
}

void TrainStep::interleaved(Graph & g, const StepScalars & s, const std::vector<PipeAction> & order,
                            const ActionSync & as, int slot) const {
    const int64_t b = B_, t = T_;
    const int P = pp_.stages, V = int(chunks_.size()), last_v = P * V - 1;
    const bool train = mode_ == StepMode::train;
    // Sends start at once; receives block. Each message's tag names its micro-batch, sending
    // virtual stage and direction, so no two can be confused. A send completes just after the
    // receive of the peer's first message back once it has the send (interleaved_send_waits),
    // so the boundary activations and gradients in flight are the micro-batches in flight's,
    // not every one of the step's; training only (evaluation's order is forwards only).
    const std::vector<PipeMessage> msgs = train ? interleaved_messages(P, pp_.stage, pp_.micro_batches, V)
                                                : std::vector<PipeMessage>{};
    const std::vector<int> wait_at = train ? interleaved_send_waits(P, pp_.stage, pp_.micro_batches, V)
                                           : std::vector<int>{};
    const int up = (pp_.stage + 1) % P, down = (pp_.stage + P - 1) % P;
    std::vector<std::vector<int>> waits_after(msgs.size());   // by receive: the sends it completes
    for (size_t i = 0; i < wait_at.size(); ++i)
        if (wait_at[i] >= 0) waits_after[size_t(wait_at[i])].push_back(int(i));
    std::vector<std::pair<int, Tensor>> sent(msgs.size());   // by message: its slot and tensor
    std::vector<std::pair<int, Tensor>> at_end;
    int next = 0, used = 0;   // the next message's index in msgs; slots taken
    auto check = [&](bool send, int tg) {
        MF_ASSERT((!train || (next < int(msgs.size()) && msgs[size_t(next)].send == send &&
                              msgs[size_t(next)].tag == tg)) && "the interleaved schedule's messages moved");
        return next++;
    };
    auto send = [&](Tensor x, int dst, int tg) {
        const int i = check(true, tg), k = slot + used++;
        g.phase(Phase::communication);
        g.layer(-1);
        g.pp_send_start(x, dst, tg, k);
        if (train && wait_at[size_t(i)] >= 0) sent[size_t(i)] = {k, x};
        else at_end.push_back({k, x});
    };
    auto recv = [&](Tensor x, int src, int tg) {
        const int r = check(false, tg);
        g.phase(Phase::communication);
        g.layer(-1);
        g.pp_exchange(Tensor{}, -1, 0, x, src, tg);
        if (train)
            for (const int i : waits_after[size_t(r)]) g.comm_wait(sent[size_t(i)].first, {sent[size_t(i)].second});
    };
    for (size_t j = 0; j < order.size(); ++j) {
        const PipeAction a = order[j];
        const int v = a.chunk * P + pp_.stage;   // the virtual stage
        const Transformer & M = *models_[size_t(a.mb * V + a.chunk)];
        const Tensor tok = micro(tokens, DType::i32, a.mb).view(0, {b, t});
        const size_t c = size_t(as.copy(a));
        if (a.fwd) {
            const Transformer::LayerHook begin = as.before_forward(g, a, M);
            if (v > 0) recv(M.input(), down, pipe_tag(false, a.mb, v - 1, P, V));
            M.forward(g, wf_[c], tok, begin);
            if (v == last_v)
                M.head_loss(g, wf_[c], train ? &dws_[c] : nullptr, micro(targets, DType::i32, a.mb),
                            micro(losses, DType::f32, a.mb), s.dloss);
            else
                send(M.output(), up, pipe_tag(false, a.mb, v, P, V));
            continue;
        }
        as.before_backward(g, a, M);
        if (v < last_v) recv(M.output_grad(), up, pipe_tag(true, a.mb, v + 1, P, V));
        M.backward(g, wb_[c], dws_[c], tok, as.done(int(j), a), as.begin(a, M));
        as.after_backward(g);
        if (v > 0) send(M.input_grad(), down, pipe_tag(true, a.mb, v, P, V));
    }
    g.phase(Phase::communication);
    g.layer(-1);
    for (const auto & [k, x] : at_end) g.comm_wait(k, {x});
}

}  // namespace memfit
