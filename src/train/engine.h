// Engine: one model configuration made runnable. It records the training (and evaluation)
// step programs, places them, checks the placement against the memory budget before obtaining
// anything, obtains the regions, and executes steps with the ledger measuring live and
// reserved bytes per category as they happen.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "memory/timeline.h"
#include "model/sparsity.h"
#include "train/step.h"

namespace memfit { class Communicator; }

namespace memfit {

// fp16 dynamic loss scaling: start at 2^16, halve and skip the step on inf/NaN gradients,
// double after `growth_interval` clean steps.
struct LossScaler {
    float scale = 65536.0f;
    int   clean = 0;              // clean steps since the last change
    int   growth_interval = 2000; // clean steps before the scale doubles
    float min_scale = 1.0f;       // never halved below this
    bool  dynamic = true;         // false: a static scale (an overflowing step is still skipped)
    long long skipped = 0;        // steps skipped so far
    // Records one step's outcome; returns whether the step's update was applied.
    bool update(bool finite);
};

struct EngineOptions {
    int      B = 8, T = 256;
    bool     with_eval = true;       // also build the forward+loss program for validation
    bool     checking = false;       // own allocation per buffer, poisoned after last use
    uint64_t budget = 0;             // bytes; 0 = no budget check
    int      loss_chunk = 0;         // tokens per LM-head + loss chunk; 0 = the whole batch at once
    int      mlp_chunk = 0;          // TiledMLP: tokens per MLP chunk (ModelOptions::mlp_chunk); 0 = untiled
    bool     flash_attention = false;// tiled attention (no T x T buffer)
    // Packed documents (--packing): the batch carries each token's document start (B*T i32,
    // "batch.doc_start"); train_step and eval_loss then take it.
    bool     documents = false;
    RecomputePlan recompute;         // what each layer keeps for backward (model/recompute.h)
    int      grad_accum = 1;         // micro-batches of B sequences per optimizer step
    // Storage of weights and activations. bf16/f16 add fp32 master weights (counted with the
    // optimizer states, as in the ZeRO paper); gradients are stored in the compute dtype for one
    // micro-batch and in fp32 when accumulated over several (ZeRO >= 2: the shard in fp32, each
    // micro-batch's buckets in the compute dtype).
    DType    compute = DType::f32;
    // --optimizer: backend/optimizer.h's row (its states and their dtypes: AdamW's fp32 moments by
    // default). The kernels update every state in f32; the host sees the moments as f32, the
    // values they hold exactly (SGD's second moment: zeros).
    Optimizer optimizer = Optimizer::adamw;
    // --optimizer-in-backward (train/step.h): each layer updated at the end of its backward.
    bool     optimizer_in_backward = false;
    int      galore_rank = 128;      // --galore-rank (--optimizer galore-adamw[-8bit])
    bool     adafactor_first_moment = false;   // --adafactor-beta1 > 0
    // --offload optimizer: the share (0..1] of this rank's master weights and moments kept off
    // the device (0: none), in a file under offload_dir when given (any backend whose kernels read
    // host memory), else in the backend's host memory (pinned on CUDA). The update stages them
    // through device memory unit by unit (train/step.h), with the same kernels: bit for bit the
    // in-memory run's.
    double   offload = 0;
    // --offload optimizer+params (needs ZeRO 3 and offload 1): the weights' shard leaves the
    // device too, read into device memory a layer ahead of each gather and written back by the
    // update (ModelOptions::offload_params).
    bool     offload_params = false;
    // --offload activations (ModelOptions::offload_activations): the layers' saved activations go
    // to the same store between their forward and backward (the first offload_activation_layers
    // layers'; 0: all).
    bool     offload_activations = false;
    int      offload_activation_layers = 0;
    std::string offload_dir;
    // --master-weights bf16-sr (bf16 compute): no fp32 master weights; AdamW updates the bf16
    // weights in place with stochastic rounding (backend/stochastic_round.h), its draws seeded by
    // (seed, step), so a resumed run draws the same.
    bool     sr_master = false;
    size_t   offload_unit = kOffloadUnit;   // elements per staged unit (ModelOptions::offload_unit)
    // LoRA (model/lora.h): only the adapters train; the base is frozen, optionally quantized.
    LoraOptions lora;
    // Knowledge distillation (model/distill.h): a frozen teacher in the training programs.
    DistillOptions distill;
    // Preference tuning (model/preference.h): pairs of rows, a reference, the DPO loss.
    PreferenceOptions pref;
    // --sparsity N:M (model/sparsity.h): once `start` updates are applied, train_step prunes the
    // block projections by magnitude (on the host, the whole model: full_params, set_params) and
    // from then on every update keeps their zeros (OptimHyper::keep_zeros). No buffer is added.
    NmSparsity sparsity;
    LossScaler loss_scaling;         // fp16: the loss scaler's settings and starting scale
    uint64_t seed = 0;               // random streams of the steps (LoRA dropout): seed, step, micro-step
    // Data parallel over `data_parallel` ranks (B is this rank's micro-batch): gradients are
    // summed over `comm` before the optimizer, token counts and losses too. The plan needs only
    // the count; the engine needs the communicator (null: single process).
    int data_parallel = 1;
    Communicator * comm = nullptr;
    // ZeRO stage over the data-parallel ranks (docs/design.md): 1 shards the fp32 master weights
    // and AdamW moments, 2 also the gradients (reduce-scattered bucket by bucket), 3 also the
    // parameters (all-gathered per layer before its forward and again before its backward).
    // Shards are contiguous, equal-size (padded) ranges of the flat trainable buffer.
    int zero = 0;
    // The rank whose program is built (the engine takes comm->rank(); the planner any rank:
    // every rank's buffers have the same sizes).
    int rank = 0;
    // Gradient buckets: adjacent blocks' gradients are reduced together until a bucket holds at
    // least this many bytes (0: one bucket per block). The parameters outside the blocks are
    // their own buckets.
    size_t bucket_bytes = 0;
    // Tensor parallel over `tensor_parallel` ranks (model/tensor_parallel.h): this rank holds the
    // tp_rank-th slice of every block, the embedding and the head. tp_comm: the tensor group
    // (null: single process); `comm` is then the data-parallel group. The step's loss and
    // gradients are those of the whole model: every rank of a tensor group reads the same batch.
    int tensor_parallel = 1, tp_rank = 0;
    Communicator * tp_comm = nullptr;
    // Expert parallel over `expert_parallel` ranks (model/expert_parallel.h): this rank holds the
    // ep_rank-th share of every sparse layer's experts. ep_comm: the expert group (consecutive
    // data ranks, each reading its own batch); `comm` and data_parallel are then the ranks
    // holding the same experts (the expert-data group: ZeRO shards and gradient sums over it),
    // so the whole data-parallel world is data_parallel x expert_parallel ranks.
    int expert_parallel = 1, ep_rank = 0;
    Communicator * ep_comm = nullptr;
    float moe_capacity_factor = 0;   // model/expert_parallel.h (0: its default)
    bool moe_drop_probs = true;      // its drop policy: probs (else position)
    // Sequence parallel (with tensor parallel): norms and residual adds on 1/tensor_parallel of
    // the rows, all-gathers and reduce-scatters in place of the all-reduces.
    bool sequence_parallel = false;
    // Context parallel over `context_parallel` ranks (model/context_parallel.h): T is this rank's
    // rows of each sequence (the whole's / context_parallel: cp_rank's two chunks), the batch's
    // doc_start holds their documents' starts in the whole sequence. cp_comm: the context group;
    // `comm` (data_parallel, rank) then spans data x context ranks: they all sum the gradients
    // and count the step's tokens, each its own.
    int context_parallel = 1, cp_rank = 0;
    bool cp_ring = false;   // --cp-comm-type p2p: the keys and values pass around as a ring
    Communicator * cp_comm = nullptr;
    // Pipeline parallel over `pipeline_parallel` stages (model/pipeline.h): this rank runs stage
    // pp_rank, and the grad_accum micro-batches of a step are the schedule's, all in one step
    // program. pp_comm: the pipeline group (its rank s is stage s); emb_comm: the first and the
    // last stage, which sum a tied embedding's gradient (needed when the head is tied).
    int pipeline_parallel = 1, pp_rank = 0;
    PipeSchedule schedule = PipeSchedule::one_f_one_b;
    int virtual_stages = 1;          // interleaved: chunks per stage
    Communicator * pp_comm = nullptr, * emb_comm = nullptr;
    PipelineParallel pp(int micro_batches) const {
        return PipelineParallel{pipeline_parallel, pp_rank, micro_batches, schedule, virtual_stages};
    }
    DType grad_dtype() const { return grad_accum > 1 ? DType::f32 : compute; }
    DataParallel dp() const { return DataParallel{data_parallel, rank, zero, bucket_bytes}; }
    ModelOptions model() const {
        ModelOptions m;
        m.loss_chunk = loss_chunk;
        m.mlp_chunk = mlp_chunk;
        m.flash_attention = flash_attention;
        m.documents = documents;
        m.recompute = recompute;
        m.compute = compute;
        m.grad = grad_dtype();
        m.optimizer = optimizer;
        m.optimizer_in_backward = optimizer_in_backward;
        m.galore_rank = galore_rank;
        m.adafactor_first_moment = adafactor_first_moment;
        m.offload = offload;
        m.offload_params = offload_params;
        m.offload_activations = offload_activations;
        m.offload_activation_layers = offload_activation_layers;
        m.offload_unit = offload_unit;
        m.sr_master = sr_master;
        m.lora = lora;
        m.distill = distill;
        m.pref = pref;
        m.tp.ranks = tensor_parallel;
        m.tp.rank = tp_rank;
        m.tp.sequence = sequence_parallel;
        m.cp = ContextParallel{context_parallel, cp_rank, cp_ring};
        m.ep = ExpertParallel{expert_parallel, ep_rank, moe_capacity_factor, expert_parallel * data_parallel,
                              moe_drop_probs};
        return m;
    }
};

// The step programs of one configuration and their placements, and nothing obtained: what
// the engine runs, and what `--fit auto`, `--recompute budget` and the hints evaluate.
class StepPlans {
public:
    // place = false: the programs' live bytes only (peak_live(); reserved() is then refused).
    StepPlans(const ModelConfig & cfg, const Backend & backend, const EngineOptions & opt, bool place = true);
    ~StepPlans();

