// The step program for one configuration: the persistent buffers (parameters, gradients, AdamW
// moments, the batch) plus the model's forward, loss, backward and optimizer ops, recorded once
// into a Program. run() is the single source of truth: the constructor records it through a
// recording Graph, and the engine executes the very same calls.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/graph.h"
#include "memory/program.h"
#include "model/activation_offload.h"
#include "model/config.h"
#include "model/transformer.h"
#include "model/param_layout.h"
#include "model/pipeline.h"
#include "train/shards.h"

namespace memfit {

enum class StepMode {
    train,    // forward, loss, backward, gradient norm, AdamW
    eval,     // forward and loss
    logits,   // forward only; the logits buffer keeps the logits
};

// Every optimizer state unset (-1: the row keeps no such state).
inline std::array<BufferId, kMaxOptimizerStates> no_states() {
    std::array<BufferId, kMaxOptimizerStates> a;
    a.fill(-1);
    return a;
}

// Which ends of a training step a program includes (gradient accumulation splits one optimizer
// step into several micro-steps: the first zeroes the gradients, the last updates).
struct StepParts {
    bool zero_grads = true;
    bool optimizer = true;
    // Data parallel: sum the gradients over the ranks before the optimizer, bucket by bucket
    // (one per layer) as soon as backward has finished each layer's.
    bool reduce_grads = false;
};

// Data parallelism as one rank's program sees it: ranks, this rank, the ZeRO stage (EngineOptions
// has the meaning of each) and the gradient bucket size.
struct DataParallel {
    int ranks = 1, rank = 0, zero = 0;
    size_t bucket_bytes = 0;
};

struct StepScalars {
    float      dloss = 0;       // 1 / (number of non-ignored targets in the batch)
    OptimHyper optim;           // lr, betas, eps, weight decay (applied to >= 2-D tensors), t
    uint64_t   seed = 0;        // this micro-step's random stream (LoRA dropout)
    // Mixture of experts: the router losses' weights in this micro-batch's gradient (Transformer::
    // set_router_loss_scale).
    float      moe_aux = 0, moe_z = 0;
};

// A frozen model beside the trained one (a distillation teacher, preference tuning's reference
// copy): its forward-only Transformer, its weights' buffers (a dense part in `dtype`, dense_layout
// order, and packed projections, quant) and their views.
struct FrozenModel {
    std::unique_ptr<Transformer> model;
    ModelConfig cfg;
    ParamLayout layout;
    QuantLayout quant;
    ModelWeights w;
    BufferId dense = -1, packed = -1;
    DType dtype = DType::f32;
};

class TrainStep {
public:
    // `sizing` answers library-scratch queries while recording (the backend that will run it).
    // Model options (loss_chunk, flash_attention) come from `model`; the mode decides the rest.
    // Pipeline parallel (pp.enabled()): the program is this stage's whole step, pp.micro_batches
    // micro-batches of B sequences in the schedule's order, each with its own activations (what
    // is in flight together is live together); parts must be the whole step.
    TrainStep(const ModelConfig & cfg, int B, int T, StepMode mode, const Backend * sizing,
              const ModelOptions & model = {}, StepParts parts = {}, const DataParallel & dp = {},
              const PipelineParallel & pp = {});

    void run(Graph & g, const StepScalars & s) const;

    const Program & program() const { return program_; }
    const ModelConfig & config() const { return cfg_; }
    // The trainable parameters: the whole model, or (LoRA) the adapters.
    const ParamLayout & layout() const { return layout_; }
    bool lora() const { return lora_; }
    // LoRA: the frozen base, dense part (`base`, compute dtype) and quantized projections (`base_q`).
    const ParamLayout & base_layout() const { return base_layout_; }
    const QuantLayout & quant_layout() const { return quant_layout_; }
    // Distillation: the teacher's configuration (null: none), dense layout and packed projections.
    const ModelConfig * teacher_config() const { return teacher_.model ? &teacher_.cfg : nullptr; }
    const ParamLayout & teacher_layout() const { return teacher_.layout; }
    const QuantLayout & teacher_quant() const { return teacher_.quant; }
    // Preference tuning's reference (model/preference.h): a copy's weights and forward, or
    // adapters-off's forward alone (dense -1); model null under precompute.
    const FrozenModel & reference_model() const { return reference_; }
    const PreferenceOptions & preference() const { return pref_; }
    // Every frozen weight buffer (LoRA's base, a teacher's, a reference copy's; -1: absent).
    std::array<BufferId, 6> frozen_buffers() const {
        return {base, base_q, teacher, teacher_q, reference_.dense, reference_.packed};
    }
    StepMode mode() const { return mode_; }
    int B() const { return B_; }
    // Micro-batches of B x T tokens the program reads (pipeline: all of the step's; else 1).
    int micro_batches() const { return pp_.enabled() ? pp_.micro_batches : 1; }
    const PipelineParallel & pipeline() const { return pp_; }
    // Pipeline: the stage's blocks; and the order of its work.
    StageRange stage_range() const { return range_; }
    int T() const { return T_; }

