#include "train/step_sync.h"

#include "backend/moments8.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/distill.h"
#include "model/sparsity.h"
#include "run/compat.h"

namespace memfit {

namespace {

constexpr size_t kShardAlign = 32;   // elements: shard boundaries stay 64-byte aligned in fp32

}  // namespace

TrainStep::TrainStep(const ModelConfig & cfg, int B, int T, StepMode mode, const Backend * sizing,
                     const ModelOptions & model, StepParts parts, const DataParallel & dp,
                     const PipelineParallel & pp)
    : cfg_(ep_local_config(tp_local_config(cfg, model.tp.ranks), model.ep)), lora_(model.lora.enabled()), mode_(mode), parts_(parts), B_(B), T_(T), compute_(model.compute),
      grad_dt_(model.grad), optimizer_(model.optimizer), dp_(dp), pp_(pp) {
    check_and_lay_out(cfg, model);
    if (lora_) declare_base(model.lora);
    const std::string pre = lora_ ? "lora." : "";
    declare_states(model, pre);
    declare_models(cfg, model);
    declare_sync(sizing, pre);
    if (mode_ == StepMode::train) declare_fixups(cfg, model, sizing, pre);
    if (mode_ == StepMode::train && model.offload_activations) plan_activation_offload(model, sizing);
    Graph rec(program_, sizing);
    run(rec, StepScalars{});
    program_.finalize();
}

void TrainStep::plan_activation_offload(const ModelOptions & model, const Backend * sizing) {
    MF_ASSERT(models_.size() == 1 && !pp_.enabled() && "run/compat.cpp refuses --offload activations with --pp");
    act_offload_ = std::make_unique<ActivationOffload>(model.offload_activation_layers);
    model_->set_activation_offload(act_offload_.get());
    Program declared = program_;
    {
        Graph probe(program_, sizing);
        run(probe, StepScalars{});
    }
    // The store's slots past the update's and the weight reads' (Sync::flag's).
    const int slots = kParamReadSlot + 2 * int(groups_.size()) * std::max(copies_, 1);
    act_offload_->plan(program_, declared, model_->layer_begin(), model_->layer_end(), slots);
    program_ = std::move(declared);
}

// The step's own shape, and (run/compat.h) what combines; the stage's chunks and trainable layout.
void TrainStep::check_and_lay_out(const ModelConfig & cfg, const ModelOptions & model) {
    const int B = B_, T = T_;
    const StepMode mode = mode_;
    const DataParallel & dp = dp_;
    const PipelineParallel & pp = pp_;
    const StepParts parts = parts_;
    if (B < 1 || T < 1) throw ConfigError(fmt::format("batch = {}, seq = {}: both must be at least 1", B, T));
    if (T > cfg.max_seq)
        throw ConfigError(fmt::format("seq = {} exceeds the model's context of {} positions; lower --seq", T,
                                      cfg.max_seq));
    MF_ASSERT(dp.ranks >= 1 && dp.rank >= 0 && dp.rank < dp.ranks);
    // What combines is run/compat.h's to say; the step's own shape was checked above.
    RunConfig as_run;
    as_run.seq = T;
    as_run.micro_batch = B;
    as_run.packing = model.documents;
    const bool train = mode == StepMode::train;
    as_run.grad_accum = train ? pp.micro_batches : pp.stages;   // evaluation: micro-batches as they come
    as_run.device.clear();
    as_run.layout = Layout{dp.ranks, model.tp.ranks, pp.stages, dp.zero, Offload::none, model.tp.sequence, pp.schedule,
                        pp.virtual_stages};
    as_run.lora.rank = model.lora.rank;
    as_run.lora.variant = model.lora.dora ? "dora" : "lora";
    as_run.lora.dropout = model.lora.dropout;
    if (model.lora.quantized()) as_run.lora.base_weights = base_weights_name(model.lora.base);
    as_run.lora.gptq_bits = model.lora.gptq_bits, as_run.lora.gptq_group = model.lora.gptq_group;
    for (const auto & t : model.lora.targets) as_run.lora.targets += (as_run.lora.targets.empty() ? "" : ",") + t;
    as_run.recompute = model.recompute.segment >= 2 ? Recompute("every:" + std::to_string(model.recompute.segment))
                                                 : Recompute();
    check_supported(as_run, cfg, nullptr);
    if (model.tp.enabled() && mode == StepMode::logits)
        throw ConfigError("logits of a tensor-parallel model are not gathered; sample from the exported model");
    if (pp.enabled()) {
        if (mode == StepMode::logits)
            throw ConfigError("logits of a pipeline-parallel model are not gathered; sample from the exported model");
        MF_ASSERT(pp.stage >= 0 && pp.stage < pp.stages && pp.micro_batches >= 1 && parts.zero_grads &&
                  parts.optimizer);
        chunks_ = stage_chunks(cfg_, pp, T);
    } else {
        chunks_ = {{0, cfg_.n_layer}};
    }
    range_ = {chunks_.front().begin, chunks_.back().end};
    if (lora_) layout_ = pp.enabled() ? keep_blocks(make_lora_layout(cfg_, model.lora), chunks_)
                                      : make_lora_layout(cfg_, model.lora);
    else layout_ = pp.enabled() ? stage_layout(cfg_, chunks_, pp.first(), pp.last()) : make_param_layout(cfg_);
}

// LoRA's frozen base: no gradients, no master copy, no optimizer states; ZeRO 3 shards it like the
// trainable buffer (the packed bytes 64-byte aligned).
void TrainStep::declare_base(const LoraOptions & lora) {
    const DataParallel & dp = dp_;
    if (lora.quantized()) quant_layout_ = make_quant_layout(cfg_, lora.quant());
    if (pp_.enabled()) {   // the stage's part of the model
        quant_layout_ = keep_blocks(quant_layout_, chunks_);
        base_layout_ = dense_part(stage_layout(cfg_, chunks_, pp_.first(), pp_.last()), quant_layout_);
    } else {
        base_layout_ = dense_layout(cfg_, quant_layout_);
    }
    auto shards = [&](size_t total, size_t align) {
        return dp.zero >= 3 ? FlatShards::cut(total, dp.ranks, align) : FlatShards::whole_of(total, dp.ranks);
    };
    sources_[kBase] = {-1, compute_, shards(base_layout_.total, kShardAlign), "parameters"};
    sources_[kBaseQ] = {-1, DType::u8, shards(quant_layout_.bytes, 64), "parameters.quantized"};
    base = sources_[kBase].flat = program_.declare("parameters", Category::parameters,
                                                   sources_[kBase].sh.size * dtype_size(compute_), true);
    if (quant_layout_.bytes)
        base_q = sources_[kBaseQ].flat = program_.declare("parameters.quantized", Category::parameters,
                                                          sources_[kBaseQ].sh.size, true);
}

// The trainable buffer's persistent states (weights, master weights, gradients, moments), this
// rank's shard of them, and the part --offload optimizer moves off the device.
void TrainStep::declare_states(const ModelOptions & model, const std::string & pre) {
    const DataParallel & dp = dp_;
    const StepParts parts = parts_;
    const bool train = mode_ == StepMode::train;
    const size_t P = layout_.total;
    const size_t cs = dtype_size(compute_), gs = dtype_size(grad_dt_);
    // Shards: ZeRO 0 keeps everything whole; 1..3 cut the flat buffer into equal, aligned ranges.
    shards_ = dp.zero == 0 ? FlatShards::whole_of(P, dp.ranks) : FlatShards::cut(P, dp.ranks, kShardAlign);
    S_ = shards_.size;
    lo_ = shards_.lo(dp.rank);
    hi_ = shards_.hi(dp.rank);
    // bf16-sr: the bf16 weights are the truth, updated with stochastic rounding; no master copy.
    sr_ = train && model.sr_master;
    if (sr_ && compute_ != DType::bf16)
        throw ConfigError("--master-weights bf16-sr rounds the weights to bf16: it needs --precision bf16");
    const bool mixed = compute_ != DType::f32 && !sr_;
    const OptimizerRow & row = optimizer_row(optimizer_);
    in_bwd_ = train && model.optimizer_in_backward;
    const bool factors = has_state(optimizer_, StateSize::factored), projects = has_state(optimizer_, StateSize::projector);
    first_moment_ = train && model.adafactor_first_moment;
    if (first_moment_ && !has_state(optimizer_, StateSize::first_moment))
        throw ConfigError(fmt::format("--adafactor-beta1 is Adafactor's first moment: --optimizer {} has none", row.name));
    if (train && (factors || projects) && (dp.zero >= 1 || model.offload > 0 || model.tp.enabled()))
        throw ConfigError(fmt::format("--optimizer {} keeps {} of each whole matrix: it needs --zero 0, no --offload and "
                                      "no --tp (each cuts matrices)",
                                      row.name, factors ? "statistics per row and column" : "a projector"));
    if (in_bwd_ && (pp_.enabled() || model.tp.enabled() || model.offload > 0 || !parts_.zero_grads || !parts_.optimizer))
        throw ConfigError("--optimizer-in-backward updates each layer at the end of its backward: it needs one "
                          "micro-batch per step, and no --tp, --pp or --offload");
    StateLens total{};   // each kind's elements over the pieces (the scratch's: the largest piece's)
    std::vector<bool> decays;
    for (const auto & p : layout_.params) {
        const size_t x = std::max(p.offset, lo_), y = std::min(p.offset + p.numel, hi_);
        if (x >= y) continue;
        const bool whole = x == p.offset && y == p.offset + p.numel && p.shape.size() == 2;
        const int64_t rows = whole ? p.shape[0] : 1, cols = int64_t(y - x) / rows;
        // GaLore projects the blocks' projection weights (GaLore's "attn" and "mlp" targets).
        const int64_t rank = galore_rank(train && projects && whole && sparse_target(p.name), rows, cols, model.galore_rank);
        MF_ASSERT(lens_at(total, StateSize::elements) == x - lo_);   // the pieces tile the shard
        pieces_.push_back(MomentPiece{x - lo_, y - x, rows, cols, rank, total});
        decays.push_back(p.decay());
        for (size_t k = 0; k < total.size(); ++k) {
            const size_t len = state_len(StateSize(k), rows, cols, rank, first_moment_);
            total[k] = StateSize(k) == StateSize::scratch ? std::max(total[k], len) : total[k] + len;
        }
    }
    const size_t blocks = lens_at(total, StateSize::blocks);
    // Offload: whole units from the shard's start until `offload` of it is covered. A unit of 2^18
    // elements is 3 MiB of fp32 master weights and moments, three units are live at once, and
    // each copy (1 MiB per state) is large enough for a disk's or a link's streaming rate; a shard
    // past 256 units takes larger ones (offload_unit_for).
    const double want = train ? model.offload * double(hi_ - lo_) : 0.0;
    const size_t unit = offload_unit_for(S_, model.offload_unit);   // S_: every rank stages alike
    MF_ASSERT(unit > 0 && unit % kMoments8Block == 0);
    for (size_t i = 0; i < pieces_.size() && double(off_elems_) < want; ++i) {
        const MomentPiece & p = pieces_[i];
        for (size_t a = 0; a < p.n && double(off_elems_) < want; a += unit) {
            const size_t n = std::min(unit, p.n - a);
            units_.push_back(Unit{p.at + a, n, p.block() + a / kMoments8Block, decays[i], {}});
            off_elems_ = p.at + a + n;
            off_blocks_ = p.block() + moments8_blocks(a + n);
        }
    }
    const size_t rest = S_ - off_elems_;
    // The weights' shard offloaded too: every program (the same buffer, bound by name); the
    // training one updates all of it through the units.
    params_off_ = model.offload_params;
    if (params_off_ && (dp.zero < 3 || lora_ || pp_.enabled() || (train && model.offload < 1)))
        throw ConfigError("--offload optimizer+params streams each layer's weights from this rank's ZeRO-3 shard: "
                          "it needs --zero 3, the whole optimizer state offloaded (--offload-fraction 1), no LoRA and no --pp");
    params = program_.declare(pre + "parameters", params_off_ ? Category::offloaded : Category::parameters,
                              (dp.zero >= 3 ? S_ : P) * cs, true);
    sources_[kTrainable] = {params, compute_, shards_, pre + "parameters"};
    // fp32 master weights: with the AdamW moments, the 12 bytes per parameter of optimizer state
    // in the ZeRO paper's count; reported in their own category.
    master = train && mixed ? program_.declare(pre + "master_parameters", Category::master_weights, rest * 4, true) : -1;
    // --optimizer-in-backward: no whole-model gradient; the views declared on this (empty) buffer
    // move into each layer's bucket (declare_sync), which lives from its backward to its update.
    grads = train ? program_.declare(pre + "gradients", Category::gradients, in_bwd_ ? 0 : (dp.zero >= 2 ? S_ : P) * gs, true)
                  : -1;
    // The optimizer's states, as its row lists them.
    // GaLore's scratch is the update's workspace, live only while the updates run.
    MF_ASSERT((!factors && !projects) || off_elems_ == 0);   // offload refuses per-matrix states
    auto declare_row = [&](const std::string & at, Category c, StateLens n, bool persistent) {
        std::array<BufferId, kMaxOptimizerStates> ids = no_states();
        for (int i = 0; i < row.n_states; ++i) {
            const OptimizerState & d = row.states[size_t(i)];
            const bool scratch = d.size == StateSize::scratch;
            ids[size_t(i)] = program_.declare(at + d.name, scratch ? Category::workspace : c,
                                              lens_at(n, d.size) * dtype_size(d.dtype), persistent && !scratch);
        }
        return ids;
    };
    StateLens resident = total;
    lens_at(resident, StateSize::elements) = rest, lens_at(resident, StateSize::blocks) = blocks - off_blocks_;
    if (train) opt_states = declare_row(pre, Category::optimizer_states, resident, true);
    if (off_elems_ > 0) {   // the offloaded states, and (the update's program) each unit's staging
        auto states = [&](const std::string & at, bool persistent, size_t n, size_t nb, bool offl) {
            auto cat = [&](Category c) { return offl ? Category::offloaded : c; };
            States st;
            if (mixed) st.master = program_.declare(at + "master_parameters", cat(Category::master_weights), n * 4, persistent);
            st.opt = declare_row(at, cat(Category::optimizer_states), flat_lens(n, nb), persistent);
            if (params_off_ && !offl) st.params = program_.declare(at + "parameters", Category::parameters, n * cs);
            return st;
        };
        offloaded = states(pre + "offloaded.", true, off_elems_, off_blocks_, true);
        for (size_t u = 0; parts.optimizer && u < units_.size(); ++u)
            units_[u].stage = states(fmt::format("{}offload.{}.", pre, u), false, units_[u].n, moments8_blocks(units_[u].n), false);
    }
}

// The batch's buffers, the model's programs (one per micro-batch and chunk under a pipeline), and
// the views of the weights and gradients they compute with.
void TrainStep::declare_models(const ModelConfig & cfg, const ModelOptions & model) {
    const int B = B_, T = T_;
    const PipelineParallel & pp = pp_;
    const bool train = mode_ == StepMode::train;
    const StepMode mode = mode_;
    const size_t BT = size_t(B) * size_t(T) * size_t(micro_batches());
    tokens = program_.declare("batch.tokens", Category::activations, BT * 4, true);
    targets = program_.declare("batch.targets", Category::activations, BT * 4, true);
    losses = program_.declare("batch.losses", Category::activations, BT * 4, true);
    if (model.documents) {
        MF_ASSERT(model.kv_capacity == 0);
        doc_start = program_.declare("batch.doc_start", Category::activations, BT * 4, true);
    }
    if (cfg.sliding_window > 0 && T > cfg.sliding_window)
        attn_start = program_.declare("batch.attention_start", Category::activations, BT * 4, true);
    if (model.cp.enabled()) {
        MF_ASSERT(!pp.enabled() && !model.tp.enabled());
        // [3, B, T] per row, then every context rank's rows' positions [ranks, T]
        context = program_.declare("batch.context", Category::activations,
                                   (3 * BT + size_t(model.cp.ranks) * size_t(T)) * 4, true);
    }
    grad_norm_sq = train ? program_.declare("grad_norm_sq", Category::activations, 4, true) : -1;
    workspace_ = program_.declare("workspace", Category::workspace, 0);
    ModelOptions mo = model;
    mo.tp.vocab = cfg.vocab_size;
    mo.with_backward = train;
    mo.keep_logits = mode == StepMode::logits;
    if (mo.keep_logits) mo.loss_chunk = 0;
    if (pp.enabled()) {   // micro-batch i's chunk j: models_[i * chunks + j]
        for (int i = 0; i < pp.micro_batches; ++i)
            for (size_t j = 0; j < chunks_.size(); ++j) {
                mo.layer_begin = chunks_[j].begin;
                mo.layer_end = chunks_[j].end;
                mo.prefix = chunks_.size() > 1 ? fmt::format("mb{}.c{}.", i, j) : fmt::format("mb{}.", i);
                models_.push_back(std::make_unique<Transformer>(cfg_, B, T, program_, mo));
            }
    } else {
        models_.push_back(std::make_unique<Transformer>(cfg_, B, T, program_, mo));
    }
    model_ = models_[0].get();
    // Each micro-batch's rows of the document and attention starts (a pipeline's models: i * chunks + j).
    for (size_t k = 0; k < models_.size(); ++k) {
        const size_t at = k / chunks_.size() * size_t(B) * size_t(T) * 4;
        if (doc_start >= 0) models_[k]->set_doc_start(Tensor(doc_start, DType::i32, {int64_t(B), int64_t(T)}, at));
        if (attn_start >= 0)
            models_[k]->set_attention_start(Tensor(attn_start, DType::i32, {int64_t(B), int64_t(T)}, at));
        if (context >= 0)
            models_[k]->set_context(Tensor(context, DType::i32, {(3 * int64_t(B) + model.cp.ranks) * int64_t(T)}));
    }
    if (train && model.distill.enabled()) declare_teacher(mo);
    if (model.pref.enabled() && mode != StepMode::logits) declare_preference(mo);
    if (lora_) {
        w_ = lora_model_weights(cfg_, model.lora, base_layout_, base, compute_, quant_layout_, base_q, layout_, params,
                                compute_);
        if (train)
            dw_ = lora_model_weights(cfg_, model.lora, base_layout_, -1, compute_, quant_layout_, -1, layout_, grads,
                                     grad_dt_);
    } else {
        w_ = model_weights(cfg_, layout_, params, compute_);
        if (train) dw_ = model_weights(cfg_, layout_, grads, grad_dt_);
    }
}

void TrainStep::declare_frozen(FrozenModel & f, const ModelConfig & cfg, const QuantFormat * fmt, DType dt,
                               Category cat, const std::string & prefix, const ModelOptions & student) {
    MF_ASSERT(!pp_.enabled() && !student.tp.enabled());   // compat.h refuses them
    f.cfg = cfg;
    f.dtype = dt;
    if (fmt) f.quant = make_quant_layout(cfg, *fmt);
    f.layout = dense_layout(cfg, f.quant);
    f.dense = program_.declare(prefix + "parameters", cat, f.layout.total * dtype_size(dt), true);
    if (f.quant.bytes) f.packed = program_.declare(prefix + "parameters.quantized", cat, f.quant.bytes, true);
    declare_forward_only(f, cfg, dt, prefix, student);
    f.w = quantized_model_weights(cfg, f.quant, f.dense, dt, f.packed);
}

void TrainStep::declare_forward_only(FrozenModel & f, const ModelConfig & cfg, DType dt, const std::string & prefix,
                                     const ModelOptions & student) {
    // The frozen forward keeps nothing for a backward: only its final norm's output outlives it,
    // until the last loss chunk has read it.
    ModelOptions tm;
    tm.loss_chunk = student.loss_chunk;
    tm.mlp_chunk = student.mlp_chunk;
    tm.flash_attention = student.flash_attention;
    tm.documents = student.documents;
    tm.compute = tm.grad = dt;
    tm.prefix = prefix;
    f.model = std::make_unique<Transformer>(cfg, B_, T_, program_, tm);
    if (doc_start >= 0) f.model->set_doc_start(Tensor(doc_start, DType::i32, {int64_t(B_), int64_t(T_)}));
}

void TrainStep::declare_teacher(const ModelOptions & student) {
    const DistillOptions & d = student.distill;
    check_teacher(*d.teacher, cfg_, T_);
    const QuantFormat fmt = d.format();
    declare_frozen(teacher_, *d.teacher, d.quantized() ? &fmt : nullptr, compute_, Category::teacher, "teacher.",
                   student);
    teacher = teacher_.dense, teacher_q = teacher_.packed;
    const int64_t rows = int64_t(B_) * T_;
    const int64_t chunk = student.loss_chunk > 0 && student.loss_chunk < rows ? student.loss_chunk : rows;
    const BufferId stats = program_.declare("loss.distill_stats", Category::activations, size_t(2 * chunk) * 4);
    distill_ = DistillHead{teacher_.model.get(), &teacher_.w, Tensor(stats, DType::f32, {2, chunk}), d.alpha,
                           d.temperature};
}

void TrainStep::declare_preference(const ModelOptions & mo) {
    pref_ = mo.pref;
    MF_ASSERT(B_ % 2 == 0 && !pp_.enabled() && !mo.tp.enabled());   // compat.h refuses the rest
    const size_t rows = size_t(B_), BT = rows * size_t(T_);
    ref_logps = program_.declare("dpo.reference_logps", Category::activations, rows * 4, true);
    policy_logps = program_.declare("dpo.policy_logps", Category::activations, rows * 4, true);
    pref_scale_ = Tensor(program_.declare("dpo.row_factors", Category::activations, BT * 4), DType::f32,
                         {int64_t(BT)});
    if (pref_.reference == Reference::precompute) return;
    const QuantFormat fmt = quant_format(pref_.base_weights(), true);
    // adapters-off: a forward of its own on the policy's base (reference_pass strips the adapters
    // from the policy's weights), so that its buffers live only through the reference's pass.
    if (pref_.copy())
        declare_frozen(reference_, cfg_, pref_.quantized() ? &fmt : nullptr, pref_.dtype(compute_),
                       Category::reference, "reference.", mo);
    else
        declare_forward_only(reference_, cfg_, compute_, "reference.", mo);
    if (attn_start >= 0)
        reference_.model->set_attention_start(Tensor(attn_start, DType::i32, {int64_t(B_), int64_t(T_)}));
}

void TrainStep::reference_pass(Graph & g, Tensor tok, Tensor tgt, Tensor loss) const {
    const int64_t n = int64_t(B_) * T_;
    if (pref_.reference == Reference::precompute) return;   // the engine writes ref_logps
    ModelWeights w = reference_.w;
    if (!pref_.copy()) {   // LoRA's base alone
        w = wf_[0];
        for (auto & l : w.h) l.adapters.clear();
        w.head_adapters.clear();
        w.embed_adapters.clear();
    }
    reference_.model->forward(g, w, tok);
    reference_.model->head_loss(g, w, nullptr, tgt.view(0, {n}), loss.view(0, {n}), 0.0f);
    g.phase(Phase::forward);
    g.row_logps(Tensor(ref_logps, DType::f32, {int64_t(B_)}), loss);
}

void TrainStep::preference_loss(Graph & g, const StepScalars & s, Tensor tgt, Tensor loss) const {
    const int64_t b = B_, n = b * T_;
    model_->head_loss(g, wf_[0], nullptr, tgt.view(0, {n}), loss.view(0, {n}), 0.0f);
    g.phase(Phase::forward);
    g.dpo_loss(loss, pref_scale_.view(0, {b, int64_t(T_)}), Tensor(policy_logps, DType::f32, {b}),
               Tensor(ref_logps, DType::f32, {b}), tgt, pref_.desc(s.dloss));
    if (mode_ == StepMode::train) model_->head_grad_rows(g, wf_[0], dws_[0], tgt.view(0, {n}), pref_scale_);
}

void TrainStep::run(Graph & g, const StepScalars & s) const {
    g.set_workspace(workspace_);
    g.set_seed(s.seed);
    model_->set_router_loss_scale(s.moe_aux, s.moe_z);
    const int64_t b = B_, t = T_, P = int64_t(layout_.total);
    const Tensor tok(tokens, DType::i32, {b, t}), tgt(targets, DType::i32, {b, t});
    const Tensor loss(losses, DType::f32, {b, t});
    const bool train = mode_ == StepMode::train, zero3 = dp_.zero >= 3;
    // A pipeline's micro-batches, and 16-bit buckets, accumulate into the gradient shard (ZeRO >=
    // 2) from zero.
    const bool accumulate_shard = pp_.enabled() && reduce_scatter_;
    if (train && parts_.zero_grads && !in_bwd_ && (!reduce_scatter_ || accumulate_shard || widen())) {
        g.phase(Phase::other);
        g.fill_zero(Tensor(grads, grad_dt_, {reduce_scatter_ ? int64_t(S_) : P}));
    }
    Sync sync(*this);
    if (train && in_bwd_) {   // the buckets' squares add up here as each is updated
        g.phase(Phase::other);
        g.fill_zero(Tensor(grad_norm_sq, DType::f32, {1}));
        sync.on_finish = [&](Graph & gg, int i) { update_bucket(gg, s, i); };
    }
    const int norm_slot = sync.norm_slot(), params_slot = sync.params_slot();
    if (pp_.enabled()) {
        pipeline(g, s, sync, params_slot + 1);
        if (!train) return;
    } else {
        Transformer::LayerHook forward_begin, begin, done;
        if (reduce_scatter_ || zero3 || in_bwd_)
            begin = [&](Graph & gg, int l) { sync.backward_begin(gg, l, 0, model_->lowest_trained_layer()); };
        if (all_reduce_ || reduce_scatter_ || in_bwd_) done = [&](Graph & gg, int l) { sync.backward_done(gg, l, 0); };
        if (zero3) {
            g.phase(Phase::communication);
            g.layer(-1);
            sync.await(g, -1, false, 0);
            sync.gather(g, 0, false, 0);
            if (cfg_.n_layer > 1) sync.prefetch(g, 1, false, 0);
            forward_begin = [&](Graph & gg, int l) { sync.forward_begin(gg, l, 0); };
        }
        // The teacher first: while it runs, none of the student's activations are live yet.
        if (teacher_.model) teacher_.model->forward(g, teacher_.w, tok);
        if (pref_.enabled()) reference_pass(g, tok, tgt, loss);
        model_->forward(g, wf_[0], tok, forward_begin);
        if (mode_ == StepMode::logits) {
            model_->head_logits(g, wf_[0]);
            return;
        }
        if (train && zero3) {
            g.phase(Phase::communication);
            g.layer(-1);
            sync.gather(g, cfg_.n_layer - 1, true, 0);   // the top layer's backward weights, during the loss
            if (cfg_.n_layer - 2 >= model_->lowest_trained_layer()) sync.prefetch(g, cfg_.n_layer - 2, true, 0);
        }
        if (train && (reduce_scatter_ || in_bwd_)) {   // the rest's gradients start in the head's backward
            g.phase(Phase::backward);
            g.layer(-1);
            sync.zero_rest(g);
        }
        if (pref_.enabled())
            preference_loss(g, s, tgt, loss);
        else
            model_->head_loss(g, wf_[0], train ? &dws_[0] : nullptr, tgt.view(0, {b * t}), loss.view(0, {b * t}),
                              s.dloss, teacher_.model ? &distill_ : nullptr);
        if (!train) return;
        model_->backward(g, wb_[0], dws_[0], tok, done, begin);
    }
    g.phase(Phase::communication);
    g.layer(-1);
    sync.flush(g);
    if (tied_grad_.valid()) g.emb_all_reduce(tied_grad_, tied_scratch_);   // both ends' share of the tied table
    if (accumulate_shard) {   // the rest's gradients, whole only once every micro-batch's are in
        sync.reduce_rest(g);
        sync.flush(g);
    }
    tensor_fixups(g);
    if (!parts_.optimizer) return;

    g.phase(Phase::optimizer);
    const Tensor norm_sq(grad_norm_sq, DType::f32, {1});
    const size_t own = hi_ - lo_;
    if (!in_bwd_) grad_norm(g, norm_sq);   // else the buckets' squares were summed as each was updated
    if (dp_.zero >= 2) {   // the global norm: each rank's shard, summed
        g.phase(Phase::communication);
        g.all_reduce_start(norm_sq, norm_slot);
        g.all_reduce_wait(norm_sq, norm_slot);
        g.phase(Phase::optimizer);
    }
    if (!in_bwd_) optimizer(g, s);   // else each layer's update ran as its backward finished (update_bucket)
    if (dp_.zero == 1 || dp_.zero == 2) {   // every rank's updated shard into everyone's weights
        const std::vector<size_t> counts = shard_counts(0, layout_.total);
        const size_t cs = dtype_size(compute_);
        const Tensor all(params, compute_, {P});
        g.phase(Phase::communication);
        g.all_gather_start(all, own ? Tensor(params, compute_, {int64_t(own)}, lo_ * cs) : Tensor{}, counts, params_slot);
        g.comm_wait(params_slot, {all});
    }
}

void TrainStep::optimizer(Graph & g, const StepScalars & s) const {
    g.phase(Phase::optimizer);
    g.layer(-1);
    if (!units_.empty()) offloaded_update(g, s);
    update(g, s, 0, layout_.total, grads, dp_.zero >= 2 ? lo_ : 0, Tensor(grad_norm_sq, DType::f32, {1}));
}

void TrainStep::update(Graph & g, const StepScalars & s, size_t a, size_t b, BufferId gbuf, size_t gbase,
                       Tensor norm_sq) const {
    const bool mixed = master >= 0;
    const size_t cs = dtype_size(compute_), gs = dtype_size(grad_dt_);
    size_t piece = 0;
    for (const auto & p : layout_.params) {
        // This rank's part of the parameter: [x0, y) of the flat buffer, x0 past what is offloaded.
        const size_t x = std::max(p.offset, lo_), y = std::min(p.offset + p.numel, hi_);
        if (x >= y) continue;
        const MomentPiece & mp = pieces_[piece++];
        const size_t x0 = std::max(x, lo_ + off_elems_);
        if (x0 >= y || p.offset < a || p.offset >= b) continue;
        MF_ASSERT(p.offset + p.numel <= b);
        OptimHyper h = s.optim;
        if (!p.decay()) h.weight_decay = 0;
        h.keep_zeros = s.optim.keep_zeros && sparse_target(p.name);   // N:M sparsity masks the projections only
        const int64_t n = int64_t(y - x0);
        // In the resident states, which start at shard element off_elems_ (block off_blocks_).
        const size_t own = (x0 - lo_ - off_elems_) * 4;
        const size_t block = mp.block() + (x0 - x) / kMoments8Block - off_blocks_;
        const size_t px = dp_.zero >= 3 ? x0 - lo_ : x0;        // in the compute-precision weights
        // Mixed precision: the optimizer updates the fp32 master weights and rounds them into the
        // compute-precision copy the next step's matmuls read (bf16-sr: the bf16 weights).
        const Tensor copy = mixed ? Tensor(params, compute_, {n}, px * cs) : Tensor{};
        const Tensor param = mixed ? Tensor(master, DType::f32, {n}, own) : weights(px, n);
        h.sr_at = x0;
        // A whole matrix's views as [rows, cols] (a factored state's statistics are per row and
        // column, GaLore's projector per matrix).
        const bool matrix = x0 == x && mp.rows > 1;
        auto as_matrix = [&](const Tensor & t) { return matrix && t.valid() ? t.view(0, {mp.rows, mp.cols}) : t; };
        const Tensor grad(gbuf, grad_dt_, {n}, (x0 - gbase) * gs);
        StateLens off = mp.off;
        lens_at(off, StateSize::elements) = x0 - lo_ - off_elems_, lens_at(off, StateSize::blocks) = block;
        h.galore_rank = int(matrix ? mp.rank : 0);
        g.optimizer_step(optimizer_, as_matrix(param), as_matrix(grad),
                         state_views(opt_states, off, matrix ? mp.rows : 1, matrix ? mp.cols : n, h.galore_rank),
                         norm_sq, as_matrix(copy), h);
    }
}

// --optimizer-in-backward: bucket i's gradients are whole (summed over the ranks): their squares
// into the step's norm, and the update of its parameters. Under ZeRO >= 2 the bucket was
// reduce-scattered: this rank's part of it (the parts' squares summed over the ranks after the
// backward).
void TrainStep::update_bucket(Graph & g, const StepScalars & s, int i) const {
    const Bucket & k = buckets_[size_t(i)];
    const Tensor norm_sq(grad_norm_sq, DType::f32, {1}), part(norm_part_, DType::f32, {1});
    const Tensor grad = reduce_scatter_ ? part_view(k) : grad_view(k);
    g.phase(Phase::optimizer);
    if (grad.valid()) {
        g.sum_squares(part, grad);
        g.residual_fwd(norm_sq, norm_sq, part);
        update(g, s, k.a, k.b, grad.buffer, reduce_scatter_ ? std::max(k.a, lo_) : k.a, Tensor{});
    }
    g.phase(Phase::backward);
}

OptimizerStates TrainStep::state_views(const std::array<BufferId, kMaxOptimizerStates> & ids, const StateLens & off,
                                       int64_t rows, int64_t cols, int64_t rank) const {
    const OptimizerRow & row = optimizer_row(optimizer_);
    OptimizerStates v;
    for (int i = 0; i < row.n_states; ++i) {
        const OptimizerState & d = row.states[size_t(i)];
        const size_t at = d.size == StateSize::scratch ? 0 : off[size_t(d.size)];
        v.t[size_t(i)] = Tensor(ids[size_t(i)], d.dtype, {int64_t(state_len(d.size, rows, cols, rank, first_moment_))},
                                at * dtype_size(d.dtype));
    }
    return v;
}

const ParamInfo & TrainStep::param_at(size_t x) const {
    for (const auto & p : layout_.params)
        if (x >= p.offset && x < p.offset + p.numel) return p;
    MF_UNREACHABLE();
}

// The weights as the optimizer updates them in place: fp32, or bf16 (bf16-sr), from element px.
Tensor TrainStep::weights(size_t px, int64_t n) const {
    const DType dt = sr_ ? compute_ : DType::f32;
    return Tensor(params, dt, {n}, px * dtype_size(dt));
}

// Unit i's states are read into its staging buffers one unit ahead (slot 2(i%2)), updated there
// and written back (slot 2(i%2)+1), waited for one unit behind: three units' staging at most are
// live, and the store's copies overlap the update in between.
void TrainStep::offloaded_update(Graph & g, const StepScalars & s) const {
    const Tensor norm_sq(grad_norm_sq, DType::f32, {1});
    const bool mixed = master >= 0;
    const size_t cs = dtype_size(compute_), gs = dtype_size(grad_dt_);
    // What a unit stages: read from the store (unless `write_only`), updated, written back.
    // Offloaded weights: under mixed precision only written (rounded from the master weights).
    struct Pair { Tensor staged, stored; bool write_only = false; };
    auto pairs = [&](const Unit & u) {
        const int64_t n = int64_t(u.n);
        std::vector<Pair> p;
        if (params_off_)
            p.push_back({Tensor(u.stage.params, compute_, {n}), Tensor(params, compute_, {n}, u.at * cs), mixed});
        if (mixed) p.push_back({Tensor(u.stage.master, DType::f32, {n}), Tensor(offloaded.master, DType::f32, {n}, u.at * 4)});
        const OptimizerStates staged = state_views(u.stage.opt, flat_lens(0, 0), 1, int64_t(u.n));
        const OptimizerStates stored = state_views(offloaded.opt, flat_lens(u.at, u.block), 1, int64_t(u.n));
        for (int k = 0; k < optimizer_row(optimizer_).n_states; ++k) p.push_back({staged.t[size_t(k)], stored.t[size_t(k)]});
        return p;
    };
    auto read = [&](size_t i) {
        for (const Pair & q : pairs(units_[i]))
            if (!q.write_only) g.offload_read(q.staged, q.stored, int(2 * (i % 2)));
    };
    auto wait = [&](size_t i, int slot) {
        const std::vector<Pair> p = pairs(units_[i]);
        auto at = [&](size_t k) { return k < p.size() ? p[k].staged : Tensor{}; };
        g.offload_wait(slot, {at(0), at(1), at(2), at(3), at(4), at(5)});
    };
    read(0);
    for (size_t i = 0; i < units_.size(); ++i) {
        const Unit & u = units_[i];
        if (i + 1 < units_.size()) read(i + 1);
        wait(i, int(2 * (i % 2)));
        OptimHyper h = s.optim;
        if (!u.decay) h.weight_decay = 0;
        const int64_t n = int64_t(u.n);
        const size_t x = lo_ + u.at, gx = dp_.zero >= 2 ? u.at : x, px = dp_.zero >= 3 ? u.at : x;
        h.keep_zeros = s.optim.keep_zeros && sparse_target(param_at(x).name);   // a unit is within one parameter
        const Tensor weights_now = params_off_ ? Tensor(u.stage.params, compute_, {n}) : Tensor(params, compute_, {n}, px * cs);
        const Tensor copy = mixed ? weights_now : Tensor{};
        const Tensor param = mixed ? Tensor(u.stage.master, DType::f32, {n}) : params_off_ ? weights_now : weights(px, n);
        h.sr_at = x;
        const Tensor grad(grads, grad_dt_, {n}, gx * gs);
        g.optimizer_step(optimizer_, param, grad, state_views(u.stage.opt, flat_lens(0, 0), 1, n), norm_sq, copy, h);
        for (const Pair & q : pairs(u)) g.offload_write(q.stored, q.staged, int(2 * (i % 2) + 1));
        if (i >= 1) wait(i - 1, int(2 * ((i - 1) % 2) + 1));
    }
    wait(units_.size() - 1, int(2 * ((units_.size() - 1) % 2) + 1));
}

}  // namespace memfit
