#include "infer/calibration.h"

#include <fmt/format.h>

#include "backend/graph.h"
#include "core/error.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "model/transformer.h"

namespace memfit {

struct LayerHessians::Impl {
    Program program;
    std::unique_ptr<Transformer> model;
    ModelWeights w;
    BufferId params = -1, input = -1, output = -1, workspace = -1;
    std::array<BufferId, 4> hess{-1, -1, -1, -1};
    std::array<int64_t, 4> in{0, 0, 0, 0};
    int layer = 0, B = 0, T = 0;
    MemoryPlan plan;
    std::unique_ptr<StepMemory> memory;
    size_t total = 0;

    int64_t C = 0;

    // Layer 0 embeds the tokens in `input`; a later one copies `input` into the stage's input.
    // The block's output is copied out to `output`.
    void record(Graph & g) const {
        g.set_workspace(workspace);
        const Tensor tokens(input, DType::i32, {int64_t(B), int64_t(T)});
        if (layer > 0) g.copy(model->input(), Tensor(input, DType::f32, {int64_t(B) * T, C}));
        model->forward(g, w, tokens);
        g.copy(Tensor(output, DType::f32, {int64_t(B) * T, C}), model->output());
    }
};

LayerHessians::LayerHessians(const ModelConfig & cfg, Backend & backend, int layer, int batch, int seq)
    : impl_(std::make_unique<Impl>()), backend_(backend) {
    if (layer < 0 || layer >= cfg.n_layer || batch < 1 || seq < 1 || seq > cfg.max_seq)
        throw ConfigError(fmt::format("calibration: layer {} of {}, {} rows of {} tokens (the model holds {} "
                                      "positions)", layer, cfg.n_layer, batch, seq, cfg.max_seq));
    Impl & m = *impl_;
    m.layer = layer, m.B = batch, m.T = seq;
    const ParamLayout layout = make_param_layout(cfg);
    m.total = layout.total;
    m.params = m.program.declare("parameters", Category::parameters, layout.total * 4, true);
    m.C = cfg.n_embd;
    const size_t rows = size_t(batch) * size_t(seq);
    m.input = m.program.declare("calibration.input", Category::activations, rows * (layer > 0 ? size_t(m.C) : 1) * 4, true);
    m.output = m.program.declare("calibration.output", Category::activations, rows * size_t(m.C) * 4, true);
    m.workspace = m.program.declare("workspace", Category::workspace, 0);
    const QuantLayout shapes = make_quant_layout(cfg, QuantFormat::int8);   // the projections' [out, in]
    for (int p = 0; p < 4; ++p) {
        m.in[size_t(p)] = shapes.find(layer, Proj(p))->q.in;
        const size_t n = size_t(m.in[size_t(p)]);
        m.hess[size_t(p)] = m.program.declare(fmt::format("gptq.hessian.{}", p), Category::workspace, n * n * 4, true);
    }
    ModelOptions mo;
    mo.compute = mo.grad = DType::f32;
    mo.layer_begin = layer;   // one block, as a pipeline stage runs it (layer 0 with the embedding)
    mo.layer_end = layer + 1;
    m.model = std::make_unique<Transformer>(cfg, batch, seq, m.program, mo);
    m.w = quantized_model_weights(cfg, QuantLayout{}, m.params, DType::f32, -1);
    m.model->set_projection_tap([&m](Graph & g, int l, Proj proj, Tensor inp) {
        if (l != m.layer) return;
        const Tensor x = inp.view(0, {inp.rows(), inp.cols()});
        const Tensor h(m.hess[size_t(proj)], DType::f32, {x.cols(), x.cols()});
        g.matmul_bwd(Tensor{}, h, Tensor{}, x, x, h, WeightLayout::out_in);   // h += x^T x
    });
    Graph rec(m.program, &backend);
    m.record(rec);
    m.program.finalize();
    m.plan = plan_memory(m.program);
    m.memory = std::make_unique<StepMemory>(m.program, m.plan, ledger_, backend.allocator());
    reset();
}

LayerHessians::~LayerHessians() = default;

void LayerHessians::set_weights(const float * params) {
    backend_.upload(impl_->memory->base(impl_->params), params, impl_->total * 4);
}

std::vector<float> LayerHessians::run(const int32_t * tokens) {
    MF_ASSERT(impl_->layer == 0 && "layer 0 runs on tokens, later layers on the residual stream");
    return execute(tokens, size_t(impl_->B) * size_t(impl_->T) * 4);
}

std::vector<float> LayerHessians::run(const float * hidden) {
    MF_ASSERT(impl_->layer > 0 && "layer 0 runs on tokens, later layers on the residual stream");
    return execute(hidden, size_t(impl_->B) * size_t(impl_->T) * size_t(impl_->C) * 4);
}

std::vector<float> LayerHessians::execute(const void * input, size_t bytes) {
    Impl & m = *impl_;
    backend_.upload(m.memory->base(m.input), input, bytes);
    Graph g(m.program, *m.memory, backend_);
    m.record(g);
    MF_ASSERT(g.ops_issued() == m.program.num_ops());
    rows_ += int64_t(m.B) * m.T;
    std::vector<float> out(size_t(m.B) * size_t(m.T) * size_t(m.C));
    backend_.download(out.data(), m.memory->base(m.output), out.size() * 4);
    return out;
}

std::vector<double> LayerHessians::hessian(int proj) const {
    const Impl & m = *impl_;
    const size_t n = size_t(m.in[size_t(proj)]);
    std::vector<float> h(n * n);
    backend_.download(h.data(), m.memory->base(m.hess[size_t(proj)]), h.size() * 4);
    return {h.begin(), h.end()};
}

void LayerHessians::reset() {
    const Impl & m = *impl_;
    for (const BufferId h : m.hess) {
        const std::vector<float> zero(m.program.buffer(h).bytes / 4, 0.0f);
        backend_.upload(m.memory->base(h), zero.data(), zero.size() * 4);
    }
}

int LayerHessians::layer() const { return impl_->layer; }

CategoryBytes LayerHessians::planned_peak_live() const { return impl_->plan.peak_live; }

}  // namespace memfit
