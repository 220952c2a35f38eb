#include "backend/graph.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/collectives.h"
#include "memory/budget.h"
#include "memory/step_memory.h"
#include "memory/timeline.h"

namespace memfit {

namespace {

// The gemms one matmul op runs, by layout (C[M,N] = op(A)[M,K] op(B)[K,N], see GemmDesc).
GemmDesc desc(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool acc, bool bias, const Tensor & c,
              const Tensor & a, const Tensor & b) {
    GemmDesc d{M, N, K, ta, tb, acc, bias};
    d.a = a.dtype;
    d.b = b.dtype;
    d.c = c.dtype;
    return d;
}
GemmDesc fwd_desc(const Tensor & out, const Tensor & inp, const Tensor & w, WeightLayout l, bool bias) {
    return desc(inp.rows(), out.cols(), inp.cols(), false, l == WeightLayout::out_in, false, bias, out, inp, w);
}
GemmDesc bwd_data_desc(const Tensor & dinp, const Tensor & dout, const Tensor & w, WeightLayout l) {
    // dinp[M,K] = dout[M,N] . W^T
    return desc(dout.rows(), dinp.cols(), dout.cols(), false, l == WeightLayout::in_out, false, false, dinp, dout, w);
}
GemmDesc bwd_weight_desc(const Tensor & dw, const Tensor & dout, const Tensor & inp, WeightLayout l) {
    // in_out: dW[K,N] += inp^T . dout;  out_in: dW[N,K] += dout^T . inp
    const int64_t M = inp.rows(), K = inp.cols(), N = dout.cols();
    if (l == WeightLayout::in_out) return desc(K, N, M, true, false, true, false, dw, inp, dout);
    return desc(N, K, M, true, false, true, false, dw, dout, inp);
}

double bytes_of(std::span<const Tensor> ts) {
    double b = 0;
    for (const auto & t : ts) if (t.valid()) b += double(t.nbytes());
    return b;
}

}  // namespace

Graph::Graph(Program & program, const Backend * sizing)
    : program_(&program), sizing_(sizing), recording_(true) {}

Graph::Graph(const Program & program, StepMemory & memory, Backend & backend)
    : exec_program_(&program), memory_(&memory), backend_(&backend), recording_(false) {}

Graph::~Graph() = default;

bool Graph::begin(const char * name, double flops, std::span<const Tensor> uses, bool workspace) {
    if (recording_) {
        OpRecord op;
        op.name = name;
        op.phase = phase_;
        op.layer = layer_;
        op.flops = flops;
        op.bytes = bytes_of(uses);
        op.uses.reserve(uses.size() + (workspace ? 1 : 0));
        for (const auto & t : uses) {
            if (!t.valid() || t.buffer < 0) continue;
            const BufferId b = aliased(t.buffer);
            if (std::find(op.uses.begin(), op.uses.end(), b) == op.uses.end()) op.uses.push_back(b);
        }
        if (workspace) {
            MF_ASSERT(workspace_ >= 0 && "set_workspace() before ops that need scratch");
            op.uses.push_back(workspace_);
        }
        program_->record(std::move(op));
        return false;
    }
    MF_ASSERT(next_op_ < exec_program_->num_ops() && "step issued more ops than were recorded");
    MF_ASSERT(std::strcmp(exec_program_->ops()[size_t(next_op_)].name, name) == 0 &&
              "step issued a different op than was recorded");
    if (!updating_ && phase_ == Phase::optimizer) {   // from the first update on, the step completes
        updating_ = true;
        skip_update_ = skip_ask_ && (*skip_ask_)();
    }
    if (cancel_ && !updating_ && (*cancel_)()) throw StepAbandoned{};
    try {
        memory_->begin_op(next_op_);
    } catch (const OutOfMemory &) {
        // The picture at the failure: the op that could not start, with the bytes held then.
        if (timeline_) {
            record_event(name);
            timeline_->events.back().end_us = timeline_->events.back().begin_us;
            timeline_->failed_op = next_op_;
        }
        throw;
    }
    // Transfers in flight advance between ops (OpenMPI 4.1 has no progress thread).
    for (auto & r : pending_)
        if (r) r->poll();
    if (timeline_) record_event(name);
    return true;
}

void Graph::record_event(const char * name) {
    TimelineEvent e;
    e.op = next_op_;
    e.name = name;
    e.phase = phase_;
    e.layer = layer_;
    e.live = memory_->ledger().live();
    e.begin_us = now_us();
    timeline_->events.push_back(e);
}

double Graph::now_us() const {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (timeline_->origin_s == 0) timeline_->origin_s = s;
    return (s - timeline_->origin_s) * 1e6;
}

void Graph::end() {
    if (!recording_) {
        if (timeline_) {
            // A device runs the op's kernels after the launch returns: wait for them, so that the
            // event spans the op's work, not its launch (the timeline's step is that much slower).
            if (!backend_->host_memory()) backend_->synchronize();
            timeline_->events.back().end_us = now_us();
        }
        memory_->end_op(next_op_);
    }
    ++next_op_;
}

Tensor Graph::resolve(Tensor t) const {
    if (!t.valid() || t.buffer < 0) return t;
    char * base = static_cast<char *>(memory_->base(aliased(t.buffer)));
    MF_ASSERT((base || t.nbytes() == 0) && "tensor used outside its buffer's lifetime");
    t.data = base ? base + t.offset : nullptr;
    return t;
}

void Graph::grow_workspace(size_t bytes) {
    MF_ASSERT(workspace_ >= 0 && "set_workspace() before ops that need scratch");
    program_->grow(workspace_, bytes);
}

Tensor Graph::workspace_tensor(size_t bytes) const {
    if (bytes == 0) return Tensor{};
    return resolve(Tensor(workspace_, DType::u8, {int64_t(bytes)}));
}

void Graph::fill_zero(Tensor t) {
    if (begin("fill_zero", 0, {t})) backend_->fill_zero(resolve(t));
    end();
}

void Graph::matmul_fwd(Tensor out, Tensor inp, Tensor w, Tensor bias, WeightLayout layout) {
    const int64_t M = inp.rows(), K = inp.cols(), N = out.cols();
    if (row_tile_ > 0 && M > row_tile_) {   // set_row_tile: equal calls of row_tile_ rows
        MF_ASSERT(M % row_tile_ == 0 && out.rows() == M);
        for (int64_t r = 0; r < M; r += row_tile_)
            matmul_fwd(out.view(r * N, {row_tile_, N}), inp.view(r * K, {row_tile_, K}), w, bias, layout);
        return;
    }
    MF_ASSERT(out.rows() == M && w.numel() == K * N);
    const GemmDesc d = fwd_desc(out, inp, w, layout, bias.valid());
    if (recording_) grow_workspace(sizing_ ? sizing_->gemm_workspace(d) : 0);
    if (begin("matmul_fwd", 2.0 * M * K * N, {out, inp, w, bias}, true)) {
        const size_t ws = backend_->gemm_workspace(d);
        backend_->gemm(d, resolve(out), resolve(inp), resolve(w), resolve(bias), workspace_tensor(ws));
    }
    end();
}

// dout's rows rounded to bf16 in place and read strided by both products, where the backend
// multiplies them natively (the same answer recording and executing).
namespace {
void bf16_dout_descs(GemmDesc & dd, GemmDesc & dwd, int64_t N) {
    dd.a = dwd.a = DType::bf16;
    dd.lda = dwd.lda = 2 * N;
}
}  // namespace

bool Graph::rounds_dout(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, WeightLayout layout,
                        bool acc_dinp) const {
    const Backend * be = recording_ ? sizing_ : backend_;
    if (!be || layout != WeightLayout::out_in || dout.dtype != DType::f32) return false;
    GemmDesc dd = dinp.valid() ? bwd_data_desc(dinp, dout, w, layout) : GemmDesc{};
    dd.accumulate = acc_dinp;
    GemmDesc dwd = dw.valid() ? bwd_weight_desc(dw, dout, inp, layout) : GemmDesc{};
    bf16_dout_descs(dd, dwd, dout.cols());
    return (!dinp.valid() || be->native_gemm(dd)) && (!dw.valid() || be->native_gemm(dwd));
}

void Graph::matmul_bwd(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, WeightLayout layout,
                       bool acc_dinp, DoutBf16 round_dout) {
    const int64_t M = dout.rows(), K = w.numel() / dout.cols(), N = dout.cols();
    const bool frozen = !dw.valid();
    MF_ASSERT(w.numel() == K * N && (frozen || (inp.rows() == M && dw.numel() == K * N)));
    MF_ASSERT(!frozen || (dinp.valid() && !dbias.valid()));
    GemmDesc dd = dinp.valid() ? bwd_data_desc(dinp, dout, w, layout) : GemmDesc{};
    dd.accumulate = acc_dinp;
    GemmDesc dwd = frozen ? GemmDesc{} : bwd_weight_desc(dw, dout, inp, layout);
    const bool rounded = round_dout != DoutBf16::keep && !dbias.valid() && rounds_dout(dinp, dw, dout, inp, w, layout, acc_dinp);
    MF_ASSERT(round_dout != DoutBf16::rounded || rounded);
    if (rounded) bf16_dout_descs(dd, dwd, N);
    if (recording_ && sizing_)
        grow_workspace(std::max(dinp.valid() ? sizing_->gemm_workspace(dd) : 0,
                                frozen ? 0 : sizing_->gemm_workspace(dwd)));
    const double flops = (dinp.valid() ? 2.0 : 0.0) * M * K * N + (frozen ? 0.0 : 2.0) * M * K * N;
    if (begin("matmul_bwd", flops, {dinp, dw, dbias, dout, frozen ? Tensor{} : inp, w}, true)) {
        Tensor rdout = resolve(dout), rw = resolve(w);
        if (rounded) {
            if (round_dout == DoutBf16::round) backend_->round_bf16_rows(rdout);
            rdout.dtype = DType::bf16;   // the same bytes: [M, 2N] bf16, the first N columns read
            rdout.ndim = 2, rdout.shape[0] = M, rdout.shape[1] = 2 * N;
        }
        if (dinp.valid())
            backend_->gemm(dd, resolve(dinp), rdout, rw, Tensor{}, workspace_tensor(backend_->gemm_workspace(dd)));
        if (!frozen) {
            Tensor rinp = resolve(inp);
            if (layout == WeightLayout::in_out)
                backend_->gemm(dwd, resolve(dw), rinp, rdout, Tensor{}, workspace_tensor(backend_->gemm_workspace(dwd)));
            else
                backend_->gemm(dwd, resolve(dw), rdout, rinp, Tensor{}, workspace_tensor(backend_->gemm_workspace(dwd)));
        }
        if (dbias.valid()) backend_->bias_grad(resolve(dbias), rdout);
    }
    end();
}

void Graph::qmatmul_fwd(Tensor out, Tensor inp, const QWeight & w, Tensor bias) {
    const int64_t M = inp.rows();
    if (row_tile_ > 0 && M > row_tile_) {   // set_row_tile
        MF_ASSERT(M % row_tile_ == 0 && out.rows() == M);
        for (int64_t r = 0; r < M; r += row_tile_)
            qmatmul_fwd(out.view(r * w.q.out, {row_tile_, w.q.out}), inp.view(r * w.q.in, {row_tile_, w.q.in}), w, bias);
        return;
    }
    MF_ASSERT(inp.cols() == w.q.in && out.cols() == w.q.out && out.rows() == M);
    if (recording_) grow_workspace(sizing_ ? sizing_->qgemm_workspace(w.q, M, inp.dtype) : 0);
    if (begin("qmatmul_fwd", 2.0 * double(M) * double(w.q.in) * double(w.q.out), {out, inp, w.packed, bias}, true))
        backend_->qgemm_fwd(w.q, resolve(out), resolve(inp), resolve(w.packed), resolve(bias),
                            workspace_tensor(backend_->qgemm_workspace(w.q, M, inp.dtype)));
    end();
}

void Graph::qmatmul_bwd(Tensor dinp, Tensor dout, const QWeight & w, bool acc_dinp) {
    const int64_t M = dout.rows();
    MF_ASSERT(dinp.cols() == w.q.in && dout.cols() == w.q.out && dinp.rows() == M);
    if (recording_) grow_workspace(sizing_ ? sizing_->qgemm_workspace(w.q, M, dout.dtype) : 0);
    if (begin("qmatmul_bwd", 2.0 * double(M) * double(w.q.in) * double(w.q.out), {dinp, dout, w.packed}, true))
        backend_->qgemm_bwd(w.q, resolve(dinp), resolve(dout), resolve(w.packed), acc_dinp,
                            workspace_tensor(backend_->qgemm_workspace(w.q, M, dout.dtype)));
    end();
}

void Graph::add_columns(Tensor out, Tensor d, int64_t col0, float scale) {
    MF_ASSERT(out.rows() == d.rows() && col0 >= 0 && col0 + d.cols() <= out.cols());
    if (begin("add_columns", 2.0 * double(d.numel()), {out, d})) backend_->add_columns(resolve(out), resolve(d), col0, scale);
    end();
}

void Graph::dropout(Tensor out, Tensor in, float p, uint64_t salt) {
    MF_ASSERT(out.numel() == in.numel());
    if (begin("dropout", 2.0 * double(in.numel()), {out, in}))
        backend_->dropout(resolve(out), resolve(in), p, seed_ ^ (salt * 0xd1342543de82ef95ull));
    end();
}

void Graph::scale(Tensor t, float s) {
    const Tensor m = t.view(0, {t.numel() / t.cols(), t.cols()});
    take_columns(m, m, 0, s);
}

void Graph::take_columns(Tensor d, Tensor src, int64_t col0, float scale) {
    MF_ASSERT(src.rows() == d.rows() && col0 >= 0 && col0 + d.cols() <= src.cols());
    if (begin("take_columns", double(d.numel()), {d, src})) backend_->take_columns(resolve(d), resolve(src), col0, scale);
    end();
}

void Graph::dora_norm(Tensor norm, Tensor w, WeightLayout layout, int64_t col0, Tensor a, Tensor b, float scale) {
    MF_ASSERT(norm.numel() == b.dim(0) && a.dim(0) == b.dim(1));
    const double rows = double(b.dim(0)), in = double(a.dim(1)), r = double(a.dim(0));
    if (begin("dora_norm", rows * in * (2.0 * r + 2.0), {norm, w, a, b}))
        backend_->dora_norm(resolve(norm), resolve(w), layout == WeightLayout::in_out, col0, resolve(a), resolve(b), scale);
    end();
}

void Graph::dora_norm_packed(Tensor norm, const QWeight & w, int64_t col0, Tensor a, Tensor b, float scale) {
    MF_ASSERT(norm.numel() == b.dim(0) && a.dim(0) == b.dim(1) && a.dim(1) == w.q.in);
    const int64_t cols = b.dim(0);
    if (recording_) grow_workspace(sizing_ ? sizing_->dora_norm_workspace(w.q, cols) : 0);
    const double in = double(w.q.in), r = double(a.dim(0));
    if (begin("dora_norm_packed", double(cols) * in * (2.0 * r + 3.0), {norm, w.packed, a, b}, true))
        backend_->dora_norm_packed(resolve(norm), w.q, resolve(w.packed), col0, resolve(a), resolve(b), scale,
                                   workspace_tensor(backend_->dora_norm_workspace(w.q, cols)));
    end();
}

void Graph::dora_scale_fwd(Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0) {
    MF_ASSERT(z.rows() == out.rows() && z.cols() == mag.numel() && col0 + z.cols() <= out.cols());
    if (begin("dora_scale_fwd", 3.0 * double(z.numel()), {out, z, bias, mag, norm}))
        backend_->dora_scale_fwd(resolve(out), resolve(z), resolve(bias), resolve(mag), resolve(norm), col0);
    end();
}

void Graph::dora_scale_bwd(Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0) {
    MF_ASSERT(z.rows() == dout.rows() && z.cols() == mag.numel() && col0 + z.cols() <= dout.cols());
    if (begin("dora_scale_bwd", 3.0 * double(z.numel()), {dout, dmag, z, mag, norm}))
        backend_->dora_scale_bwd(resolve(dout), resolve(dmag), resolve(z), resolve(mag), resolve(norm), col0);
    end();
}

void Graph::copy(Tensor dst, Tensor src) {
    MF_ASSERT(dst.numel() == src.numel());
    if (begin("copy", 0.0, {dst, src})) backend_->copy(resolve(dst), resolve(src));
    end();
}

void Graph::encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start) {
    if (begin("encoder_fwd", double(out.numel()), {out, tokens, wte, wpe, doc_start}))
        backend_->encoder_fwd(resolve(out), resolve(tokens), resolve(wte), resolve(wpe), resolve(doc_start));
    end();
}