    // Bytes every region of the run needs: the training plan plus any secondary arena that
    // does not fit inside the training one.
    CategoryBytes reserved() const;
    // Peak live bytes per category over the training and the secondary programs.
    CategoryBytes peak_live() const;

    // train is the step's last (or only) micro-step: it holds the optimizer. With accumulation,
    // first zeroes the gradients and mid only accumulates; both run in train's memory.
    std::unique_ptr<TrainStep> train, first, mid, eval;
    MemoryPlan train_plan, first_plan, mid_plan, eval_plan;
    // Programs that run in train's memory, with their plans.
    std::vector<std::pair<const TrainStep *, const MemoryPlan *>> secondary() const;
};

// What an optimizer step carries forward: fp32 weights (master weights under mixed precision),
// AdamW moments, the step count and the loss scaler. The same across engine configurations of
// one model, so training can move between them (run-time re-planning; checkpoints).
// Under ZeRO each rank holds a shard: elements [offset, offset + params.size()) of the flat
// trainable buffer of `total` elements (total 0: the whole buffer, offset 0).
struct TrainState {
    std::vector<float> params, m, v;
    size_t offset = 0, total = 0;
    int t = 0;
    struct { float scale = 1; int clean = 0; long long skipped = 0; } scaler;
};

// The same fields read where they are (n elements each at params, m, v): a checkpoint written
// from the engine's own host fp32 buffers needs no second copy of the state in memory.
struct TrainStateView {
    const float * params = nullptr, * m = nullptr, * v = nullptr;
    size_t n = 0, offset = 0, total = 0;
    int t = 0;
    decltype(TrainState::scaler) scaler;
};
inline TrainStateView view_of(const TrainState & s) {
    return {s.params.data(), s.m.data(), s.v.data(), s.params.size(), s.offset, s.total, s.t, s.scaler};
}

struct StepResult {
    float  loss = 0;          // mean over non-ignored targets
    float  grad_norm = 0;     // global L2 norm of the gradients (before the update; inf/NaN if skipped)
    int    tokens = 0;        // non-ignored targets
    bool   skipped = false;   // nothing was updated (fp16's overflow, or a --skip-spikes limit)
    bool   loss_outlier = false;   // skipped for its loss (OptimHyper::skip_above_loss)
    float  loss_scale = 1;    // the scale this step's loss gradient was multiplied by
    // Preference tuning: the loss is the mean over the step's pairs; TRL's metrics (sums).
    PreferenceMetrics pref;
    // Mixture of experts: the load-balancing loss and the router z-loss (means over the step's
    // micro-batches and data-parallel ranks; `loss` includes them times their coefficients, as
    // transformers' does), and the tokens each expert received ([sparse layers, E], this rank's;
    // expert parallel: its expert group's).
    float  aux_loss = 0, z_loss = 0;
    std::vector<float> expert_tokens;
    // Expert parallel: the routed choices dropped past the capacity in the step, every rank's.
    double moe_dropped = 0;
};


class Engine {
public:
    Engine(const ModelConfig & cfg, Backend & backend, const EngineOptions & opt);
    ~Engine();

