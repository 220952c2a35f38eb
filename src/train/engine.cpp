#include "train/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/host_store.h"
#include "backend/moments8.h"
#include "comm/communicator.h"
#include "memory/budget.h"
#include "model/expert_parallel.h"
#include "model/tensor_parallel.h"
#include "run/compat.h"
#include "train/split_weights.h"

namespace memfit {

StepPlans::StepPlans(const ModelConfig & cfg, const Backend & backend, const EngineOptions & opt, bool place) {
    if (opt.grad_accum < 1) throw ConfigError(fmt::format("--grad-accum {}: must be at least 1", opt.grad_accum));
    if (opt.flash_attention) {   // the kernels' part of run/compat.h (the steps ask for the rest)
        RunConfig flash;
        flash.attention = Attention::flash;
        check_supported(flash, cfg, &backend);
    }
    const int k = opt.grad_accum;
    auto make = [&](std::unique_ptr<TrainStep> & step, MemoryPlan & plan, StepMode mode, StepParts parts) {
        // A pipeline's step program holds all k micro-batches (evaluation: one).
        const int m = opt.pipeline_parallel > 1 ? (mode == StepMode::train ? k : 1) : 1;
        step = std::make_unique<TrainStep>(cfg, opt.B, opt.T, mode, &backend, opt.model(), parts, opt.dp(), opt.pp(m));
        plan = plan_memory(step->program(), 64, place);
    };
    const bool reduce = opt.data_parallel > 1 || opt.zero > 0;
    if (opt.pipeline_parallel > 1) {
        make(train, train_plan, StepMode::train, StepParts{true, true, reduce});
        if (opt.with_eval) make(eval, eval_plan, StepMode::eval, StepParts{});
        return;
    }
    make(train, train_plan, StepMode::train, StepParts{k == 1, true, reduce});
    if (k > 1) make(first, first_plan, StepMode::train, StepParts{true, false});
    if (k > 2) make(mid, mid_plan, StepMode::train, StepParts{false, false});
    if (opt.with_eval) make(eval, eval_plan, StepMode::eval, StepParts{});
}

StepPlans::~StepPlans() = default;

std::vector<std::pair<const TrainStep *, const MemoryPlan *>> StepPlans::secondary() const {
    std::vector<std::pair<const TrainStep *, const MemoryPlan *>> out;
    if (first) out.push_back({first.get(), &first_plan});
    if (mid) out.push_back({mid.get(), &mid_plan});
    if (eval) out.push_back({eval.get(), &eval_plan});
    return out;
}

CategoryBytes StepPlans::reserved() const {
    std::vector<const MemoryPlan *> others;
    for (const auto & sp : secondary()) others.push_back(sp.second);
    return shared_reserved(train_plan, others);
}

CategoryBytes StepPlans::peak_live() const {
    std::vector<const MemoryPlan *> others;
    for (const auto & sp : secondary()) others.push_back(sp.second);
    return shared_peak_live(train_plan, others);
}

bool LossScaler::update(bool finite) {
    if (!finite) {
        if (dynamic) scale = std::max(scale / 2, min_scale);
        clean = 0;
        ++skipped;
        return false;
    }
    if (dynamic && ++clean >= growth_interval) {
        scale *= 2;
        clean = 0;
    }
    return true;
}

namespace {
// The options with this process's rank (the communicator's), checked against the world size.
EngineOptions with_rank(EngineOptions o) {
    if (o.data_parallel > 1 && (!o.comm || o.comm->size() != o.data_parallel))
        throw ConfigError(fmt::format("data parallel over {} ranks needs a communicator of that size",
                                      o.data_parallel));
    if (o.comm && o.comm->size() != o.data_parallel)
        throw ConfigError(fmt::format("a communicator of {} ranks for data parallel over {}", o.comm->size(),
                                      o.data_parallel));
    o.rank = o.comm ? o.comm->rank() : 0;
    if (o.tp_comm && o.tp_comm->size() != o.tensor_parallel)
        throw ConfigError(fmt::format("a communicator of {} ranks for tensor parallel over {}", o.tp_comm->size(),
                                      o.tensor_parallel));
    if (o.tensor_parallel > 1 && !o.tp_comm)
        throw ConfigError(fmt::format("tensor parallel over {} ranks needs a communicator of that size",
                                      o.tensor_parallel));
    o.tp_rank = o.tp_comm ? o.tp_comm->rank() : 0;
    if ((o.pipeline_parallel > 1 && !o.pp_comm) || (o.pp_comm && o.pp_comm->size() != o.pipeline_parallel))
        throw ConfigError(fmt::format("pipeline parallel over {} stages needs a communicator of that size",
                                      o.pipeline_parallel));
    o.pp_rank = o.pp_comm ? o.pp_comm->rank() : 0;
    if ((o.expert_parallel > 1 && !o.ep_comm) || (o.ep_comm && o.ep_comm->size() != o.expert_parallel))
        throw ConfigError(fmt::format("expert parallel over {} ranks needs a communicator of that size",
                                      o.expert_parallel));
    o.ep_rank = o.ep_comm ? o.ep_comm->rank() : 0;
    return o;
}
}  // namespace

Engine::Engine(const ModelConfig & cfg, Backend & backend, const EngineOptions & opt)
    : cfg_(cfg), backend_(backend), opt_(with_rank(opt)), plans_(cfg, backend, opt_) {
    comm_ = opt_.comm;
    if (!comm_) {
        own_comm_ = make_single_communicator();
        comm_ = own_comm_.get();
    }
    tp_comm_ = opt_.tp_comm;
    if (!tp_comm_) {
        own_tp_comm_ = make_single_communicator();
        tp_comm_ = own_tp_comm_.get();
    }
    pp_comm_ = opt_.pp_comm;
    if (!pp_comm_) {
        own_pp_comm_ = make_single_communicator();
        pp_comm_ = own_pp_comm_.get();
    }
    ep_comm_ = opt_.ep_comm;
    if (!ep_comm_) {
        own_ep_comm_ = make_single_communicator();
        ep_comm_ = own_ep_comm_.get();
    }
    // The interleaved schedule keeps sends out while it receives (train/step_pipeline.cpp).
    if (opt_.pipeline_parallel > 1 && opt_.virtual_stages > 1) pp_comm_->open_send_channels();
    if (opt_.pipeline_parallel > 1 && cfg.tied_head && !opt_.emb_comm)
        throw ConfigError("a pipeline with a tied LM head needs the embedding group (first and last stage)");
    if (const std::string why = sparsity_refusal(cfg, opt_.sparsity, plans_.train->lora()); !why.empty())
        throw ConfigError(why);
    if (opt.budget > 0) {
        std::string hint = opt.lora.enabled() && !opt.lora.quantized()
                               ? "try --fit auto (micro-batch, accumulation, recomputation within the budget), "
                                 "--base-weights nf4 (a 4-bit base), --recompute full, or a lower --micro-batch or --seq"
                               : "try --fit auto (micro-batch, accumulation, recomputation within the budget), "
                                 "--recompute full, --precision bf16, or a lower --micro-batch or --seq";
        // Activations ahead of every other category: the long-context remedies too.
        const CategoryBytes need = planned_reserved();
        bool acts_lead = true;
        for (int c = 0; c < kCategoryCount; ++c)
            if (Category(c) != Category::activations && need.v[size_t(c)] > need[Category::activations]) acts_lead = false;
        std::vector<std::string> more;
        if (acts_lead && !opt_.offload_activations)
            more.push_back("--offload activations (with --offload-dir DIR on the CPU) keeps each layer's saved ones "
                           "off the device between its forward and backward");
        if (acts_lead && opt_.context_parallel == 1)
            more.push_back("mpirun -np N ... --cp N splits each sequence over N ranks");
        if (!more.empty()) hint += fmt::format("; the activations lead: {}", fmt::join(more, "; "));
        check_budget(need, opt.budget, hint);
    }
    if (plans_.train->offloaded_elems() > 0 || plans_.train->params_offloaded() ||
        plans_.train->offloaded_activation_bytes() > 0) {   // where the offloaded bytes live
        if (!opt_.offload_dir.empty() && !backend.host_memory())
            throw ConfigError(fmt::format("--offload-dir with --device {}: what --offload moves goes to pinned host "
                                          "memory on a GPU; drop --offload-dir", backend.name()));
        if (opt_.offload_dir.empty() && backend.host_memory())
            throw ConfigError("--offload on the CPU backend needs --offload-dir DIR: its device memory is the host's");
        const int rank = (opt_.pp_rank * opt_.data_parallel + opt_.rank) * opt_.tensor_parallel + opt_.tp_rank;
        store_ = opt_.offload_dir.empty() ? make_host_store(backend_)
                                          : make_file_store(opt_.offload_dir, fmt::format("rank{}", rank));
    }
    train_mem_ = std::make_unique<StepMemory>(plans_.train->program(), plans_.train_plan, ledger_, backend_.allocator(),
                                              opt.checking, nullptr, store_.get());
    auto shared = [&](const TrainStep & s, const MemoryPlan & p) {
        return std::make_unique<StepMemory>(s.program(), p, ledger_, backend_.allocator(), opt.checking,
                                            train_mem_.get());
    };
    if (plans_.first) first_mem_ = shared(*plans_.first, plans_.first_plan);
    if (plans_.mid) mid_mem_ = shared(*plans_.mid, plans_.mid_plan);
    if (plans_.eval) eval_mem_ = shared(*plans_.eval, plans_.eval_plan);
    scaler_ = opt.loss_scaling;
    if (opt.compute != DType::f16) scaler_.scale = 1.0f;
}

Engine::~Engine() = default;

namespace {

// GPT-2's initialisation of every weight of `layout` (the whole model) into p.
void init_model(const ModelConfig & cfg, const ParamLayout & layout, float * p, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float proj_std = 0.02f / std::sqrt(2.0f * float(cfg.n_layer));
    for (const auto & info : layout.params) {
        float * w = p + info.offset;
        const std::string & n = info.name;
        if (n.ends_with(".bias")) {
            std::memset(w, 0, info.numel * sizeof(float));
        } else if (info.shape.size() == 1) {   // the norms' gains (LayerNorm, RMSNorm)
            for (size_t i = 0; i < info.numel; ++i) w[i] = 1.0f;
        } else {
            // The projections that write into the residual stream start smaller (GPT-2 paper).
            const bool residual_out = n.ends_with("c_proj.weight") || n.ends_with("o_proj.weight") ||
                                      n.ends_with("down_proj.weight");
            const float sd = residual_out ? proj_std : 0.02f;
            for (size_t i = 0; i < info.numel; ++i) w[i] = sd * normal(rng);
        }
    }
}

// LoRA's adapters: A Gaussian with variance 1/in (so x A^T keeps x's scale), B zero (Hu et al.);
// an embedding's the other way round, A zero and B standard normal, as PEFT starts them.
void init_adapters(const ParamLayout & layout, float * p, uint64_t seed) {
    std::mt19937_64 rng(seed ^ 0x10a4a11ce5ull);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const auto & info : layout.params) {
        float * w = p + info.offset;
        if (info.name.ends_with("lora_B.weight") || info.name.ends_with(".lora_embedding_A")) {
            std::memset(w, 0, info.numel * sizeof(float));
            continue;
        }
        const float sd = info.name.ends_with(".lora_embedding_B") ? 1.0f : 1.0f / std::sqrt(float(info.shape[1]));
        for (size_t i = 0; i < info.numel; ++i) w[i] = sd * normal(rng);
    }
}

}  // namespace

