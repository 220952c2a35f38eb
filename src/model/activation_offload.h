// --offload activations: the activations a layer's forward saves for its backward leave the device
// once its forward is done and come back one layer ahead of its backward (torchtune's activation
// offloading, Megatron's). Which buffers those are follows from the program, not from a list kept
// beside the model: the step is recorded once as it is (the probe), and a buffer moves when
//   - it is an activation made in the blocks' forward (the embedding's output counts),
//   - the rest of the forward and the head (loss) leave it alone, and
//   - the blocks' backward uses it again, and nothing after the backward does;
// it is the saved activation of the layer whose backward (or recomputation) reads it first (a
// layer's input is its own, made by the layer below), moved when that layer is offloaded.
// Then the step is recorded again with the moves: after layer l's forward, offload_write of each
// buffer whose last forward use was in layer l into its copy in the store ("offloaded.<name>",
// category offloaded), waited for after layer l + 1's forward (the buffer's last use: its bytes
// go back to the arena); before layer m + 1's backward, offload_read of what layer m's backward
// (or recomputation) uses first into "<name>.reload", waited for before layer m's, and from
// there on Graph::alias sends every op's view of the buffer to its reload. The kernels and their
// inputs are the same, so the gradients are bit for bit those of the resident run, and the two
// copies are planned and measured like every other op: the plan stays exact.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/graph.h"
#include "memory/program.h"

namespace memfit {

class ActivationOffload {
public:
    // layers: how many layers from the program's first are offloaded (<= 0: all).
    explicit ActivationOffload(int layers) : layers_(layers) {}

    // The Transformer's hooks, called in both recordings and in the execution.
    void forward_begin(Graph & g);
    void forward_done(Graph & g, int l);    // after layer l's forward
    void backward_begin(Graph & g, int l);  // before layer l's backward and its recomputation
    void backward_done(Graph & g);          // after the blocks' (and the embedding's) backward

    // After the probe: chooses the moved buffers from `probe` (the step recorded with these hooks
    // and no moves) and declares their store copies and reload buffers in `program` (the step's
    // declarations without ops), which the next recording fills. Blocks [lb, le); slot_base: the
    // first of the store's copy slots the moves take (two per layer).
    void plan(const Program & probe, Program & program, int lb, int le, int slot_base);
    bool planned() const { return planned_; }

    // What moves: bytes in the store (one copy of each moved buffer) and buffers.
    uint64_t bytes() const { return bytes_; }
    size_t buffers() const { return moved_.size(); }

private:
    struct Moved {
        BufferId buf = -1, stored = -1, reload = -1;
        size_t bytes = 0;
        int write_after = 0;   // the layer after whose forward it is written
        int read_for = 0;      // the layer before whose backward it is back
    };
    static Tensor bytes_view(BufferId b, size_t bytes) { return Tensor(b, DType::u8, {int64_t(bytes)}); }
    int write_slot(int l) const { return slot_base_ + 2 * l; }
    int read_slot(int l) const { return slot_base_ + 2 * l + 1; }
    void read(Graph & g, int l) const;      // starts layer l's reads
    void wait_writes(Graph & g, int l) const;
    // Probe: the layer whose forward (backward) segment holds op `at` (-1: none).
    int forward_layer(int at) const;
    int backward_layer(int at) const;

    int layers_ = 0, slot_base_ = 0, lb_ = 0, le_ = 0;
    bool planned_ = false;
    // Probe positions (ops issued): forward begin, each layer's forward end and backward begin,
    // the backward's end; by layer index.
    int fwd_begin_ = -1, bwd_done_ = -1;
    std::vector<int> fwd_done_, bwd_begin_;
    int top_ = -1;                          // the first layer backward visits
    std::vector<Moved> moved_;
    uint64_t bytes_ = 0;
};

}  // namespace memfit