    // GPT-2 initialisation: N(0, 0.02) weights, c_proj weights N(0, 0.02/sqrt(2L)), zero
    // biases, unit LayerNorm weights. AdamW moments zeroed. LoRA: the base gets these values
    // (set_base), A ~ N(0, 1/in), B = 0; DoRA's magnitudes the base's row norms. A distillation teacher gets such weights too (seed + 1),
    // until set_teacher.
    void init_params(uint64_t seed);
    // LoRA: the frozen base from the whole model's fp32 weights (make_param_layout order),
    // rounded to the compute dtype or quantized; each rank keeps its part (ZeRO 3: its shard).
    // DoRA: the magnitudes start again at the adapted rows' norms on this base (PEFT's start), so
    // adapters trained on it are loaded after. packed: the projections already packed in the
    // step's quantized layout (a GPTQ folder's bytes, stored as they are; `full` then holds them
    // dequantized); not with tensor parallelism, which splits them.
    void set_base(const float * full, const std::vector<uint8_t> * packed = nullptr);
    // LoRA: the base as the step computes with it (rounded or dequantized), as fp32 in
    // make_param_layout order (ZeRO 3: gathered over the data-parallel ranks, collective).
    std::vector<float> base_weights();
    // Distillation: the teacher's weights from its whole model's fp32 weights (make_param_layout
    // order of its config), rounded to the compute dtype or packed.
    void set_teacher(const float * full);
    // The frozen weights' raw bytes (LoRA's base, a distillation teacher; empty when neither),
    // carried over when the run is re-planned.
    std::vector<uint8_t> export_frozen() const;
    void import_frozen(const std::vector<uint8_t> & bytes);
    // The whole model's fp32 weights as the step computes with them: params(), or (LoRA) the
    // base with the adapters folded in (merge_lora).
    std::vector<float> merged_weights();
    // Host views of persistent buffers (a device backend's are host copies, downloaded at each
    // call, and params_changed() uploads what was written into params()'s). params() is
    // the fp32 truth (the master weights under mixed precision) of this rank's shard: element
    // shard().lo of the flat buffer first (without ZeRO: the whole model). After writing it, call
    // params_changed() to refresh the compute-precision copy (collective under ZeRO 1 and 2).
    // grads() needs fp32 gradients, whole (ZeRO 0 or 1); adam_m/adam_v are the shard's, as f32
    // (bf16 moments widened exactly), to read.
    float * params();
    void params_changed();
    float * grads();
    const float * adam_m();
    const float * adam_v();
    // The whole trainable fp32 weights (make_param_layout / make_lora_layout order), the same
    // on every rank: each takes its shard (tensor parallel: of its slice) and the
    // compute-precision copy (no communication).
    void set_params(const float * full);