void Engine::init_params(uint64_t seed) {
    const TrainStep & st = *plans_.train;
    std::vector<float> full(size_t(cfg_.num_params()));
    init_model(cfg_, make_param_layout(cfg_), full.data(), seed);
    if (st.lora()) {   // the whole model's adapters, as one process draws them (set_params slices them)
        store_base(full.data());
        const ParamLayout adapters = make_lora_layout(cfg_, opt_.lora);
        std::vector<float> a(adapters.total, 0.0f);
        init_adapters(adapters, a.data(), seed);
        if (opt_.lora.dora) dora_start(full.data(), a.data());
        full = std::move(a);
    }
    set_params(full.data());
    if (const ModelConfig * tc = st.teacher_config()) {   // a placeholder until set_teacher (bench runs it)
        std::vector<float> teacher(size_t(tc->num_params()));
        init_model(*tc, make_param_layout(*tc), teacher.data(), seed + 1);
        set_teacher(teacher.data());
    }
    if (st.preference().copy()) reference_from_start();
    const std::vector<float> zeros(st.shard_size(), 0.0f);
    store_moments(0, zeros.data(), zeros.size());
    store_moments(1, zeros.data(), zeros.size());
    t_ = 0;
}

void Engine::set_base(const float * full, const std::vector<uint8_t> * packed) {
    store_base(full, packed);
    if (!opt_.lora.dora) return;
    std::vector<float> adapters = full_params();
    dora_start(full, adapters.data());
    set_params(adapters.data());
}