void Graph::encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start) {
    if (begin("encoder_bwd", 2.0 * double(dout.numel()), {dwte, dwpe, dout, tokens, doc_start}))
        backend_->encoder_bwd(resolve(dwte), resolve(dwpe), resolve(dout), resolve(tokens), resolve(doc_start));
    end();
}

void Graph::vocab_encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo) {
    if (begin("vocab_encoder_fwd", double(out.numel()), {out, tokens, wte, wpe}))
        backend_->vocab_encoder_fwd(resolve(out), resolve(tokens), resolve(wte), resolve(wpe), vocab_lo);
    end();
}

void Graph::vocab_encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo) {
    if (begin("vocab_encoder_bwd", 2.0 * double(dout.numel()), {dwte, dwpe, dout, tokens}))
        backend_->vocab_encoder_bwd(resolve(dwte), resolve(dwpe), resolve(dout), resolve(tokens), vocab_lo);
    end();
}

void Graph::layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
    if (begin("layernorm_fwd", 8.0 * double(inp.numel()), {out, mean, rstd, inp, w, b}))
        backend_->layernorm_fwd(resolve(out), resolve(mean), resolve(rstd), resolve(inp), resolve(w), resolve(b), eps);
    end();
}

void Graph::layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean, Tensor rstd) {
    if (begin("layernorm_bwd", 14.0 * double(inp.numel()), {dinp, dw, db, dout, inp, w, mean, rstd}))
        backend_->layernorm_bwd(resolve(dinp), resolve(dw), resolve(db), resolve(dout), resolve(inp), resolve(w),
                                resolve(mean), resolve(rstd));
    end();
}