    // This rank's shard of the flat trainable buffer: elements [lo, hi), padded length `size`
    // (ZeRO 0: [0, total)).
    size_t shard_lo() const { return lo_; }
    size_t shard_hi() const { return hi_; }
    size_t shard_size() const { return S_; }
    const DataParallel & data_parallel() const { return dp_; }
    // Elements of [a, b) in rank r's shard; and in every rank's, in rank order.
    size_t in_shard(size_t a, size_t b, int r) const { return shards_.in(a, b, r); }
    std::vector<size_t> shard_counts(size_t a, size_t b) const { return shards_.counts(a, b); }
    // The most of [a, b) any one rank's shard holds (the rank with the most of a bucket).
    size_t most_in_shard(size_t a, size_t b) const { return shards_.most(a, b); }
    // LoRA's frozen base as each rank holds it: ZeRO 3 shards its dense part (elements of
    // base_layout().total) and its packed projections (bytes of quant_layout().bytes) like the
    // trainable buffer, and gathers them layer by layer; else whole on every rank.
    const FlatShards & base_shards() const { return sources_[kBase].sh; }
    const FlatShards & base_q_shards() const { return sources_[kBaseQ].sh; }

    // Persistent buffers the host reads or writes between steps. params holds the trainable
    // weights in the compute dtype (ZeRO 3: this rank's shard); under mixed precision `master`
    // holds them in fp32 (else -1; ZeRO >= 1: the shard). grads: the whole gradient (ZeRO >= 2:
    // the shard). opt_states: the optimizer's states (backend/optimizer.h's row, in its order; -1
    // past its count), this rank's shard of them.
    BufferId params, master, grads, tokens, targets, losses, grad_norm_sq;
    std::array<BufferId, kMaxOptimizerStates> opt_states = no_states();
    BufferId base = -1, base_q = -1;   // LoRA's frozen base
    // Knowledge distillation (model/distill.h, training programs only): the teacher's weights, a
    // dense part (teacher_layout(), compute dtype) and its packed projections (teacher_quant()).
    BufferId teacher = -1, teacher_q = -1;
    // Preference tuning (training and evaluation programs): each row's log-probability of its
    // trained targets under the reference (f32 [B]; written by the host under `precompute`, else
    // by the step) and under the policy (f32 [B], written by the step), read by the host after
    // each run for the rewards.
    BufferId ref_logps = -1, policy_logps = -1;
    // Packed documents (ModelOptions::documents): each token's document start in its row, i32
    // [B,T] beside tokens and targets (-1: one document per row).
    BufferId doc_start = -1;
    // Sliding-window attention (sliding_window below T): each query's first key, [B,T] i32, filled
    // by the engine before each run (Engine::run_batch; Transformer::set_attention_start).
    BufferId attn_start = -1;
    // Context parallelism (ModelOptions::cp): i32 [3,B,T], filled by the engine before each run
    // (Engine::run_batch; Transformer::set_context).
    BufferId context = -1;
    // --offload optimizer: the states of the shard's first offloaded_elems() elements (block
    // states: their first offloaded_blocks() blocks) live in these buffers, category offloaded
    // (-1: none); the resident buffers above hold the rest, from that element (block) on.
    // A unit's staging (below) also has `params`, the compute-precision weights it writes back
    // when they are offloaded too.
    struct States {
        BufferId master = -1, params = -1;
        std::array<BufferId, kMaxOptimizerStates> opt = no_states();
    };
    States offloaded;
    // --offload optimizer+params: `params` (the ZeRO-3 shard) is in the offloaded category too;
    // the gathers read their part of it into staging buffers first, and the update writes it.
    bool params_offloaded() const { return params_off_; }
    size_t offloaded_elems() const { return off_elems_; }
    size_t offloaded_blocks() const { return off_blocks_; }
    DType compute() const { return compute_; }
    bool sr_master() const { return sr_; }   // bf16 weights updated with stochastic rounding, no master
    DType grad_dtype() const { return grad_dt_; }
    Optimizer optimizer() const { return optimizer_; }
    bool optimizer_in_backward() const { return in_bwd_; }
    bool first_moment() const { return first_moment_; }   // Adafactor's, with --adafactor-beta1
    // This rank's part of each trainable tensor, as the optimizer updates it: n elements from
    // element `at` of the shard, for the piece's matrix [rows, cols] (a whole two-dimensional
    // parameter; else [1, n]) at GaLore's rank for it (0: not projected); where each kind of
    // state starts for it (`off`, by StateSize: its elements at `at`, 8-bit blocks never straddling
    // two tensors, Adafactor's factored statistics, GaLore's projector and projected moments).
    struct MomentPiece {
        size_t at, n;
        int64_t rows = 1, cols = 0, rank = 0;
        StateLens off{};
        size_t block() const { return off[size_t(StateSize::blocks)]; }
    };
    const std::vector<MomentPiece> & moment_pieces() const { return pieces_; }
    Tensor logits() const { return model_->logits(); }
    // Mixture of experts: the routing statistics (Transformer::moe_stats; invalid for a dense model).
    Tensor moe_stats() const { return model_->moe_stats(); }
    // --offload activations: the bytes of activations the step keeps in the store (0: none).
    uint64_t offloaded_activation_bytes() const { return act_offload_ ? act_offload_->bytes() : 0; }

private:
    ModelConfig cfg_;
    ParamLayout layout_, base_layout_;
    QuantLayout quant_layout_;
    bool lora_ = false;
    StepMode mode_;
    StepParts parts_;
    int B_, T_;
    DType compute_, grad_dt_;
    Optimizer optimizer_;
    std::vector<MomentPiece> pieces_;
    // Offload: the update of the offloaded states goes unit by unit (at most offload_unit elements
    // of one parameter, from shard element `at`; its 8-bit scales from block `block`), each
    // staged through transient buffers (`stage`) in device memory.
    struct Unit { size_t at, n, block; bool decay; States stage; };
    std::vector<Unit> units_;
    size_t off_elems_ = 0, off_blocks_ = 0;
    bool params_off_ = false;
    // The store's copy slots: the update's units take 0..3, a group's weight reads kParamReadSlot
    // on (one per group, direction and copy, as the gathers' flags).
    static constexpr int kParamReadSlot = 4;
    void offloaded_update(Graph & g, const StepScalars & s) const;
    // The optimizer's states of a view [rows, cols] at GaLore rank `rank`, each kind's from its
    // element off[kind] of the buffers `ids` (the resident ones, the offloaded ones or a unit's
    // staging); the scratch's from its start.
    OptimizerStates state_views(const std::array<BufferId, kMaxOptimizerStates> & ids, const StateLens & off,
                                int64_t rows, int64_t cols, int64_t rank = 0) const;
    // Element and 8-bit block counts (or offsets) alone: an offload unit's, or a vector's.
    static StateLens flat_lens(size_t elems, size_t blocks) {
        StateLens o{};
        lens_at(o, StateSize::elements) = elems, lens_at(o, StateSize::blocks) = blocks;
        return o;
    }
    bool sr_ = false;   // --master-weights bf16-sr
    bool first_moment_ = false;
    // --optimizer-in-backward: every layer's gradients in its own bucket (declare_sync), updated
    // as soon as the bucket is whole (and, with data parallelism, summed); grad_norm_sq adds up
    // the buckets' squares as they go (reported, never used: no clipping).
    bool in_bwd_ = false;
    void update_bucket(Graph & g, const StepScalars & s, int bucket) const;
    // The updates of this rank's part of the parameters that start in [a, b) of the layout, from
    // the resident states, their gradients in buffer `gbuf` (flat element x at x - gbase).
    void update(Graph & g, const StepScalars & s, size_t a, size_t b, BufferId gbuf, size_t gbase, Tensor norm_sq) const;
    Tensor weights(size_t px, int64_t n) const;
    const ParamInfo & param_at(size_t x) const;   // the trainable parameter holding flat element x
    Program program_;
    BufferId workspace_ = -1;
    std::vector<std::unique_ptr<Transformer>> models_;   // one per micro-batch (pipeline), else one
    Transformer * model_ = nullptr;
    StageRange range_;
    std::vector<StageRange> chunks_;   // the stage's chunks of blocks (one unless interleaved)
    // Pipeline, tied embedding: the token table's gradient on this stage (summed with the other
    // end's), and a 16-bit sum's fp32 copy.
    Tensor tied_grad_, tied_scratch_;
    // A range [a, b) of the trainable layout as this rank's gradient buffer holds it: `n`
    // elements from element `at` of the buffer, the range's elements from `skip` on (the whole
    // range; ZeRO >= 2: its part in the rank's shard, the same on every rank of a tensor group).
    struct GradPart { size_t at, n, skip, len; };
    std::vector<GradPart> grad_parts(const std::vector<TpRange> & ranges) const;
    // Replicated parameters whose gradients each tensor rank computes in part (sequence parallel:
    // the norms', from its rows; LoRA: the adapter matrices beside a split one), summed over the
    // tensor group once the step's backward is done, and a 16-bit sum's fp32 copy (the largest).
    std::vector<GradPart> partial_parts_;
    Tensor partial_scratch_;
    // Expert parallel: the dense (non-expert) parameters' gradients, summed over the expert group
    // once the step's backward is done (each rank's tokens' share), and a 16-bit sum's fp32 copy.
    ExpertParallel ep_;
    std::vector<GradPart> ep_parts_;
    Tensor ep_scratch_;
    // Tensor parallel with fewer KV heads than ranks: the k|v ranges, summed over the ranks that
    // hold the same KV head through a buffer with one slot per KV head (this rank's: kv_slot_).
    std::vector<GradPart> kv_parts_;
    Tensor kv_buf_, kv_scratch_;
    int kv_slot_ = 0;
    ModelWeights w_, dw_;   // the weights and gradients as declared (before ZeRO's remapping)
    // Distillation: the teacher and the loss's settings.
    FrozenModel teacher_;
    DistillHead distill_;
    void declare_teacher(const ModelOptions & student);
    // Declares f: cfg's weights (packed as `fmt` when given) in dtype dt, category cat, names
    // from `prefix`, and its forward-only Transformer with the student's chunking and documents.
    void declare_frozen(FrozenModel & f, const ModelConfig & cfg, const QuantFormat * fmt, DType dt, Category cat,
                        const std::string & prefix, const ModelOptions & student);
    // f's forward-only Transformer alone (weights come from elsewhere: adapters-off's base).
    void declare_forward_only(FrozenModel & f, const ModelConfig & cfg, DType dt, const std::string & prefix,
                              const ModelOptions & student);
    // Preference tuning: its options, reference copy and each row's gradient factor (f32 [B*T]).
    PreferenceOptions pref_;
    FrozenModel reference_;
    Tensor pref_scale_;
    void declare_preference(const ModelOptions & mo);
    // The reference's log-probabilities into ref_logps (nothing under `precompute`), its
    // per-token losses passing through `loss`; then, after the policy's forward, its losses,
    // the pairs' loss and (training) the LM head's backward with the rows' factors.
    void reference_pass(Graph & g, Tensor tok, Tensor tgt, Tensor loss) const;
    void preference_loss(Graph & g, const StepScalars & s, Tensor tgt, Tensor loss) const;
    DataParallel dp_;
    PipelineParallel pp_;
    size_t lo_ = 0, hi_ = 0, S_ = 0;
    FlatShards shards_;
    // The flat buffers ZeRO 3 shards and gathers: the trainable parameters, and LoRA's frozen base
    // (dense part in the compute dtype, packed projections in bytes; flat -1 when absent).
    struct Source { BufferId flat = -1; DType dt = DType::f32; FlatShards sh; std::string name; };
    static constexpr int kTrainable = 0, kBase = 1, kBaseQ = 2;
    Source sources_[3];
    // Copies of the per-layer transients (ZeRO 3's gathered weights, ZeRO >= 2's gradient
    // buckets): one, or under pipeline parallelism one per micro-batch, so that a layer's copy
    // lives only through that micro-batch's forward or backward (the rest's: one for the step).
    int copies_ = 1;
    // Groups: runs of adjacent parameters of one layer (-1: outside the blocks), [a, b) of a
    // source's flat buffer. ZeRO 3 gathers each into `fwd` before its forward and `bwd` before its
    // backward (the rest's groups: once, into fwd, for the whole step); copy c's in fwd[c], bwd[c].
    struct Group {
        int layer;
        size_t a, b;
        int src = kTrainable;
        std::vector<BufferId> fwd, bwd;
        // Offloaded weights: this rank's part, read from the store before each gather (the
        // largest part any rank holds, so every rank's plan is the same), like fwd and bwd.
        std::vector<BufferId> fwd_in, bwd_in;
    };
    void frozen_groups();   // LoRA under ZeRO 3: the base's groups, after the trainable ones
    std::vector<Group> groups_;
    // Gradient buckets: adjacent groups reduced together, from layer `top` down to `bottom`
    // (-1: a rest group). ZeRO >= 2: the bucket's gradients live in `grad` from its top layer's
    // backward until reduce-scattered into the shard (through `recv` when accumulating).
    // `scratch` (category communication): a 16-bit sum's fp32 copies while it is in flight.
    // `part` (--optimizer-in-backward under ZeRO >= 2): this rank's part of the summed bucket, the
    // reduce-scatter's output, live until the part's update (there is no gradient shard).
    struct BucketBuffers { BufferId grad = -1, recv = -1, scratch = -1, part = -1; };
    struct Bucket {
        int top, bottom;
        size_t a, b;
        std::vector<BucketBuffers> copy;   // [copies_]; a rest bucket's are all the first's
    };
    std::vector<Bucket> buckets_;
    bool all_reduce_ = false, reduce_scatter_ = false;
    // The buckets' dtype. ZeRO >= 2 accumulating in fp32 (grad_dt_) from 16-bit compute: one
    // micro-batch's gradients in the compute dtype, reduce-scattered in it, in place, into the
    // bucket's part in this rank's shard and added from there to the fp32 shard (widen()), as
    // FSDP's and DeepSpeed's mixed precision do: accumulation widens the shard, not the buckets.
    DType bucket_dt_ = DType::f32;
    bool widen() const { return bucket_dt_ != grad_dt_; }
    // The weights as each copy's forward and backward read them (ZeRO 3: gathered), and the
    // gradients each copy's backward writes (ZeRO >= 2: into its buckets).
    std::vector<ModelWeights> wf_, wb_, dws_;
    void declare_sync(const Backend * sizing, const std::string & pre);   // train/step_sync.cpp
    // The constructor's parts, in declaration order (buffer ids follow it).
    void check_and_lay_out(const ModelConfig & cfg, const ModelOptions & model);
    void declare_base(const LoraOptions & lora);
    void declare_states(const ModelOptions & model, const std::string & pre);
    void declare_models(const ModelConfig & cfg, const ModelOptions & model);
    // The gradient norm's ranges and the sums after backward (train/step_fixups.cpp).
    void declare_fixups(const ModelConfig & cfg, const ModelOptions & model, const Backend * sizing,
                        const std::string & pre);
    void tensor_fixups(Graph & g) const;
    // --offload activations: records the step once as it is (the probe), lets act_offload_ choose
    // the buffers that move, and leaves program_ holding the declarations alone, theirs added.
    void plan_activation_offload(const ModelOptions & model, const Backend * sizing);
    std::unique_ptr<ActivationOffload> act_offload_;
    class Sync;   // the run's ZeRO and data-parallel transfers in flight (train/step_sync.cpp)
    TensorParallel tp_;
    // The ranges of the gradient buffer whose squares this rank adds to the global norm, and
    // (tensor parallel) the one-float buffer each range's sum passes through.
    std::vector<TpRange> norm_ranges_;
    BufferId norm_part_ = -1;

    Tensor grad_view(const Bucket & k, int copy = 0) const;
    // --optimizer-in-backward under ZeRO >= 2: this rank's part of bucket k (null when it holds none).
    Tensor part_view(const Bucket & k) const;
    void optimizer(Graph & g, const StepScalars & s) const;
    // Pipeline: the stage's forwards and backwards in schedule order, with the transfers between
    // stages and `sync`'s gathers and reductions around each.
    // Micro-batch mb's B x T rows of the batch buffer `id` (tokens, targets, losses).
    Tensor micro(BufferId id, DType dt, int mb) const;
    // Transfers that outlive their op (interleaved sends) take communication slots from `slot` on.
    void pipeline(Graph & g, const StepScalars & s, Sync & sync, int slot) const;
    // The interleaved schedule: sends started at once (completed at the step's end), receives
    // blocking.
    struct ActionSync;   // a pipeline action's gathers and reductions (train/step_pipeline.cpp)
    void interleaved(Graph & g, const StepScalars & s, const std::vector<PipeAction> & order, const ActionSync & as,
                     int slot) const;
    // norm_sq = this rank's share of the gradients' sum of squares, summed over the tensor group.
    void grad_norm(Graph & g, Tensor norm_sq) const;
};

}  // namespace memfit