void Engine::dora_start(const float * full, float * adapters) {
    // The rows the step computes with: a packed base's dequantized ones (PEFT's start on QLoRA).
    if (!opt_.lora.quantized()) return init_dora_magnitudes(cfg_, opt_.lora, full, adapters);
    const std::vector<float> base = base_weights();
    init_dora_magnitudes(cfg_, opt_.lora, base.data(), adapters);
}

void Engine::store_base(const float * full, const std::vector<uint8_t> * packed) {
    const TrainStep & st = *plans_.train;
    MF_ASSERT(st.lora() && (!packed || opt_.tensor_parallel == 1));
    // Tensor parallel: this rank's slice of the model, split as its own (the step's config).
    const std::vector<float> slice =
        opt_.tensor_parallel > 1 ? tp_slice(cfg_, opt_.tensor_parallel, opt_.tp_rank, full) : std::vector<float>{};
    const SplitBytes whole = split_weights(backend_, st.config(), st.base_layout(), st.quant_layout(), st.compute(),
                                           slice.empty() ? full : slice.data(), packed ? packed->data() : nullptr);
    // This rank's part (ZeRO 3: its shard) of each of the split form's buffers.
    auto store = [&](BufferId id, const std::vector<uint8_t> & bytes, const FlatShards & sh, size_t es) {
        if (id < 0) return;
        const size_t lo = sh.lo(opt_.rank) * es, hi = sh.hi(opt_.rank) * es;
        MF_ASSERT(bytes.size() == sh.total * es && hi - lo <= st.program().buffer(id).bytes);
        if (hi > lo) backend_.upload(train_mem_->base(id), bytes.data() + lo, hi - lo);
    };
    store(st.base, whole.dense, st.base_shards(), dtype_size(st.compute()));
    store(st.base_q, whole.packed, st.base_q_shards(), 1);
}

void Engine::set_teacher(const float * full) {
    const TrainStep & st = *plans_.train;
    MF_ASSERT(st.teacher_config());
    Tensor dense(st.teacher, st.compute(), {int64_t(st.teacher_layout().total)});
    dense.data = train_mem_->base(st.teacher);
    store_split_weights(backend_, *st.teacher_config(), st.teacher_quant(), dense,
                        static_cast<uint8_t *>(st.teacher_q >= 0 ? train_mem_->base(st.teacher_q) : nullptr), full);
}

