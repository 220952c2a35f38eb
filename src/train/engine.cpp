#include "train/engine.h"

#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "memory/budget.h"

namespace memfit {

Engine::Engine(const ModelConfig & cfg, Backend & backend, const EngineOptions & opt)
    : cfg_(cfg), backend_(backend), opt_(opt) {
    if (opt.grad_accum < 1) throw ConfigError(fmt::format("--grad-accum {}: must be at least 1", opt.grad_accum));
    const int k = opt.grad_accum;
    train_ = std::make_unique<TrainStep>(cfg, opt.B, opt.T, StepMode::train, &backend, opt.model(),
                                         StepParts{k == 1, true});
    train_plan_ = plan_memory(train_->program());
    if (k > 1) {
        first_ = std::make_unique<TrainStep>(cfg, opt.B, opt.T, StepMode::train, &backend, opt.model(),
                                             StepParts{true, false});
        first_plan_ = plan_memory(first_->program());
    }
    if (k > 2) {
        mid_ = std::make_unique<TrainStep>(cfg, opt.B, opt.T, StepMode::train, &backend, opt.model(),
                                           StepParts{false, false});
        mid_plan_ = plan_memory(mid_->program());
    }
    if (opt.with_eval) {
        eval_ = std::make_unique<TrainStep>(cfg, opt.B, opt.T, StepMode::eval, &backend, opt.model());
        eval_plan_ = plan_memory(eval_->program());
    }
    if (opt.budget > 0)
        check_budget(planned_reserved(), opt.budget,
                     "lower --batch or --seq (activations grow with both), or pick a smaller --model");
    train_mem_ = std::make_unique<StepMemory>(train_->program(), train_plan_, ledger_, host_allocator(), opt.checking);
    auto shared = [&](const TrainStep & s, const MemoryPlan & p) {
        return std::make_unique<StepMemory>(s.program(), p, ledger_, host_allocator(), opt.checking, train_mem_.get());
    };
    if (first_) first_mem_ = shared(*first_, first_plan_);
    if (mid_) mid_mem_ = shared(*mid_, mid_plan_);
    if (eval_) eval_mem_ = shared(*eval_, eval_plan_);
}

Engine::~Engine() = default;

std::vector<std::pair<const TrainStep *, const MemoryPlan *>> Engine::secondary() const {
    std::vector<std::pair<const TrainStep *, const MemoryPlan *>> out;
    if (first_) out.push_back({first_.get(), &first_plan_});
    if (mid_) out.push_back({mid_.get(), &mid_plan_});
    if (eval_) out.push_back({eval_.get(), &eval_plan_});
    return out;
}

CategoryBytes Engine::planned_reserved() const {
    // A secondary program runs inside the training arena when it fits, else in its own.
    CategoryBytes r = train_plan_.reserved;
    for (const auto & [step, plan] : secondary())
        for (size_t c = 0; c < kCategoryCount; ++c)
            if (plan->transient.v[c] > train_plan_.transient.v[c]) r.v[c] += plan->transient.v[c];
    return r;
}

CategoryBytes Engine::planned_peak_live() const {
    // Secondary programs run on the training program's persistent buffers, so their live bytes
    // at any op are the shared persistent bytes plus their own transients.
    CategoryBytes r = train_plan_.peak_live;
    for (const auto & [step, plan] : secondary())
        for (size_t c = 0; c < kCategoryCount; ++c) {
            const uint64_t live = plan->peak_live.v[c] - plan->persistent_live.v[c] + train_plan_.persistent_live.v[c];
            r.v[c] = std::max(r.v[c], live);
        }
    return r;
}

float * Engine::params() { return static_cast<float *>(train_mem_->base(train_->params)); }
float * Engine::grads() { return static_cast<float *>(train_mem_->base(train_->grads)); }
float * Engine::adam_m() { return static_cast<float *>(train_mem_->base(train_->adam_m)); }
float * Engine::adam_v() { return static_cast<float *>(train_mem_->base(train_->adam_v)); }

void Engine::init_params(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    float * p = params();
    const float proj_std = 0.02f / std::sqrt(2.0f * float(cfg_.n_layer));
    for (const auto & info : train_->layout().params) {
        float * w = p + info.offset;
        const std::string & n = info.name;
        if (n.ends_with(".bias")) {
            std::memset(w, 0, info.numel * sizeof(float));
        } else if (n.find("ln_") != std::string::npos) {
            for (size_t i = 0; i < info.numel; ++i) w[i] = 1.0f;
        } else {
            const float sd = n.ends_with("c_proj.weight") ? proj_std : 0.02f;
            for (size_t i = 0; i < info.numel; ++i) w[i] = sd * normal(rng);
        }
    }
    std::memset(adam_m(), 0, train_->layout().total * sizeof(float));
    std::memset(adam_v(), 0, train_->layout().total * sizeof(float));
    t_ = 0;
}

void Engine::execute(const TrainStep & step, StepMemory & mem, const StepScalars & s) {
    Graph g(step.program(), mem, backend_);
    if (timeline_ && &step == train_.get()) {
        timeline_->program = "train";
        timeline_->events.clear();
        timeline_->origin_s = 0;
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

double Engine::run_batch(const TrainStep & step, StepMemory & mem, const int32_t * inputs, const int32_t * targets,
                         float dloss, const AdamWHyper * h) {
    const size_t BT = size_t(step.B()) * size_t(step.T());
    std::memcpy(mem.base(step.tokens), inputs, BT * 4);
    std::memcpy(mem.base(step.targets), targets, BT * 4);
    StepScalars s;
    s.dloss = dloss;
    if (h) s.adamw = *h;
    execute(step, mem, s);
    const float * l = static_cast<const float *>(mem.base(step.losses));
    double sum = 0;
    for (size_t i = 0; i < BT; ++i) sum += l[i];
    return sum;
}

StepResult Engine::train_step(const int32_t * inputs, const int32_t * targets, const AdamWHyper & h) {
    const int k = opt_.grad_accum;
    const size_t BT = size_t(opt_.B) * size_t(opt_.T);
    StepResult r;
    r.tokens = count_targets(inputs, targets, BT * size_t(k));
    // Every micro-batch's loss gradient is scaled by the whole step's token count, so the
    // accumulated gradients are those of one batch of k*B sequences.
    const float dloss = r.tokens > 0 ? 1.0f / float(r.tokens) : 0.0f;
    AdamWHyper hh = h;
    hh.t = ++t_;
    double sum = 0;
    for (int i = 0; i < k; ++i) {
        const int32_t * in = inputs + size_t(i) * BT;
        const int32_t * tg = targets + size_t(i) * BT;
        if (i == k - 1) sum += run_batch(*train_, *train_mem_, in, tg, dloss, &hh);
        else if (i == 0) sum += run_batch(*first_, *first_mem_, in, tg, dloss, nullptr);
        else sum += run_batch(*mid_, *mid_mem_, in, tg, dloss, nullptr);
    }
    r.loss = r.tokens > 0 ? float(sum / r.tokens) : 0.0f;
    r.grad_norm = std::sqrt(*static_cast<const float *>(train_mem_->base(train_->grad_norm_sq)));
    return r;
}

float Engine::eval_loss(const int32_t * inputs, const int32_t * targets) {
    MF_ASSERT(eval_ && "engine built without the evaluation program");
    const size_t BT = size_t(opt_.B) * size_t(opt_.T);
    const int valid = count_targets(inputs, targets, BT);
    const double sum = run_batch(*eval_, *eval_mem_, inputs, targets, 0.0f, nullptr);
    return valid > 0 ? float(sum / valid) : 0.0f;
}

std::vector<float> Engine::logits(const int32_t * inputs, int batch) {
    if (!fwd_ || fwd_batch_ != batch) {
        fwd_mem_.reset();
        fwd_batch_ = batch;
        fwd_ = std::make_unique<TrainStep>(cfg_, batch, opt_.T, StepMode::logits, &backend_, opt_.model());
        fwd_plan_ = plan_memory(fwd_->program());
        fwd_mem_ = std::make_unique<StepMemory>(fwd_->program(), fwd_plan_, ledger_, host_allocator(), opt_.checking,
                                                train_mem_.get());
    }
    const size_t BT = size_t(batch) * size_t(opt_.T);
    std::vector<int32_t> no_targets(BT, -100);
    count_targets(inputs, no_targets.data(), BT);
    run_batch(*fwd_, *fwd_mem_, inputs, no_targets.data(), 0.0f, nullptr);
    const float * l = static_cast<const float *>(fwd_mem_->base(fwd_->logits().buffer));
    return std::vector<float>(l, l + BT * size_t(cfg_.vocab_size));
}

}  // namespace memfit
