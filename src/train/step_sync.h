// The run's ZeRO and data-parallel transfers (train/step_sync.cpp), private to the step program's
// files: which of ZeRO 3's gathers have started and been waited for (per copy and direction), and
// which gradient buckets' reductions are in flight.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "train/step.h"

namespace memfit {

class TrainStep::Sync {
public:
    explicit Sync(const TrainStep & st);
    // Communication slots: bucket i uses i; group j's gathers nb + j (forward) and nb + ng + j
    // (backward); then the norm's sum, the weights' all-gather, and a pipeline's sends.
    int norm_slot() const { return nb_ + 2 * ng_; }
    int params_slot() const { return norm_slot() + 1; }

    // ZeRO 3: the groups holding `layer`'s weights (-1: the rest's) gathered for one direction of
    // copy `copy`; await also waits for them (once).
    void gather(Graph & g, int layer, bool backward, int copy);
    void await(Graph & g, int layer, bool backward, int copy);
    // Offloaded weights (--offload optimizer+params): the reads of `layer`'s parts from the store
    // started, one layer before their gather (which starts any not started, and waits for them).
    void prefetch(Graph & g, int layer, bool backward, int copy);
    void forward_begin(Graph & g, int l, int copy);
    void backward_begin(Graph & g, int l, int copy, int lowest);
    void backward_done(Graph & g, int l, int copy);
    // The rest's buckets (embedding, head): zeroed, and reduced, once for the step.
    void zero_rest(Graph & g);
    void reduce_rest(Graph & g);
    // Every reduction in flight finished (into the shard).
    void flush(Graph & g);
    // Called with each bucket as it finishes (--optimizer-in-backward: its update).
    std::function<void(Graph &, int)> on_finish;

private:
    const TrainStep & st_;
    int nb_, ng_;
    std::vector<char> started_, waited_, read_;
    std::vector<std::pair<int, int>> in_flight_;   // (bucket, copy)
    bool serves(const Group & q, int layer) const;
    size_t flag(int group, bool backward, int copy) const;
    int slot(int group, bool backward) const { return nb_ + group + (backward ? ng_ : 0); }
    // Group j's part of this rank's shard (null when it holds none): the flat buffer's view, and
    // (offloaded weights) the staging buffer's it is read into for one direction and copy.
    Tensor own(int j) const;
    Tensor staged(int j, bool backward, int copy) const;
    Tensor shard_piece(const Bucket & k) const;
    Tensor receive(const Bucket & k, int copy) const;
    Tensor own_part(const Bucket & k, int copy) const;
    Tensor scratch(const Bucket & k, int copy) const;
    void start(Graph & g, int bucket, int copy);
    void finish(Graph & g, int bucket, int copy);
    void into_shard(Graph & g, const Bucket & k, int bucket, int copy);   // ZeRO >= 2: the bucket's part, added
};

}  // namespace memfit