std::vector<float> Engine::base_weights() {
    const TrainStep & st = *plans_.train;
    MF_ASSERT(st.lora());
    // Each buffer whole on the host: this rank's part, gathered over the data-parallel ranks (ZeRO 3).
    auto whole = [&](BufferId id, const FlatShards & sh, size_t es) {
        std::vector<uint8_t> all(sh.total * es);
        if (id < 0) return all;
        std::vector<uint8_t> mine(st.program().buffer(id).bytes);
        backend_.download(mine.data(), train_mem_->base(id), mine.size());
        if (sh.whole) std::copy_n(mine.begin(), all.size(), all.begin());
        else comm_->iall_gather(mine.data(), all.data(), sh.counts(0, sh.total), es)->wait();
        return all;
    };
    const size_t cs = dtype_size(st.compute());
    const std::vector<uint8_t> dense = whole(st.base, st.base_shards(), cs), packed = whole(st.base_q, st.base_q_shards(), 1);
    std::vector<float> local = join_split_weights(backend_, st.config(), st.base_layout(), st.quant_layout(),
                                                  st.compute(), dense.data(), packed.data());
    const ParamLayout model = make_param_layout(st.config());
    if (opt_.pipeline_parallel > 1) {   // the stage's part, and every stage's put together
        local = pp_gather(take_by_name(model, stage_part(opt_.pp_rank, false), local.data()), false);
    }
    if (opt_.tensor_parallel == 1) return local;
    return tp_gather(local, {make_param_layout(cfg_), model});
}

std::vector<float> Engine::full_params() { return gather_whole(params()); }

size_t Engine::total_params() const {
    if (!split_model()) return plans_.train->layout().total;
    return plans_.train->lora() ? make_lora_layout(cfg_, opt_.lora).total : size_t(cfg_.num_params());
}

// The trainable layouts tensor parallelism maps between: the whole model's and this rank's slice
// (the model's parameters, or LoRA's adapters).
std::pair<ParamLayout, ParamLayout> Engine::tp_layouts() const {
    const ModelConfig local = tp_local_config(cfg_, opt_.tensor_parallel);
    if (plans_.train->lora()) return {make_lora_layout(cfg_, opt_.lora), make_lora_layout(local, opt_.lora)};
    return {make_param_layout(cfg_), make_param_layout(local)};
}

std::vector<float> Engine::gather_whole(const float * mine) {
    const TrainStep & st = *plans_.train;
    const Shard sh = shard();
    std::vector<float> stage(sh.total);
    if (opt_.zero == 0) std::memcpy(stage.data(), mine, sh.total * sizeof(float));
    else comm_->iall_gather(mine, stage.data(), st.shard_counts(0, sh.total), sizeof(float))->wait();
    if (opt_.pipeline_parallel > 1) stage = pp_gather(stage, st.lora());   // every stage's, by name
    if (opt_.expert_parallel > 1) return ep_gather(stage);
    return opt_.tensor_parallel > 1 ? tp_gather(stage, tp_layouts()) : stage;
}

// Stage s's part of the tensor slice's model (`adapters`, under LoRA: its adapters'; else the
// model's parameters it holds).
ParamLayout Engine::stage_part(int s, bool adapters) const {
    const TrainStep & st = *plans_.train;
    const ModelConfig & local = st.config();
    PipelineParallel pp = st.pipeline();
    pp.stage = s;
    const std::vector<StageRange> chunks = stage_chunks(local, pp, opt_.T);
    if (adapters) return keep_blocks(make_lora_layout(local, opt_.lora), chunks);
    return stage_layout(local, chunks, s == 0, s == opt_.pipeline_parallel - 1);
}

std::vector<float> Engine::pp_gather(const std::vector<float> & stage, bool lora) {
    const ParamLayout whole = lora ? make_lora_layout(plans_.train->config(), opt_.lora)
                                   : make_param_layout(plans_.train->config());
    std::vector<ParamLayout> parts;
    for (int s = 0; s < opt_.pipeline_parallel; ++s) parts.push_back(stage_part(s, lora));
    return gather_by_name(*pp_comm_, stage, parts, whole);
}

std::vector<float> Engine::gather_by_name(Communicator & c, const std::vector<float> & mine,
                                          const std::vector<ParamLayout> & parts, const ParamLayout & whole) const {
    std::vector<size_t> counts;
    for (const ParamLayout & p : parts) counts.push_back(p.total);
    MF_ASSERT(counts[size_t(c.rank())] == mine.size());
    std::vector<float> all(std::accumulate(counts.begin(), counts.end(), size_t(0))), out(whole.total);
    c.iall_gather(mine.data(), all.data(), counts, sizeof(float))->wait();
    size_t at = 0;
    for (size_t r = 0; r < parts.size(); at += counts[r], ++r) put_by_name(whole, parts[r], all.data() + at, out.data());
    return out;
}

std::vector<float> Engine::my_part(const float * whole) const {
    if (opt_.expert_parallel > 1) return take_by_name(make_param_layout(cfg_), plans_.train->layout(), whole);
    std::vector<float> slice;
    if (opt_.tensor_parallel > 1) {
        const auto [all, mine] = tp_layouts();
        slice = tp_slice(all, mine, cfg_, opt_.tensor_parallel, opt_.tp_rank, whole);
    }
    const float * local = slice.empty() ? whole : slice.data();
    if (opt_.pipeline_parallel == 1) return slice.empty() ? std::vector<float>(whole, whole + total_params()) : slice;
    const TrainStep & st = *plans_.train;
    const ParamLayout full = st.lora() ? make_lora_layout(st.config(), opt_.lora) : make_param_layout(st.config());
    return take_by_name(full, st.layout(), local);
}