// Causal attention work: for each (b, h) and query t, t+1 keys; QK^T and AV each 2*hs flops.
static double attention_flops(const Tensor & qkv) {
    const double B = double(qkv.dim(0)), T = double(qkv.dim(1)), C = double(qkv.dim(2)) / 3.0;
    return 4.0 * B * (T * (T + 1) / 2.0) * C;
}

void Graph::attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start) {
    if (begin("attention_fwd", attention_flops(qkv), {out, att, qkv, doc_start}))
        backend_->attention_fwd(resolve(out), resolve(att), resolve(qkv), NH, resolve(doc_start));
    end();
}

void Graph::attention_bwd(Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int NH, Tensor doc_start) {
    const size_t scratch = size_t(qkv.dim(0)) * size_t(NH) * size_t(qkv.dim(1)) * sizeof(float);
    if (recording_) grow_workspace(scratch);
    if (begin("attention_bwd", 2.0 * attention_flops(qkv), {dqkv, dout, qkv, att, doc_start}, true)) {
        Tensor ws = resolve(Tensor(workspace_, DType::f32, {int64_t(scratch / sizeof(float))}));
        backend_->attention_bwd(resolve(dqkv), ws, resolve(dout), resolve(qkv), resolve(att), NH, resolve(doc_start));
    }
    end();
}

