// Context parallelism in the transformer (model/context_parallel.h): this rank holds T rows of
// each sequence (two mirrored chunks); attention gathers every rank's keys and values into the
// whole sequence's position order, attends this rank's queries over them, and in backward sends
// the keys' and values' gradients back to the ranks that own their positions.
#include <string>

#include "backend/collectives.h"
#include "core/error.h"
#include "model/transformer.h"

namespace memfit {

void Transformer::set_context(Tensor ctx) {
    MF_ASSERT(cp_.enabled() && ctx.dtype == DType::i32 && ctx.numel() == int64_t(3) * B_ * T_);
    const int64_t b = B_, t = T_;
    docs_ = Tensor(ctx.buffer, DType::i32, {b, t}, ctx.offset);
    cp_meta_ = Tensor(ctx.buffer, DType::i32, {2, b, t}, ctx.offset + size_t(b * t) * 4);
}

void Transformer::declare_cp(Program & program, const std::string & h, bool with_backward, LayerActs & a) const {
    const int64_t R = cp_.ranks, rows = int64_t(B_) * T_, KV2 = int64_t(2) * cfg_.kv_heads() * cfg_.head_dim();
    const int64_t whole = int64_t(T_) * R;
    auto act = [&](std::string_view name, std::initializer_list<int64_t> dims) {
        return this->act(program, h, dims, false, name);
    };
    a.cp_kv = act("attn.cp.kv", {rows, KV2});
    a.cp_all = act("attn.cp.kv.gathered", {R * rows * KV2});
    a.cp_abs = act("attn.cp.kv.whole", {int64_t(B_), whole, KV2});
    if (!with_backward) return;
    a.cp_kv_b = act("attn.cp.kv.bwd", {rows, KV2});
    a.cp_all_b = act("attn.cp.kv.gathered.bwd", {R * rows * KV2});
    a.cp_abs_b = act("attn.cp.kv.whole.bwd", {int64_t(B_), whole, KV2});
    a.cp_dabs = act("attn.cp.kv.whole.grad", {int64_t(B_), whole, KV2});
    a.cp_dall = act("attn.cp.kv.gathered.grad", {R * rows * KV2});
    a.cp_dkv = act("attn.cp.kv.grad", {rows, KV2});
    // A 16-bit reduce-scatter sums through fp32 copies (backend/collectives.h).
    if (const size_t n = comm_scratch_elems(dt_, int(R), size_t(R * rows * KV2)); n > 0)
        a.cp_scratch = Tensor(program.declare(prefix_ + h + "attn.cp.kv.grad.sum", Category::communication, n * 4),
                              DType::f32, {int64_t(n)});
}

// Rows [chunk start, + chunk) of rank r's half h in `all` (rank r's k | v: its B x T rows) and
// in `whole` (B x the whole sequence, position order), copied one way or the other.
void Transformer::cp_permute(Graph & g, const Tensor & whole, const Tensor & all, bool to_whole) const {
    const int64_t R = cp_.ranks, KV2 = whole.cols(), T = whole.dim(1), c = cp_.chunk(int(T));
    for (int64_t r = 0; r < R; ++r)
        for (int64_t b = 0; b < B_; ++b)
            for (int half = 0; half < 2; ++half) {
                const Tensor a = all.view(((r * B_ + b) * T_ + half * c) * KV2, {c, KV2});
                const Tensor w = whole.view((b * T + int64_t(cp_.chunk_of(int(r), half)) * c) * KV2, {c, KV2});
                if (to_whole) g.copy(w, a);
                else g.copy(a, w);
            }
}

void Transformer::cp_gather(Graph & g, const Tensor & kv, const Tensor & all, const Tensor & whole,
                            const Tensor & qkv) const {
    const int64_t rows = int64_t(B_) * T_, q = int64_t(cfg_.n_head) * cfg_.head_dim();
    g.take_columns(kv, qkv.view(0, {rows, qkv.cols()}), q, 1.0f);
    g.cp_all_gather(all, kv.view(0, {kv.numel()}));
    cp_permute(g, whole, all, true);
}

void Transformer::cp_attention_bwd(Graph & g, const LayerActs & a) const {
    const int NH = cfg_.n_head, KVH = cfg_.kv_heads();
    const int64_t rows = int64_t(B_) * T_, q = int64_t(NH) * cfg_.head_dim();
    cp_gather(g, a.cp_kv_b, a.cp_all_b, a.cp_abs_b, a.qkv);
    g.cp_attention_bwd(a.dqkv, a.cp_dabs, a.datty, a.atty, a.qkv, a.cp_abs_b, a.lse, cp_meta_, NH, KVH);
    cp_permute(g, a.cp_dabs, a.cp_dall, false);
    g.cp_reduce_scatter(a.cp_dkv.view(0, {a.cp_dkv.numel()}), a.cp_dall, a.cp_scratch);
    g.add_columns(a.dqkv.view(0, {rows, a.dqkv.cols()}), a.cp_dkv, q, 1.0f);
}

}  // namespace memfit