std::vector<float> Engine::tp_gather(const std::vector<float> & local, const std::pair<ParamLayout, ParamLayout> & l) {
    const int T = opt_.tensor_parallel;
    MF_ASSERT(local.size() == l.second.total);
    std::vector<float> all(local.size() * size_t(T)), whole(l.first.total);
    tp_comm_->all_gather(local.data(), all.data(), local.size() * sizeof(float));
    std::vector<const float *> slices;
    for (int r = 0; r < T; ++r) slices.push_back(all.data() + size_t(r) * local.size());
    tp_assemble(l.first, l.second, cfg_, T, slices, whole.data());
    return whole;
}

std::vector<float> Engine::merged_weights() {
    const TrainStep & st = *plans_.train;
    if (!st.lora()) return full_params();
    const std::vector<float> adapters = full_params();
    std::vector<float> w = base_weights();
    merge_lora(cfg_, opt_.lora, w.data(), adapters.data());
    return w;
}

std::vector<uint8_t> Engine::export_frozen() const {
    const TrainStep & st = *plans_.train;
    std::vector<uint8_t> out;
    for (BufferId b : st.frozen_buffers()) {
        if (b < 0) continue;
        const size_t at = out.size();
        out.resize(at + st.program().buffer(b).bytes);
        backend_.download(out.data() + at, train_mem_->base(b), out.size() - at);   // a memcpy on the CPU
    }
    return out;
}

void Engine::import_frozen(const std::vector<uint8_t> & bytes) {
    const TrainStep & st = *plans_.train;
    size_t off = 0;
    for (BufferId b : st.frozen_buffers()) {
        if (b < 0) continue;
        const size_t n = st.program().buffer(b).bytes;
        MF_ASSERT(off + n <= bytes.size());
        backend_.upload(train_mem_->base(b), bytes.data() + off, n);
        off += n;
    }
    MF_ASSERT(off == bytes.size());
}

TrainState Engine::export_state() {
    const Shard sh = shard();
    const size_t n = sh.hi - sh.lo;
    TrainState s;
    if (split_model()) {   // the whole model's: gathered over the data, pipeline and tensor groups
        s.params = gather_whole(params());
        s.m = gather_whole(adam_m());
        s.v = gather_whole(adam_v());
        s.total = s.params.size();
        s.t = t_;
        s.scaler = {scaler_.scale, scaler_.clean, scaler_.skipped};
        return s;
    }
    // One download each on a device. Where a host copy was made (a device, offloaded or 16-bit
    // states), it moves into the state: none is kept between checkpoints, none copied twice.
    auto take = [&](const float * p, std::vector<float> & mirror, std::vector<float> & into) {
        if (p == mirror.data()) {
            into = std::move(mirror);
            mirror = {};
            into.resize(n);
        } else {
            into.assign(p, p + n);
        }
    };
    take(params(), mirror_params_, s.params);
    params_handed_ = false;
    take(adam_m(), mirror_m_, s.m);
    take(adam_v(), mirror_v_, s.v);
    s.offset = sh.lo;
    s.total = sh.total;
    s.t = t_;
    s.scaler = {scaler_.scale, scaler_.clean, scaler_.skipped};
    return s;
}

std::optional<TrainStateView> Engine::state_view() {
    if (split_model()) return std::nullopt;
    const float * p = params(), * m = adam_m(), * v = adam_v();
    // A host copy made for the reading (a device, 16-bit or offloaded state, SGD's absent v):
    // export_state moves it into its state instead.
    if (p == mirror_params_.data() || m == mirror_m_.data() || v == mirror_v_.data()) return std::nullopt;
    const Shard sh = shard();
    TrainStateView s;
    s.params = p, s.m = m, s.v = v;
    s.n = sh.hi - sh.lo;
    s.offset = sh.lo;
    s.total = sh.total;
    s.t = t_;
    s.scaler = {scaler_.scale, scaler_.clean, scaler_.skipped};
    return s;
}

void Engine::import_state(const TrainState & state) {
    const Shard sh = shard();
    TrainState sliced;
    if (split_model()) {   // a whole state: this rank's part of it
        const size_t total = state.total ? state.total : state.params.size();
        if (state.offset != 0 || total != total_params() || state.params.size() != total ||
            state.m.size() != total || state.v.size() != total)
            throw FormatError(fmt::format("tensor and pipeline parallelism need the whole training state of {} "
                                          "elements; this one holds [{}, {}) of {}", total_params(), state.offset,
                                          state.offset + state.params.size(), total));
        sliced.params = my_part(state.params.data());
        sliced.m = my_part(state.m.data());
        sliced.v = my_part(state.v.data());
        sliced.total = sliced.params.size();
        sliced.t = state.t;
        sliced.scaler = {state.scaler.scale, state.scaler.clean, state.scaler.skipped};
    }
    const TrainState & s = split_model() ? sliced : state;
    const size_t total = s.total ? s.total : s.params.size(), n = sh.hi - sh.lo;
    if (total != sh.total || s.offset > sh.lo || s.offset + s.params.size() < sh.hi || s.m.size() != s.params.size() ||
        s.v.size() != s.params.size())
        throw FormatError(fmt::format("the training state holds elements [{}, {}) of {} (moments {}, {}); this rank "
                                      "needs [{}, {}) of {}",
                                      s.offset, s.offset + s.params.size(), total, s.m.size(), s.v.size(), sh.lo, sh.hi,
                                      sh.total));
    const size_t at = sh.lo - s.offset;
    store_own_params(s.params.data() + at, n);
    store_moments(0, s.m.data() + at, n);
    store_moments(1, s.v.data() + at, n);
    params_changed();
    t_ = s.t;
    scaler_.scale = s.scaler.scale;
    scaler_.clean = s.scaler.clean;
    scaler_.skipped = s.scaler.skipped;
}