void Graph::flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start) {
    if (begin("flash_attention_fwd", attention_flops(qkv), {out, lse, qkv, doc_start}))
        backend_->flash_attention_fwd(resolve(out), resolve(lse), resolve(qkv), NH, resolve(doc_start));
    end();
}

// Context parallelism: each query row against its keys (at most T of them).
static double cp_attention_flops(const Tensor & qkv, const Tensor & kv, int NH, int KVH) {
    const double rows = double(qkv.rows()), hd = double(qkv.cols()) / double(NH + 2 * KVH);
    return 4.0 * rows * double(kv.dim(1)) / 2.0 * double(NH) * hd;
}

void Graph::cp_attention_fwd(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH) {
    if (begin("cp_attention_fwd", cp_attention_flops(qkv, kv, NH, KVH), {out, lse, qkv, kv, meta}))
        backend_->cp_attention_fwd(resolve(out), resolve(lse), resolve(qkv), resolve(kv), resolve(meta), NH, KVH);
    end();
}

void Graph::cp_attention_bwd(Tensor dqkv, Tensor dkv, Tensor dout, Tensor out, Tensor qkv, Tensor kv, Tensor lse,
                             Tensor meta, int NH, int KVH) {
    const size_t bytes = size_t(qkv.rows()) * size_t(NH) * sizeof(float);   // each query's dout . out
    if (recording_) grow_workspace(bytes);
    if (begin("cp_attention_bwd", 2.5 * cp_attention_flops(qkv, kv, NH, KVH), {dqkv, dkv, dout, out, qkv, kv, lse, meta},
              true))
        backend_->cp_attention_bwd(resolve(dqkv), resolve(dkv),
                                   resolve(Tensor(workspace_, DType::f32, {int64_t(bytes / sizeof(float))})),
                                   resolve(dout), resolve(out), resolve(qkv), resolve(kv), resolve(lse), resolve(meta),
                                   NH, KVH);
    end();
}

