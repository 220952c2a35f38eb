#include "infer/decoder.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "backend/graph.h"
#include "backend/quant_format.h"
#include "core/error.h"
#include "train/split_weights.h"

namespace memfit {


struct Decoder::Pass {
    memfit::Program program;
    std::unique_ptr<Transformer> model;
    ModelWeights w;
    BufferId params = -1, qparams = -1, tokens = -1, workspace = -1;
    int n = 0;
    MemoryPlan plan;
    std::unique_ptr<StepMemory> memory;

    // n token rows; token_slots: the rows the tokens buffer holds (shared by every program).
    Pass(const ModelConfig & cfg, const ParamLayout & dense, const QuantLayout & q, int n_tokens, int token_slots,
         const ModelOptions & mo, const Backend & sizing) : n(n_tokens) {
        params = program.declare("parameters", Category::parameters, dense.total * dtype_size(mo.compute), true);
        if (q.bytes) qparams = program.declare("parameters.quantized", Category::parameters, q.bytes, true);
        tokens = program.declare("decode.tokens", Category::activations, size_t(token_slots) * 4, true);
        workspace = program.declare("workspace", Category::workspace, 0);
        model = std::make_unique<Transformer>(cfg, 1, n, program, mo);
        w = quantized_model_weights(cfg, q, params, mo.compute, qparams);
        Graph rec(program, &sizing);
        run(rec, 0);
        program.finalize();
        plan = plan_memory(program);
    }

