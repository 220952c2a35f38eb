#include "train/engine.h"

#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "memory/budget.h"

namespace memfit {

Engine::Engine(const ModelConfig & cfg, Backend & backend, const EngineOptions & opt)
    : cfg_(cfg), backend_(backend), opt_(opt) {
    train_ = std::make_unique<TrainStep>(cfg, opt.B, opt.T, StepMode::train, &backend, opt.model());
    train_plan_ = plan_memory(train_->program());
    if (opt.with_eval) {
        eval_ = std::make_unique<TrainStep>(cfg, opt.B, opt.T, StepMode::eval, &backend, opt.model());
        eval_plan_ = plan_memory(eval_->program());
    }
    if (opt.budget > 0)
        check_budget(planned_reserved(), opt.budget,
                     "lower --batch or --seq (activations grow with both), or pick a smaller --model");
    train_mem_ = std::make_unique<StepMemory>(train_->program(), train_plan_, ledger_, host_allocator(), opt.checking);
    if (eval_)
        eval_mem_ = std::make_unique<StepMemory>(eval_->program(), eval_plan_, ledger_, host_allocator(), opt.checking,
                                                 train_mem_.get());
}

Engine::~Engine() = default;

CategoryBytes Engine::planned_reserved() const {
    CategoryBytes r = train_plan_.reserved;
    if (eval_) {
        for (size_t c = 0; c < kCategoryCount; ++c)
            if (eval_plan_.transient.v[c] > train_plan_.transient.v[c]) r.v[c] += eval_plan_.transient.v[c];
    }
    return r;
}

CategoryBytes Engine::planned_peak_live() const {
    // The evaluation program runs on the training program's persistent buffers, so its live
    // bytes at any op are the shared persistent bytes plus its own transients.
    CategoryBytes r = train_plan_.peak_live;
    if (eval_)
        for (size_t c = 0; c < kCategoryCount; ++c) {
            const uint64_t eval_live = eval_plan_.peak_live.v[c] - eval_plan_.persistent_live.v[c] +
                                       train_plan_.persistent_live.v[c];
            r.v[c] = std::max(r.v[c], eval_live);
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

float Engine::run_forward_loss(const TrainStep & step, StepMemory & mem, const int32_t * inputs,
                               const int32_t * targets, StepResult * out, const AdamWHyper * h) {
    const size_t BT = size_t(step.B()) * size_t(step.T());
    int valid = 0;
    for (size_t i = 0; i < BT; ++i) {
        if (targets[i] == -100) continue;
        if (targets[i] < 0 || targets[i] >= cfg_.vocab_size)
            throw FormatError(fmt::format("target {} at position {} is outside the vocabulary of {}", targets[i], i,
                                          cfg_.vocab_size));
        ++valid;
    }
    for (size_t i = 0; i < BT; ++i)
        if (inputs[i] < 0 || inputs[i] >= cfg_.vocab_size)
            throw FormatError(fmt::format("token {} at position {} is outside the vocabulary of {}", inputs[i], i,
                                          cfg_.vocab_size));
    std::memcpy(mem.base(step.tokens), inputs, BT * 4);
    std::memcpy(mem.base(step.targets), targets, BT * 4);
    StepScalars s;
    s.dloss = valid > 0 ? 1.0f / float(valid) : 0.0f;
    if (h) s.adamw = *h;
    execute(step, mem, s);
    const float * l = static_cast<const float *>(mem.base(step.losses));
    double sum = 0;
    for (size_t i = 0; i < BT; ++i) sum += l[i];
    const float loss = valid > 0 ? float(sum / valid) : 0.0f;
    if (out) {
        out->loss = loss;
        out->tokens = valid;
    }
    return loss;
}

StepResult Engine::train_step(const int32_t * inputs, const int32_t * targets, const AdamWHyper & h) {
    StepResult r;
    AdamWHyper hh = h;
    hh.t = ++t_;
    run_forward_loss(*train_, *train_mem_, inputs, targets, &r, &hh);
    r.grad_norm = std::sqrt(*static_cast<const float *>(train_mem_->base(train_->grad_norm_sq)));
    return r;
}

float Engine::eval_loss(const int32_t * inputs, const int32_t * targets) {
    MF_ASSERT(eval_ && "engine built without the evaluation program");
    return run_forward_loss(*eval_, *eval_mem_, inputs, targets, nullptr, nullptr);
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
    run_forward_loss(*fwd_, *fwd_mem_, inputs, no_targets.data(), nullptr, nullptr);
    const float * l = static_cast<const float *>(fwd_mem_->base(fwd_->logits().buffer));
    return std::vector<float>(l, l + BT * size_t(cfg_.vocab_size));
}

}  // namespace memfit