void Graph::flash_attention_bwd(Tensor dqkv, Tensor dout, Tensor out, Tensor qkv, Tensor lse, int NH,
                                Tensor doc_start) {
    // Backward recomputes the scores: forward's work again plus the gradient products.
    if (recording_ && sizing_)
        grow_workspace(sizing_->flash_attention_workspace(qkv.dim(0), qkv.dim(1), out.cols(), NH, qkv.dtype));
    if (begin("flash_attention_bwd", 2.5 * attention_flops(qkv), {dqkv, dout, out, qkv, lse, doc_start}, true)) {
        const size_t bytes = backend_->flash_attention_workspace(qkv.dim(0), qkv.dim(1), out.cols(), NH, qkv.dtype);
        Tensor ws = bytes ? resolve(Tensor(workspace_, DType::f32, {int64_t(bytes / sizeof(float))})) : Tensor{};
        backend_->flash_attention_bwd(resolve(dqkv), ws, resolve(dout), resolve(out), resolve(qkv), resolve(lse), NH,
                                      resolve(doc_start));
    }
    end();
}

void Graph::gelu_fwd(Tensor out, Tensor inp, Gelu kind) {
    if (begin("gelu_fwd", 10.0 * double(inp.numel()), {out, inp}))
        backend_->gelu_fwd(resolve(out), resolve(inp), kind);
    end();
}