    // One optimizer step on grad_accum micro-batches laid end to end (grad_accum*B*T inputs and
    // targets; targets may hold -100). The loss is the mean over all their non-ignored targets,
    // as if they were one batch. doc_start: packed documents (EngineOptions::documents), each
    // token's document start in its row, laid out like the inputs (FormatError when a row's are
    // not starts: 0 <= s[t] <= t, each either t or the previous token's).
    // Preference tuning (EngineOptions::pref): rows 2i and 2i + 1 are a pair, the loss is the
    // mean of the pairs' and `ref_logps` (under --reference precompute) holds each row's
    // reference log-probability, laid out like the rows.
    StepResult train_step(const int32_t * inputs, const int32_t * targets, const OptimHyper & h,
                          const int32_t * doc_start = nullptr, const float * ref_logps = nullptr);
    // Mean loss of a batch without updating anything (needs with_eval); preference tuning: its
    // metrics after it in eval_preference().
    float eval_loss(const int32_t * inputs, const int32_t * targets, const int32_t * doc_start = nullptr,
                    const float * ref_logps = nullptr);
    const PreferenceMetrics & eval_preference() const { return eval_pref_; }
    // Preference tuning: each row's log-probability of its trained targets under the weights as
    // they are (the evaluation program on one batch of B rows; --reference precompute's source).
    std::vector<float> row_logps(const int32_t * inputs, const int32_t * targets, const int32_t * doc_start = nullptr);
    // The reference copy (--reference copy) from the whole model's fp32 weights; and from the
    // model as the step computes with it now (LoRA: its base; else the weights), which is where
    // a run starts.
    void set_reference(const float * full);
    void reference_from_start();
    // Logits [batch,T,V] of `batch` sequences of T tokens (builds a forward-only program for
    // that batch size on first use; it runs on the training parameters).
    std::vector<float> logits(const int32_t * inputs, int batch);