void Engine::execute(const TrainStep & step, StepMemory & mem, const StepScalars & s) {
    Graph g(step.program(), mem, backend_);
    g.set_communicator(comm_);
    g.set_tensor_communicator(tp_comm_);
    g.set_expert_communicator(ep_comm_);
    g.set_context_communicator(opt_.cp_comm);
    g.set_pipeline_communicator(pp_comm_);
    g.set_embedding_communicator(opt_.emb_comm);
    if (cancel_) g.set_cancel(&cancel_);
    if (skip_ask_ && &step == plans_.train.get()) g.set_skip_update(&skip_ask_);
    if (timeline_ && &step == plans_.train.get()) {
        timeline_->program = "train";
        timeline_->events.clear();
        timeline_->origin_s = 0;
        timeline_->failed_op = -1;
        g.attach_timeline(timeline_);
    }
    step.run(g, s);
    MF_ASSERT(g.ops_issued() == step.program().num_ops());
}

int Engine::count_targets(const int32_t * inputs, const int32_t * targets, size_t n) const {
    int valid = 0;
    for (size_t i = 0; i < n; ++i) {
        if (inputs[i] < 0 || inputs[i] >= cfg_.vocab_size)
            throw FormatError(fmt::format("token {} at position {} is outside the vocabulary of {}", inputs[i], i,
                                          cfg_.vocab_size));
        if (targets[i] == -100) continue;
        if (targets[i] < 0 || targets[i] >= cfg_.vocab_size)
            throw FormatError(fmt::format("target {} at position {} is outside the vocabulary of {}", targets[i], i,
                                          cfg_.vocab_size));
        ++valid;
    }
    return valid;
}

// Context parallel: each local row's t - position (the embedding's and RoPE's "document start"),
// position and first key, from its document's start in the whole sequence (0: one per row).
void Engine::upload_context(const TrainStep & step, StepMemory & mem, const int32_t * doc_start) {
    const size_t BT = size_t(step.B()) * size_t(step.T());
    const ContextParallel cp{opt_.context_parallel, opt_.cp_rank};
    const int T = step.T(), whole = T * cp.ranks;
    std::vector<int32_t> ctx(3 * BT + size_t(cp.ranks) * size_t(T));
    for (size_t i = 0; i < BT; ++i) {
        const int t = int(i % size_t(T)), pos = cp.position(t, whole), first = doc_start ? doc_start[i] : 0;
        ctx[i] = t - (pos - first);
        ctx[BT + i] = pos;
        ctx[2 * BT + i] = first;
    }
    for (int r = 0; r < cp.ranks; ++r)   // the ring's blocks: rank r's rows' positions
        for (int t = 0; t < T; ++t) ctx[3 * BT + size_t(r) * size_t(T) + size_t(t)] = ContextParallel{cp.ranks, r}.position(t, whole);
    backend_.upload(mem.base(step.context), ctx.data(), ctx.size() * 4);
}

void Engine::check_doc_starts(const int32_t * doc_start, size_t rows) const {
    const int T = opt_.T;
    if (opt_.context_parallel > 1) {   // this rank's chunks: each start at most its position, in order
        const ContextParallel cp{opt_.context_parallel, opt_.cp_rank};
        for (size_t r = 0; r < rows; ++r)
            for (int t = 0; t < T; ++t) {
                const int32_t s = doc_start[r * size_t(T) + size_t(t)], pos = cp.position(t, T * cp.ranks);
                const bool ok = s >= 0 && s <= pos && (t % cp.chunk(T * cp.ranks) == 0 || s == pos ||
                                                       s == doc_start[r * size_t(T) + size_t(t) - 1]);
                if (!ok)
                    throw FormatError(fmt::format("document start {} at position {} of row {}: a token's document "
                                                  "starts at itself or where the previous token's does", s, pos, r));
            }
        return;
    }
    for (size_t r = 0; r < rows; ++r)
        for (int t = 0; t < T; ++t) {
            const int32_t s = doc_start[r * size_t(T) + size_t(t)];
            const bool ok = t == 0 ? s == 0 : s == t || s == doc_start[r * size_t(T) + size_t(t) - 1];
            if (!ok)
                throw FormatError(fmt::format("document start {} at token {} of row {}: a token's document starts at "
                                              "itself or where the previous token's does (and the first at 0)",
                                              s, t, r));
        }
}