void Graph::gelu_bwd(Tensor dinp, Tensor dout, Tensor inp, Gelu kind) {
    if (begin("gelu_bwd", 20.0 * double(inp.numel()), {dinp, dout, inp}))
        backend_->gelu_bwd(resolve(dinp), resolve(dout), resolve(inp), kind);
    end();
}

void Graph::residual_fwd(Tensor out, Tensor a, Tensor b) {
    if (begin("residual_fwd", double(out.numel()), {out, a, b}))
        backend_->residual_fwd(resolve(out), resolve(a), resolve(b));
    end();
}

// ---------------------------------------------------------------------------------------------
// LLaMA family. FLOPs per element, like the ops above: RMSNorm forward 4 (square-add, scale by
// rstd, by the weight, plus the row's share of the sqrt), backward 8 (dinp 5, dw 3); RoPE 6 per
// rotated pair (4 multiplies, 2 adds; the per-row cos/sin are not counted); SwiGLU forward 6 per
// output (exp, add, divide, two multiplies, negate), backward 12; repeat_kv forward copies (0),
// backward adds G-1 heads into each K and V head.

namespace {
// Rotated pairs of a [B,T,(NH+2*KVH)*hd] qkv: (NH+KVH) heads of hd/2 pairs per row.
double rope_pairs(const Tensor & qkv, int NH, int KVH) {
    return double(qkv.numel()) * double(NH + KVH) / double(NH + 2 * KVH) / 2.0;
}
}  // namespace

void Graph::rmsnorm_fwd(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) {
    if (begin("rmsnorm_fwd", 4.0 * double(inp.numel()), {out, rstd, inp, w}))
        backend_->rmsnorm_fwd(resolve(out), resolve(rstd), resolve(inp), resolve(w), eps);
    end();
}

void Graph::rmsnorm_bwd(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) {
    if (begin("rmsnorm_bwd", 8.0 * double(inp.numel()), {dinp, dw, dout, inp, w, rstd}))
        backend_->rmsnorm_bwd(resolve(dinp), resolve(dw), resolve(dout), resolve(inp), resolve(w), resolve(rstd));
    end();
}

void Graph::qk_norm_fwd(Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps) {
    if (begin("qk_norm_fwd", 4.0 * double(raw.numel()), {qkv, raw, rstd, wq, wk}))
        backend_->qk_norm_fwd(resolve(qkv), resolve(raw), resolve(rstd), resolve(wq), resolve(wk), NH, KVH, eps);
    end();
}

void Graph::qk_norm_bwd(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd, int NH,
                        int KVH) {
    if (begin("qk_norm_bwd", 8.0 * double(raw.numel()), {dqkv, dwq, dwk, raw, wq, wk, rstd}))
        backend_->qk_norm_bwd(resolve(dqkv), resolve(dwq), resolve(dwk), resolve(raw), resolve(wq), resolve(wk),
                              resolve(rstd), NH, KVH);
    end();
}

void Graph::rope_fwd(Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    if (begin("rope_fwd", 6.0 * rope_pairs(qkv, NH, KVH), {qkv, doc_start}))
        backend_->rope_fwd(resolve(qkv), NH, KVH, rope, pos0, resolve(doc_start));
    end();
}

void Graph::rope_bwd(Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start) {
    if (begin("rope_bwd", 6.0 * rope_pairs(dqkv, NH, KVH), {dqkv, doc_start}))
        backend_->rope_bwd(resolve(dqkv), NH, KVH, rope, pos0, resolve(doc_start));
    end();
}

void Graph::swiglu_fwd(Tensor out, Tensor inp) {
    if (begin("swiglu_fwd", 6.0 * double(out.numel()), {out, inp})) backend_->swiglu_fwd(resolve(out), resolve(inp));
    end();
}

void Graph::swiglu_bwd(Tensor dinp, Tensor dout, Tensor inp) {
    if (begin("swiglu_bwd", 12.0 * double(dout.numel()), {dinp, dout, inp}))
        backend_->swiglu_bwd(resolve(dinp), resolve(dout), resolve(inp));
    end();
}

void Graph::geglu_fwd(Tensor out, Tensor inp) {
    if (begin("geglu_fwd", 10.0 * double(out.numel()), {out, inp})) backend_->geglu_fwd(resolve(out), resolve(inp));
    end();
}

void Graph::geglu_bwd(Tensor dinp, Tensor dout, Tensor inp) {
    if (begin("geglu_bwd", 18.0 * double(dout.numel()), {dinp, dout, inp}))
        backend_->geglu_bwd(resolve(dinp), resolve(dout), resolve(inp));
    end();
}