    // This rank's shard of the state (the whole of it without ZeRO); import_state takes any
    // state whose range covers this rank's shard (a whole one, or a shard of the same range).
    // Tensor parallel: the whole model's state, gathered over every rank (collective), and
    // import_state takes a whole state.
    TrainState export_state();
    void import_state(const TrainState & s);
    // export_state()'s state in place, where this rank holds all of it as host fp32 buffers (the
    // CPU backend in fp32 or with fp32 master weights and moments, nothing offloaded): valid until
    // the next step or import. nullopt where it would need a copy (use export_state).
    std::optional<TrainStateView> state_view();

    // The range of the flat trainable buffer this rank updates: [lo, hi) of `total`; `size` is
    // the padded shard length (every rank's). Without ZeRO: [0, total).
    struct Shard { size_t lo = 0, hi = 0, size = 0, total = 0; };
    Shard shard() const;
    // The whole model's trainable fp32 weights, gathered over the ranks under ZeRO and tensor
    // parallelism (collective: every rank must call it).
    std::vector<float> full_params();
    // Elements of the whole model's flat trainable buffer (tensor parallel: not this rank's slice).
    size_t total_params() const;

    // Record the ops of every following training step into `t` (cleared at each step's start);
    // null stops recording.
    void set_timeline(Timeline * t) { timeline_ = t; }
    Timeline * timeline() const { return timeline_; }
    // Asked between the ops of a step, until its first update: true abandons the step
    // (StepAbandoned; the state is the previous step's). One process only: ranks abandon together
    // at step boundaries instead.
    void set_cancel(std::function<bool()> cancel) { cancel_ = std::move(cancel); }