    void run(Graph & g, int pos0) const {
        g.set_workspace(workspace);
        const Tensor t(tokens, DType::i32, {1, int64_t(n)});
        if (model->decode_meta().valid()) {   // paged: every matmul in equal calls of kRowTile rows
            g.set_row_tile(kRowTile);
            model->decode_paged(g, w, t);
        } else {
            model->decode(g, w, t, pos0);
        }
    }
};

ModelOptions Decoder::model_options() const {
    ModelOptions mo;
    mo.compute = compute_;
    mo.kv_capacity = paged_.enabled() ? capacity_ : rows_;
    mo.kv_full_capacity = full_rows_;
    mo.paged = paged_;
    return mo;
}

CategoryBytes Decoder::plan_paged(const ModelConfig & cfg, const Backend & sizing, PagedKv kv, int context,
                                  DType compute, const QuantLayout & quant) {
    MF_ASSERT(kv.tokens % kRowTile == 0 && kv.seqs % kRowTile == 0 && context >= 1);
    kv.max_blocks = (context + kv.block - 1) / kv.block;
    const ParamLayout dense = quant.entries.empty() ? make_param_layout(cfg) : memfit::dense_layout(cfg, quant);
    ModelOptions mo;
    mo.compute = compute;
    mo.kv_capacity = context;
    mo.paged = kv;
    // The smallest step owns the persistent buffers; the largest has the most transient bytes.
    const Pass small(cfg, dense, quant, kRowTile, kv.tokens, mo, sizing);
    if (kv.tokens == kRowTile) return shared_peak_live(small.plan, {});
    const Pass large(cfg, dense, quant, kv.tokens, kv.tokens, mo, sizing);
    return shared_peak_live(small.plan, {&large.plan});
}

int Decoder::token_slots() const { return paged_.enabled() ? paged_.tokens : capacity_; }

Decoder::Decoder(const ModelConfig & cfg, Backend & backend, int capacity, DType compute,
                 std::optional<QuantFormat> quant)
    : Decoder(cfg, backend, capacity, compute, quant ? make_quant_layout(cfg, *quant) : QuantLayout{}) {}

Decoder::Decoder(const ModelConfig & cfg, Backend & backend, int capacity, DType compute, const QuantLayout & quant)
    : cfg_(cfg), backend_(backend), capacity_(capacity), compute_(compute), layout_(make_param_layout(cfg)) {
    if (capacity < 1 || capacity > cfg.max_seq)
        throw ConfigError(fmt::format("generation context of {} tokens: must be between 1 and the model's {} positions",
                                      capacity, cfg.max_seq));
    // The sliding layers' caches a ring of the window's rows; Gemma 3's global layers keep them all.
    const int W = cfg.sliding_window;
    rows_ = W > 0 && capacity > W ? std::min(capacity, W + kPrefillChunk - 1) : capacity;
    full_rows_ = rows_ < capacity && cfg.sliding_pattern > 0 && cfg.sliding_pattern <= cfg.n_layer ? capacity : 0;
    quant_ = quant;
    dense_ = quant.entries.empty() ? layout_ : memfit::dense_layout(cfg, quant_);
    step_ = std::make_unique<Pass>(cfg_, dense_, quant_, 1, capacity_, model_options(), backend_);
    step_->memory = std::make_unique<StepMemory>(step_->program, step_->plan, ledger_, backend_.allocator());
}

Decoder::Decoder(const ModelConfig & cfg, Backend & backend, const PagedKv & kv, int context, DType compute,
                 const QuantLayout & quant)
    : cfg_(cfg), backend_(backend), capacity_(context), compute_(compute), layout_(make_param_layout(cfg)) {
    if (context < 1 || context > cfg.max_seq)
        throw ConfigError(fmt::format("generation context of {} tokens: must be between 1 and the model's {} positions",
                                      context, cfg.max_seq));
    MF_ASSERT(kv.block > 0 && kv.blocks > 0 && kv.seqs > 0 && kv.tokens > 0);
    MF_ASSERT(kv.tokens % kRowTile == 0 && kv.seqs % kRowTile == 0 && "paged steps run whole row tiles");
    paged_ = kv;
    paged_.max_blocks = (context + kv.block - 1) / kv.block;
    rows_ = capacity_;
    quant_ = quant;
    dense_ = quant.entries.empty() ? layout_ : memfit::dense_layout(cfg, quant_);
    step_ = std::make_unique<Pass>(cfg_, dense_, quant_, kRowTile, token_slots(), model_options(), backend_);
    step_->memory = std::make_unique<StepMemory>(step_->program, step_->plan, ledger_, backend_.allocator());
}

Decoder::~Decoder() = default;

void Decoder::set_weights(const float * params, const std::vector<uint8_t> * packed) {
    MF_ASSERT(!packed || packed->size() == quant_.bytes);
    Tensor dense(step_->params, compute_, {int64_t(dense_.total)});
    dense.data = step_->memory->base(step_->params);
    store_split_weights(backend_, cfg_, quant_, dense,
                        static_cast<uint8_t *>(step_->qparams >= 0 ? step_->memory->base(step_->qparams) : nullptr),
                        params, packed ? packed->data() : nullptr);
}

std::vector<float> Decoder::weights() const {
    Tensor dense(step_->params, compute_, {int64_t(dense_.total)});
    dense.data = step_->memory->base(step_->params);
    return load_split_weights(
        backend_, cfg_, quant_, dense,
        static_cast<const uint8_t *>(step_->qparams >= 0 ? step_->memory->base(step_->qparams) : nullptr));
}

uint64_t Decoder::weight_bytes() const { return uint64_t(dense_.total * dtype_size(compute_) + quant_.bytes); }

Decoder::Pass & Decoder::program_for(int n) {
    if (n == step_->n) return *step_;
    auto it = prefill_.find(n);
    if (it != prefill_.end()) return *it->second;
    auto p = std::make_unique<Pass>(cfg_, dense_, quant_, n, token_slots(), model_options(), backend_);
    p->memory = std::make_unique<StepMemory>(p->program, p->plan, ledger_, backend_.allocator(), false,
                                             step_->memory.get());
    return *prefill_.emplace(n, std::move(p)).first->second;
}

const float * Decoder::run(Pass & p, const int32_t * tokens, int pos0) {
    for (int i = 0; i < p.n; ++i)
        if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
            throw FormatError(fmt::format("token {} is outside the vocabulary of {}", tokens[i], cfg_.vocab_size));
    backend_.upload(p.memory->base(p.tokens), tokens, size_t(p.n) * 4);   // a memcpy on the CPU
    Graph g(p.program, *p.memory, backend_);
    p.run(g, pos0);
    MF_ASSERT(g.ops_issued() == p.program.num_ops());
    const auto * logits = static_cast<const float *>(p.memory->base(p.model->logits().buffer));
    if (backend_.host_memory()) return logits;
    logits_.resize(size_t(p.model->logits().numel()));   // a device's logits, read back (synchronizes)
    backend_.download(logits_.data(), logits, logits_.size() * sizeof(float));
    return logits_.data();
}

int Decoder::step_rows(int rows) const {
    MF_ASSERT(paged_.enabled() && rows >= 1 && rows <= paged_.tokens);
    int t = 1;   // row tiles: 1, 2, 3, 4, 6, 8, 12, 16, 24, ...
    while (t * kRowTile < rows) t = t < 2 ? t + 1 : t % 3 == 0 ? t / 3 * 4 : t / 2 * 3;
    return std::min(t * kRowTile, paged_.tokens);
}

const float * Decoder::run_paged(const std::vector<int32_t> & tokens, const std::vector<int32_t> & meta) {
    const int n = int(tokens.size());
    MF_ASSERT(paged_.enabled() && int64_t(meta.size()) == paged_.meta_words());
    MF_ASSERT(n > 0 && n % kRowTile == 0 && n <= paged_.tokens);
    Pass & p = program_for(n);
    backend_.upload(p.memory->base(p.model->decode_meta().buffer), meta.data(), meta.size() * 4);
    return run(p, tokens.data(), 0);
}

const float * Decoder::prefill(const std::vector<int32_t> & tokens) {
    MF_ASSERT(!paged_.enabled() && "a paged decoder runs steps (run_paged)");
    const int n = int(tokens.size());
    if (n < 1 || n > capacity_)
        throw ConfigError(fmt::format("a prompt of {} tokens: the generation context holds 1 to {}", n, capacity_));
    // A rolling cache takes the prompt in chunks that fit it beside the window (decoder.h).
    const int chunk = rows_ < capacity_ ? kPrefillChunk : n;
    const float * l = nullptr;
    for (int p0 = 0; p0 < n; p0 += chunk) {
        const int len = std::min(chunk, n - p0);
        l = run(program_for(len), tokens.data() + p0, p0);
    }
    pos_ = n;
    return l;
}

const float * Decoder::step(int32_t token) {
    MF_ASSERT(!paged_.enabled() && "a paged decoder runs steps (run_paged)");
    MF_ASSERT(pos_ < capacity_ && "the KV cache is full: prefill again");
    const float * l = run(*step_, &token, pos_);
    ++pos_;
    return l;
}

CategoryBytes Decoder::planned_reserved() const {
    std::vector<const MemoryPlan *> others;
    for (const auto & [n, p] : prefill_) others.push_back(&p->plan);
    return shared_reserved(step_->plan, others);
}

CategoryBytes Decoder::planned_peak_live() const {
    std::vector<const MemoryPlan *> others;
    for (const auto & [n, p] : prefill_) others.push_back(&p->plan);
    return shared_peak_live(step_->plan, others);
}

uint64_t Decoder::kv_cache_bytes() const {
    uint64_t b = 0;
    for (const BufferDecl & d : step_->program.buffers())
        if (d.name.starts_with("kv_cache.")) b += d.bytes;
    return b;
}

}  // namespace memfit