void Graph::repeat_kv_fwd(Tensor full, Tensor qkv, int NH, int KVH) {
    if (begin("repeat_kv_fwd", 0, {full, qkv})) backend_->repeat_kv_fwd(resolve(full), resolve(qkv), NH, KVH);
    end();
}

void Graph::repeat_kv_bwd(Tensor dqkv, Tensor dfull, int NH, int KVH) {
    // dfull[N, 3*NH*hd]: its k and v thirds (2*NH*hd per row) are summed into 2*KVH*hd.
    const double kv_in = double(dfull.numel()) * 2.0 / 3.0;
    const double flops = kv_in * double(NH - KVH) / double(NH);
    if (begin("repeat_kv_bwd", flops, {dqkv, dfull})) backend_->repeat_kv_bwd(resolve(dqkv), resolve(dfull), NH, KVH);
    end();
}

void Graph::cached_attention_fwd(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH, int KVH,
                                 int window) {
    // Each new token t scores and sums min(pos0 + t + 1, window) cached keys and values: 4 hd flops each.
    const int64_t T = qkv.dim(1);
    double keys = 0;
    for (int64_t t = 0; t < T; ++t) keys += double(window > 0 ? std::min<int64_t>(pos0 + t + 1, window) : pos0 + t + 1);
    const double flops = 4.0 * double(qkv.dim(0)) * NH * (double(out.dim(2)) / NH) * keys;
    if (begin("cached_attention_fwd", flops, {out, qkv, kcache, vcache}))
        backend_->cached_attention_fwd(resolve(out), resolve(qkv), resolve(kcache), resolve(vcache), pos0, NH, KVH,
                                       window);
    end();
}

void Graph::paged_attention_fwd(Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta, const PagedKv & kv,
                                int NH, int KVH, int window) {
    // The FLOPs of the longest context every row could reach (the contents are the host's, per step).
    const int64_t n = qkv.rows(), keys = int64_t(kv.max_blocks) * kv.block;
    const double flops = 4.0 * double(n) * double(out.cols()) * double(window > 0 ? std::min<int64_t>(keys, window) : keys);
    if (begin("paged_attention_fwd", flops, {out, qkv, kpool, vpool, meta}))
        backend_->paged_attention_fwd(resolve(out), resolve(qkv), resolve(kpool), resolve(vpool), resolve(meta), kv, NH,
                                      KVH, window);
    end();
}

// ---------------------------------------------------------------------------------------------

void Graph::xent_fwd(Tensor losses, Tensor logits, Tensor targets) {
    if (begin("xent_fwd", 5.0 * double(logits.numel()), {losses, logits, targets}))
        backend_->xent_fwd(resolve(losses), resolve(logits), resolve(targets));
    end();
}

void Graph::xent_bwd(Tensor probs, Tensor targets, float dloss) {
    if (begin("xent_bwd", 2.0 * double(probs.numel()), {probs, targets}))
        backend_->xent_bwd(resolve(probs), resolve(targets), dloss);
    end();
}

void Graph::xent_fwd_bwd(Tensor losses, Tensor logits, Tensor targets, float dloss, bool round_bf16) {
    if (begin("xent_fwd_bwd", 7.0 * double(logits.numel()), {losses, logits, targets})) {
        if (round_bf16) backend_->xent_fwd_bwd_round(resolve(losses), resolve(logits), resolve(targets), dloss);
        else backend_->xent_fwd_bwd(resolve(losses), resolve(logits), resolve(targets), dloss);
    }
    end();
}

// Per logit: stats 4 flops (max, subtract, exp, add), backward 3 (subtract, exp, scale); the
// loss combines 2 stats per rank and row with about 5 (max, subtract, exp, add, target add).
void Graph::xent_shard_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab) {
    if (begin("xent_shard_stats", 4.0 * double(logits.numel()), {stats, logits, targets}))
        backend_->xent_shard_stats(resolve(stats), resolve(logits), resolve(targets), vocab_lo, vocab);
    end();
}

void Graph::xent_shard_loss(Tensor losses, Tensor lse, Tensor gathered, Tensor targets) {
    if (begin("xent_shard_loss", 2.5 * double(gathered.numel()), {losses, lse, gathered, targets}))
        backend_->xent_shard_loss(resolve(losses), resolve(lse), resolve(gathered), resolve(targets));
    end();
}

void Graph::xent_shard_bwd(Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab, float dloss) {
    if (begin("xent_shard_bwd", 3.0 * double(logits.numel()), {logits, targets, lse}))
        backend_->xent_shard_bwd(resolve(logits), resolve(targets), resolve(lse), vocab_lo, vocab, dloss);
    end();
}