    const TrainStep & step() const { return *plans_.train; }
    const MemoryPlan & plan() const { return plans_.train_plan; }
    CategoryBytes planned_reserved() const { return plans_.reserved(); }
    CategoryBytes planned_peak_live() const { return plans_.peak_live(); }
    const LossScaler & loss_scaler() const { return scaler_; }
    const Ledger & ledger() const { return ledger_; }
    Ledger & ledger() { return ledger_; }
    const ModelConfig & config() const { return cfg_; }
    const EngineOptions & options() const { return opt_; }
    const Backend & backend() const { return backend_; }
    int steps_done() const { return t_; }

private:
    void store_base(const float * full, const std::vector<uint8_t> * packed = nullptr);   // without DoRA's magnitudes
    // DoRA: the magnitudes in `adapters` (the whole model's) from the stored base (`full` as given).
    void dora_start(const float * full, float * adapters);
    // Runs one program on one batch; returns the sum of its per-token losses.
    double run_batch(const TrainStep & step, StepMemory & mem, const int32_t * inputs, const int32_t * targets,
                     const int32_t * doc_start, float dloss, const OptimHyper * h, uint64_t seed = 0);
    // The sum of the per-token losses the program's last run left.
    double losses_sum(const TrainStep & step, StepMemory & mem) const;
    // Non-ignored targets in n tokens; checks ids against the vocabulary.
    int count_targets(const int32_t * inputs, const int32_t * targets, size_t n) const;
    // Packed documents: `rows` rows of T starts checked (FormatError naming the row and token).
    void check_doc_starts(const int32_t * doc_start, size_t rows) const;
    void upload_context(const TrainStep & step, StepMemory & mem, const int32_t * doc_start);
    void execute(const TrainStep & step, StepMemory & mem, const StepScalars & s);