double Engine::run_batch(const TrainStep & step, StepMemory & mem, const int32_t * inputs, const int32_t * targets,
                         const int32_t * doc_start, float dloss, const OptimHyper * h, uint64_t seed) {
    const size_t BT = size_t(step.B()) * size_t(step.T()) * size_t(step.micro_batches());
    backend_.upload(mem.base(step.tokens), inputs, BT * 4);
    backend_.upload(mem.base(step.targets), targets, BT * 4);
    if (step.doc_start >= 0) {
        MF_ASSERT(doc_start && "packed documents: the batch's document starts are missing");
        backend_.upload(mem.base(step.doc_start), doc_start, BT * 4);
    }
    if (step.context >= 0) upload_context(step, mem, doc_start);
    if (step.attn_start >= 0) {   // sliding window: each query's first key, within its document
        const int T = step.T(), W = cfg_.sliding_window;
        std::vector<int32_t> lo(BT);
        for (size_t i = 0; i < lo.size(); ++i) {
            const int t = int(i % size_t(T));
            lo[i] = std::max(t - W + 1, step.doc_start >= 0 ? doc_start[i] : 0);
        }
        backend_.upload(mem.base(step.attn_start), lo.data(), lo.size() * 4);
    }
    StepScalars s;
    s.dloss = dloss;
    s.seed = seed;
    if (h) s.optim = *h;
    if (step.ref_logps >= 0) preference_io(step, mem, targets, true);
    s.moe_aux = moe_aux_scale_;
    s.moe_z = moe_z_scale_;
    execute(step, mem, s);
    moe_read(step, mem);
    if (step.ref_logps >= 0) preference_io(step, mem, targets, false);
    return losses_sum(step, mem);
}

double Engine::losses_sum(const TrainStep & step, StepMemory & mem) const {
    const size_t BT = size_t(step.B()) * size_t(step.T()) * size_t(step.micro_batches());
    std::vector<float> l(BT);
    backend_.download(l.data(), mem.base(step.losses), BT * sizeof(float));
    double sum = 0;
    for (size_t i = 0; i < BT; ++i) sum += l[i];
    return sum;
}

StepResult Engine::train_step(const int32_t * inputs, const int32_t * targets, const OptimHyper & h,
                              const int32_t * doc_start, const float * ref_logps) {
    params_handed_ = false;   // a step changes the weights: a mirror handed out before is stale
    const int k = opt_.grad_accum;
    const size_t BT = size_t(opt_.B) * size_t(opt_.T);
    StepResult r;
    r.tokens = count_targets(inputs, targets, BT * size_t(k));
    if (opt_.documents) check_doc_starts(doc_start, size_t(opt_.B) * size_t(k));
    r.tokens = int(sum_over_data(double(r.tokens)));
    // Every micro-batch's loss gradient is scaled by the whole step's token count (preference
    // tuning: pair count), so the accumulated gradients are those of one batch of k*B sequences.
    // fp16: the loss gradient is multiplied by the loss scale and AdamW divides it back out.
    const int units = opt_.pref.enabled() ? opt_.B / 2 * k * opt_.data_parallel : r.tokens;
    const float dloss = units > 0 ? scaler_.scale / float(units) * h.loss_grad_factor : 0.0f;
    run_pref_ = {};
    r.loss_scale = scaler_.scale;
    // The router losses: a mean over the micro-batches and ranks (each micro-batch's own loss, as
    // transformers computes it per forward).
    const float per_batch = scaler_.scale * h.loss_grad_factor / float(k * opt_.data_parallel * opt_.expert_parallel);
    moe_aux_scale_ = cfg_.moe.aux_coef * per_batch;
    moe_z_scale_ = cfg_.moe.z_coef * per_batch;
    moe_ = {};
    OptimHyper hh = h;
    hh.t = t_ + 1;
    // N:M sparsity: pruned once `start` updates are in, the zeros kept by every update after.
    hh.keep_zeros = opt_.sparsity.enabled() && t_ >= opt_.sparsity.start;
    if (hh.keep_zeros) prune_if_due();
    hh.grad_scale = 1.0f / scaler_.scale;
    hh.skip_nonfinite = h.skip_nonfinite || opt_.compute == DType::f16;
    // The caller's threshold is on the true norm; the kernels compare the scaled gradients'.
    if (h.skip_above_norm_sq > 0) hh.skip_above_norm_sq = h.skip_above_norm_sq / (hh.grad_scale * hh.grad_scale);
    // bf16-sr: one stream of rounding draws per (run, step), whatever the micro-batches (never 0).
    if (plans_.train->sr_master()) hh.sr_seed = (opt_.seed * 0xd1342543de82ef95ull + uint64_t(hh.t) * 0x9e3779b97f4a7c15ull) | 1;
    double sum = 0;
    // --skip-spikes: the whole step's loss is known once the update program's backward is done
    // (the earlier micro-batches' sum, this program's losses, every rank's); the graph asks
    // before the first update and leaves the step out if it is above the limit.
    struct Forget {   // the question refers to this call's locals: gone with them, thrown or not
        std::function<bool()> & f;
        ~Forget() { f = nullptr; }
    } forget{skip_ask_};
    if (h.skip_above_loss > 0)
        skip_ask_ = [&] {
            double all = sum + losses_sum(*plans_.train, *train_mem_);
            if (opt_.pipeline_parallel > 1) all = pp_comm_->all_reduce_sum(all);
            all = sum_over_data(all);
            const double loss = units > 0 ? all / units : 0.0;
            r.loss_outlier = !(loss <= double(h.skip_above_loss));
            return r.loss_outlier;
        };
    for (int i = 0; i < k && opt_.pipeline_parallel == 1; ++i) {
        const int32_t * in = inputs + size_t(i) * BT;
        const int32_t * tg = targets + size_t(i) * BT;
        const int32_t * ds = doc_start ? doc_start + size_t(i) * BT : nullptr;
        batch_ref_ = ref_logps ? ref_logps + size_t(i) * size_t(opt_.B) : nullptr;
        // One stream per (run, step, micro-batch): a resumed or re-planned run draws the same masks
        // (re-planning splits the global batch differently, so its micro-batch streams differ).
        const uint64_t seed = opt_.seed * 0x9e3779b97f4a7c15ull + uint64_t(t_) * 1000003ull + uint64_t(i);
        if (i == k - 1) sum += run_batch(*plans_.train, *train_mem_, in, tg, ds, dloss, &hh, seed);
        else if (i == 0) sum += run_batch(*plans_.first, *first_mem_, in, tg, ds, dloss, nullptr, seed);
        else sum += run_batch(*plans_.mid, *mid_mem_, in, tg, ds, dloss, nullptr, seed);
    }
    if (opt_.pipeline_parallel > 1) {   // all k micro-batches in one program; the last stage's losses
        const uint64_t seed = opt_.seed * 0x9e3779b97f4a7c15ull + uint64_t(t_) * 1000003ull;
        sum = pp_comm_->all_reduce_sum(run_batch(*plans_.train, *train_mem_, inputs, targets, doc_start, dloss, &hh,
                                                 seed));
    }
    sum = sum_over_data(sum);
    r.loss = units > 0 ? float(sum / units) : 0.0f;
    if (moe_.batches > 0) {
        double aux = moe_.aux, z = moe_.z, n = moe_.batches;
        aux = sum_over_data(aux), z = sum_over_data(z), n = sum_over_data(n);
        r.moe_dropped = moe_.dropped;   // every rank's (the statistics were summed over them)
        r.aux_loss = float(aux / n), r.z_loss = float(z / n);
        r.loss += cfg_.moe.aux_coef * r.aux_loss + cfg_.moe.z_coef * r.z_loss;
        r.expert_tokens = moe_.tokens;
    }
    moe_aux_scale_ = moe_z_scale_ = 0;
    r.pref = reduced_preference(run_pref_);
    float norm_sq = 0;
    backend_.download(&norm_sq, train_mem_->base(plans_.train->grad_norm_sq), sizeof norm_sq);
    r.grad_norm = std::sqrt(norm_sq) * hh.grad_scale;
    if (opt_.compute == DType::f16) scaler_.update(std::isfinite(norm_sq));
    r.skipped = r.loss_outlier || skips_update(hh, norm_sq);
    if (!r.skipped) ++t_;
    return r;
}

