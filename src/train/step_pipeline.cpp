// The pipeline-parallel part of the step program (train/step.h): one stage's forwards and
// backwards of every micro-batch in the schedule's order, with the transfers between stages.
#include "train/step.h"

#include <functional>
#include <vector>

#include "core/error.h"

namespace memfit {

Tensor TrainStep::micro(BufferId id, DType dt, int mb) const {
    const int64_t n = int64_t(B_) * T_;
    return Tensor(id, dt, {n}, size_t(mb) * size_t(n) * dtype_size(dt));
}

void TrainStep::pipeline(Graph & g, const StepScalars & s, const Transformer::LayerHook & done, int slot) const {
    const int64_t b = B_, t = T_, n = b * t;
    const bool train = mode_ == StepMode::train;
    if (!pp_.last()) {   // the loss is the last stage's; the others report zeros
        g.phase(Phase::other);
        g.layer(-1);
        g.fill_zero(Tensor(losses, DType::f32, {n * pp_.micro_batches}));
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
    // Data parallel: each chunk's gradients are final after its last backward, and the rest
    // (embedding, head) after the step's last.
    std::vector<int> last_of_chunk(size_t(V), -1);
    int last_backward = -1;
    for (size_t j = 0; j < order.size(); ++j)
        if (!order[j].fwd) last_of_chunk[size_t(order[j].chunk)] = last_backward = int(j);
    auto hook = [&](int j) -> Transformer::LayerHook {
        if (!done || last_of_chunk[size_t(order[size_t(j)].chunk)] != j) return {};
        if (j == last_backward) return done;
        return [&](Graph & gg, int l) { if (l >= 0) done(gg, l); };
    };
    if (V > 1) {
        interleaved(g, s, order, hook, slot);
        return;
    }
    for (size_t j = 0; j < order.size(); ++j) {
        const PipeAction a = order[j];
        const Transformer & M = *models_[size_t(a.mb)];
        const Tensor tok = micro(tokens, DType::i32, a.mb).view(0, {b, t});
        if (a.fwd) {
            exchange(pp_.first() ? Tensor{} : M.input(), prev, kActivation);
            M.forward(g, w_, tok);
            if (pp_.last()) {
                M.head_loss(g, w_, train ? &dw_ : nullptr, micro(targets, DType::i32, a.mb), micro(losses, DType::f32, a.mb),
                            s.dloss);
            } else {
                held = {M.output(), next, kActivation};
            }
            continue;
        }
        exchange(pp_.last() ? Tensor{} : M.output_grad(), next, kGradient);
        M.backward(g, w_, dw_, tok, hook(int(j)));
        if (!pp_.first()) held = {M.input_grad(), prev, kGradient};
    }
    exchange(Tensor{}, -1, 0);
}

void TrainStep::interleaved(Graph & g, const StepScalars & s, const std::vector<PipeAction> & order,
                            const std::function<Transformer::LayerHook(int)> & hook, int slot) const {
    const int64_t b = B_, t = T_;
    const int P = pp_.stages, V = int(chunks_.size()), last_v = P * V - 1;
    const bool train = mode_ == StepMode::train;
    // Sends start at once and complete at the step's end; receives block. Each message's tag
    // names its micro-batch, sending virtual stage and direction, so no two can be confused.
    auto tag = [&](int dir, int mb, int v) { return (mb * (P * V) + v) * 2 + dir; };
    const int up = (pp_.stage + 1) % P, down = (pp_.stage + P - 1) % P;
    std::vector<std::pair<int, Tensor>> sent;
    auto send = [&](Tensor x, int dst, int tg) {
        g.phase(Phase::communication);
        g.layer(-1);
        g.pp_send_start(x, dst, tg, slot + int(sent.size()));
        sent.push_back({slot + int(sent.size()), x});
    };
    auto recv = [&](Tensor x, int src, int tg) {
        g.phase(Phase::communication);
        g.layer(-1);
        g.pp_exchange(Tensor{}, -1, 0, x, src, tg);
    };
    for (size_t j = 0; j < order.size(); ++j) {
        const PipeAction a = order[j];
        const int v = a.chunk * P + pp_.stage;   // the virtual stage
        const Transformer & M = *models_[size_t(a.mb * V + a.chunk)];
        const Tensor tok = micro(tokens, DType::i32, a.mb).view(0, {b, t});
        if (a.fwd) {
            if (v > 0) recv(M.input(), down, tag(0, a.mb, v - 1));
            M.forward(g, w_, tok);
            if (v == last_v)
                M.head_loss(g, w_, train ? &dw_ : nullptr, micro(targets, DType::i32, a.mb), micro(losses, DType::f32, a.mb),
                            s.dloss);
            else
                send(M.output(), up, tag(0, a.mb, v));
            continue;
        }
        if (v < last_v) recv(M.output_grad(), up, tag(1, a.mb, v + 1));
        M.backward(g, w_, dw_, tok, hook(int(j)));
        if (v > 0) send(M.input_grad(), down, tag(1, a.mb, v));
    }
    g.phase(Phase::communication);
    g.layer(-1);
    for (const auto & [k, x] : sent) g.comm_wait(k, {x});
}

}  // namespace memfit