    ModelConfig cfg_;
    Backend & backend_;
    EngineOptions opt_;
    Ledger ledger_;
    StepPlans plans_;
    std::unique_ptr<TrainStep> fwd_;   // logits program, built on first use
    MemoryPlan fwd_plan_;
    int fwd_batch_ = 0;
    std::unique_ptr<OffloadStore> store_;   // --offload optimizer: the offloaded states (before the memories)
    std::unique_ptr<StepMemory> train_mem_, first_mem_, mid_mem_, eval_mem_, fwd_mem_;
    LossScaler scaler_;
    std::unique_ptr<Communicator> own_comm_, own_tp_comm_, own_pp_comm_, own_ep_comm_;   // single-process when not given
    Communicator * comm_ = nullptr, * tp_comm_ = nullptr, * pp_comm_ = nullptr, * ep_comm_ = nullptr;
    bool split_model() const {
        return opt_.tensor_parallel > 1 || opt_.pipeline_parallel > 1 || opt_.expert_parallel > 1;
    }
    // v summed over every data-parallel rank (the data group's, then the expert group's).
    double sum_over_data(double v) const;
    // Expert parallel: the whole model's from every rank's share (collective over the group).
    std::vector<float> ep_gather(const std::vector<float> & local) const;
    // The whole model's vector from this rank's (a shard under ZeRO) of the same layout as
    // params(), gathered over the data, pipeline and tensor groups (collective); and this rank's
    // stage of its tensor slice of a whole-model vector (before the ZeRO cut).
    std::vector<float> gather_whole(const float * mine);
    // The optimizer's first (k 0) or second (k 1) moment (its row's moment[k]) as f32 on the host,
    // and n f32 values stored into it (rounded, or encoded, to its dtype); a row without it: none.
    const float * host_moments(int k, std::vector<float> & mirror);
    void store_moments(int k, const float * src, size_t n);
    const float * host_moments_8bit(int k, std::vector<float> & mirror);
    void store_moments_8bit(int k, const float * src, size_t n);
    // GaLore's projector, kept in a checkpoint's first moment (engine_state.cpp).
    void append_projector(std::vector<float> & mirror);
    void store_projector(const float * src, size_t n);
    // One state of the shard (master weights, a moment, its scales) as bytes: its offloaded part
    // `off` (-1: none) then its resident part `res`; and n bytes written from the start.
    std::vector<uint8_t> state_bytes(BufferId res, BufferId off);
    size_t state_size(BufferId res, BufferId off) const;
    void read_state(BufferId res, BufferId off, void * dst, size_t bytes);
    void state_f32(BufferId res, BufferId off, std::vector<float> & out);   // an f32 state, into out
    void set_state_bytes(BufferId res, BufferId off, const void * src, size_t n);
    std::vector<float> my_part(const float * whole) const;
    // Tensor parallel: the whole from the tensor group's slices of `local`, laid out as
    // (whole, slice) (collective over the group); and the trainable vector's pair of layouts (the
    // model's parameters, or LoRA's adapters).
    std::vector<float> tp_gather(const std::vector<float> & local, const std::pair<ParamLayout, ParamLayout> & layouts);
    std::pair<ParamLayout, ParamLayout> tp_layouts() const;
    // Pipeline: stage s's part of the tensor slice's model (`adapters`: LoRA's adapters of its
    // blocks), and the tensor slice's whole vector from every stage's part (collective over the
    // pipeline group).
    ParamLayout stage_part(int s, bool adapters) const;
    std::vector<float> pp_gather(const std::vector<float> & stage, bool adapters);
    // The whole layout's data from every rank of c's part (parts[r] rank r's layout, by name).
    std::vector<float> gather_by_name(Communicator & c, const std::vector<float> & mine,
                                      const std::vector<ParamLayout> & parts, const ParamLayout & whole) const;
    // Host access to a persistent f32 buffer of the training program from element elem0: the
    // buffer itself on a host backend, else `mirror`, downloaded now. store_f32 writes n elements.
    float * host_f32(BufferId id, size_t elem0, std::vector<float> & mirror);
    void store_f32(BufferId id, size_t elem0, const float * src, size_t n);
    // Where params() lives (buffer, first element): the master weights under mixed precision,
    // else the weights themselves; and n elements written there (the mirror is then stale).
    std::pair<BufferId, size_t> own_params() const;
    void store_own_params(const float * src, size_t n);
    // Bytes [at, at + n) of the compute-precision weights (`parameters`) copied to or from host
    // memory `mem`: in the store when offloaded (--offload optimizer+params), else the buffer's.
    void weights_bytes(bool reading, size_t at, void * mem, size_t n);
    std::vector<float> mirror_params_, mirror_grads_, mirror_m_, mirror_v_;
    bool params_handed_ = false;   // params() gave out its mirror: params_changed() uploads it
    int t_ = 0;
    Timeline * timeline_ = nullptr;
    std::function<bool()> cancel_;
    std::function<bool()> skip_ask_;   // train_step's loss limit, asked by the update program's graph
    // --sparsity: whether the weights as they are now were pruned (new weights, set or imported,
    // are pruned again before the next step; pruning pruned weights changes nothing).
    bool pruned_ = false;
    void prune_if_due();
    // Preference tuning: the batch's reference log-probabilities (precompute; run_batch uploads
    // a micro-batch's rows), and the metrics of the runs since the last reset.
    const float * batch_ref_ = nullptr;
    PreferenceMetrics run_pref_, eval_pref_;
    void preference_io(const TrainStep & step, StepMemory & mem, const int32_t * targets, bool before);
    PreferenceMetrics reduced_preference(const PreferenceMetrics & m);   // summed over the data-parallel ranks
    // Mixture of experts: the router losses' gradient weights for the step's micro-batches, and
    // what run_batch read from each one's routing statistics (moe_read).
    float moe_aux_scale_ = 0, moe_z_scale_ = 0;
    struct MoeSums {
        double aux = 0, z = 0, dropped = 0;
        int batches = 0;
        std::vector<float> tokens;
    } moe_;
    void moe_read(const TrainStep & step, StepMemory & mem);
};

}  // namespace memfit