void Engine::prune_if_due() {
    if (pruned_) return;
    std::vector<float> w = full_params();   // the whole model on every rank (collective), as the checkpoints take it
    prune_nm(cfg_, make_param_layout(cfg_), w.data(), opt_.sparsity);
    set_params(w.data());
    pruned_ = true;
}

float Engine::eval_loss(const int32_t * inputs, const int32_t * targets, const int32_t * doc_start,
                        const float * ref_logps) {
    MF_ASSERT(plans_.eval && "engine built without the evaluation program");
    const size_t BT = size_t(opt_.B) * size_t(opt_.T);
    int valid = count_targets(inputs, targets, BT);
    if (opt_.pref.enabled()) valid = opt_.B / 2;   // the loss is the pairs' mean
    if (opt_.documents) check_doc_starts(doc_start, size_t(opt_.B));
    run_pref_ = {};
    batch_ref_ = ref_logps;
    double sum = run_batch(*plans_.eval, *eval_mem_, inputs, targets, doc_start, 0.0f, nullptr);
    eval_pref_ = reduced_preference(run_pref_);
    if (opt_.pipeline_parallel > 1) sum = pp_comm_->all_reduce_sum(sum);
    valid = int(sum_over_data(double(valid)));
    sum = sum_over_data(sum);
    return valid > 0 ? float(sum / valid) : 0.0f;
}

std::vector<float> Engine::logits(const int32_t * inputs, int batch) {
    if (!fwd_ || fwd_batch_ != batch) {
        fwd_mem_.reset();
        fwd_batch_ = batch;
        ModelOptions mo = opt_.model();
        mo.documents = false;   // sampling: one sequence per row
        fwd_ = std::make_unique<TrainStep>(cfg_, batch, opt_.T, StepMode::logits, &backend_, mo, StepParts{},
                                           opt_.dp());
        fwd_plan_ = plan_memory(fwd_->program());
        fwd_mem_ = std::make_unique<StepMemory>(fwd_->program(), fwd_plan_, ledger_, backend_.allocator(),
                                                opt_.checking, train_mem_.get());
    }
    const size_t BT = size_t(batch) * size_t(opt_.T);
    std::vector<int32_t> no_targets(BT, -100);
    count_targets(inputs, no_targets.data(), BT);
    run_batch(*fwd_, *fwd_mem_, inputs, no_targets.data(), nullptr, 0.0f, nullptr);
    std::vector<float> out(BT * size_t(cfg_.vocab_size));
    backend_.download(out.data(), fwd_mem_->base(fwd_->logits().buffer), out.size() * sizeof(float));
    return out;
}

}  // namespace memfit