// Preference tuning: a sum per token, a few flops per token for the pairs, and xent_fwd_bwd's 7
// per logit.
void Graph::row_logps(Tensor out, Tensor losses) {
    if (begin("row_logps", double(losses.numel()), {out, losses})) backend_->row_logps(resolve(out), resolve(losses));
    end();
}

void Graph::dpo_loss(Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d) {
    if (begin("dpo_loss", 4.0 * double(losses.numel()), {losses, scale, logps, ref, targets}))
        backend_->dpo_loss(resolve(losses), resolve(scale), resolve(logps), resolve(ref), resolve(targets), d);
    end();
}

void Graph::xent_grad_rows(Tensor logits, Tensor targets, Tensor scale) {
    if (begin("xent_grad_rows", 7.0 * double(logits.numel()), {logits, targets, scale}))
        backend_->xent_grad_rows(resolve(logits), resolve(targets), resolve(scale));
    end();
}

// Per logit pair: forward about 12 flops (two maxima, three exps, the sums, q's scaling),
// backward 8 (two exps, the weighted difference).
void Graph::distill_fwd(Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                        float temperature) {
    if (begin("distill_fwd", 12.0 * double(logits.numel()), {losses, stats, logits, teacher, targets}))
        backend_->distill_fwd(resolve(losses), resolve(stats), resolve(logits), resolve(teacher), resolve(targets), alpha,
                              temperature);
    end();
}

void Graph::distill_bwd(Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha,
                        float temperature, float dloss) {
    if (begin("distill_bwd", 8.0 * double(logits.numel()), {logits, stats, teacher_probs, targets}))
        backend_->distill_bwd(resolve(logits), resolve(stats), resolve(teacher_probs), resolve(targets), alpha,
                              temperature, dloss);
    end();
}

void Graph::sum_squares(Tensor out, Tensor x) {
    if (begin("sum_squares", 2.0 * double(x.numel()), {out, x})) backend_->sum_squares(resolve(out), resolve(x));
    end();
}

void Graph::optimizer_step(Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states, Tensor norm_sq,
                           Tensor param_copy, const OptimHyper & h) {
    const OptimizerRow & r = optimizer_row(o);
    const auto & t = states.t;
    static_assert(kMaxOptimizerStates == 6, "every state is an input of the op");
    // GaLore's projection and projection back: 2 r multiply-adds each per element (its refresh,
    // every update gap, is left out).
    const double flops = (r.flops + 4.0 * h.galore_rank) * double(param.numel());
    if (begin(r.op, flops, {param, grad, t[0], t[1], t[2], t[3], t[4], t[5], norm_sq, param_copy}) &&
        !skip_update_) {
        OptimizerStates at;
        for (size_t i = 0; i < t.size(); ++i) at.t[i] = resolve(t[i]);
        backend_->optimizer_step(o, resolve(param), resolve(grad), at, resolve(norm_sq), resolve(param_copy), h);
    }
    end();
}

void Graph::offload_copy(const char * name, Tensor staging, Tensor stored, int slot, bool read) {
    MF_ASSERT(staging.nbytes() == stored.nbytes());
    if (begin(name, 0, {staging, stored})) {
        OffloadStore * store = memory_->store();
        MF_ASSERT(store && "offload ops need the memory's store");
        const Tensor r = resolve(staging);
        const uint64_t at = memory_->offloaded_at(stored.buffer) + stored.offset;
        if (read) store->read_start(slot, r.data, at, r.nbytes());
        else store->write_start(slot, at, r.data, r.nbytes());
    }
    end();
}

void Graph::offload_read(Tensor staging, Tensor stored, int slot) { offload_copy("offload_read", staging, stored, slot, true); }
void Graph::offload_write(Tensor stored, Tensor staging, int slot) {
    offload_copy("offload_write", staging, stored, slot, false);
}

void Graph::offload_wait(int slot, std::initializer_list<Tensor> uses) {
    offload_wait(slot, std::span<const Tensor>(uses.begin(), uses.size()));
}

void Graph::offload_wait(int slot, std::span<const Tensor> uses) {
    if (begin("offload_wait", 0, uses)) memory_->store()->wait(slot);
    end();
}

void Graph::alias(BufferId from, BufferId to) {
    MF_ASSERT(from >= 0 && to >= 0);
    const size_t n = size_t(std::max(from, to)) + 1;
    for (size_t i = alias_.size(); i < n; ++i) alias_.push_back(BufferId(i));
    alias_[size_t(from)] = to;
}

}  // namespace memfit
