// Context parallelism in the transformer (model/context_parallel.h): this rank holds T rows of
// each sequence (two mirrored chunks); attention gathers every rank's keys and values into the
// whole sequence's position order, attends this rank's queries over them, and in backward sends
// the keys' and values' gradients back to the ranks that own their positions.
#include <string>
#include <utility>

#include "backend/collectives.h"
#include "core/error.h"
#include "model/transformer.h"

namespace memfit {

void Transformer::set_context(Tensor ctx) {
    const int64_t b = B_, t = T_, R = cp_.ranks;
    MF_ASSERT(cp_.enabled() && ctx.dtype == DType::i32 && ctx.numel() == 3 * b * t + R * t);
    docs_ = Tensor(ctx.buffer, DType::i32, {b, t}, ctx.offset);
    cp_meta_ = Tensor(ctx.buffer, DType::i32, {2, b, t}, ctx.offset + size_t(b * t) * 4);
    cp_kpos_ = Tensor(ctx.buffer, DType::i32, {R * t}, ctx.offset + size_t(3 * b * t) * 4);
}

void Transformer::declare_cp(Program & program, const std::string & h, bool with_backward, LayerActs & a) const {
    const int64_t R = cp_.ranks, rows = int64_t(B_) * T_, KV2 = int64_t(2) * cfg_.kv_heads() * cfg_.head_dim();
    const int64_t whole = int64_t(T_) * R;
    auto act = [&](std::string_view name, std::initializer_list<int64_t> dims) {
        return this->act(program, h, dims, false, name);
    };
    a.cp_kv = act("attn.cp.kv", {rows, KV2});
    if (cp_.ring) {
        const int64_t H = int64_t(cfg_.n_head) * cfg_.head_dim();
        auto f32 = [&](std::string_view name, std::initializer_list<int64_t> dims) {
            return this->act(program, h, dims, true, name);
        };
        a.cp_kv_next = act("attn.cp.kv.recv", {rows, KV2});
        a.cp_acc = f32("attn.cp.out.f32", {rows, H});
        if (!with_backward) return;
        a.cp_kv_b = act("attn.cp.kv.bwd", {rows, KV2});
        a.cp_kv_b_next = act("attn.cp.kv.bwd.recv", {rows, KV2});
        a.cp_dq = f32("attn.cp.q.grad.f32", {rows, H});
        a.cp_dkv_acc = f32("attn.cp.kv.grad.f32", {rows, KV2});
        a.cp_dkv_next = f32("attn.cp.kv.grad.f32.recv", {rows, KV2});
        a.cp_dkv_home = f32("attn.cp.kv.grad.f32.home", {rows, KV2});
        return;
    }
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

// The ring: block s of the forward is rank (r - s)'s keys and values (this rank's own first),
// each merged into the fp32 accumulators as it arrives; the next one is received meanwhile.
void Transformer::cp_ring_fwd(Graph & g, Tensor out, Tensor lse, const LayerActs & s, Tensor qkv) const {
    const int R = cp_.ranks, NH = cfg_.n_head, KVH = cfg_.kv_heads();
    const int64_t rows = int64_t(B_) * T_, KV2 = s.cp_kv.cols(), q = int64_t(NH) * cfg_.head_dim();
    g.take_columns(s.cp_kv, qkv.view(0, {rows, qkv.cols()}), q, 1.0f);
    Tensor cur = s.cp_kv.view(0, {int64_t(B_), int64_t(T_), KV2}), next = s.cp_kv_next.view(0, {int64_t(B_), int64_t(T_), KV2});
    for (int step = 0; step < R; ++step) {
        if (step > 0) {
            g.cp_ring_exchange(cur, next);
            std::swap(cur, next);
        }
        g.cp_block_fwd(s.cp_acc, lse, qkv, cur, cp_kpos((cp_.rank - step + R) % R), cp_meta_, NH, KVH, step == 0);
    }
    g.copy(out, s.cp_acc);   // fp32 to the activations' dtype
}

// Its backward: the blocks pass around again, each with its keys' and values' gradient so far,
// to which this rank adds its queries' part; after the last, one more hop takes each home.
void Transformer::cp_ring_bwd(Graph & g, const LayerActs & a) const {
    const int R = cp_.ranks, NH = cfg_.n_head, KVH = cfg_.kv_heads();
    const int64_t rows = int64_t(B_) * T_, KV2 = a.cp_kv_b.cols(), q = int64_t(NH) * cfg_.head_dim();
    const auto block = [&](const Tensor & t) { return t.view(0, {int64_t(B_), int64_t(T_), KV2}); };
    g.take_columns(a.cp_kv_b, a.qkv.view(0, {rows, a.qkv.cols()}), q, 1.0f);
    g.fill_zero(a.cp_dq);
    g.fill_zero(a.cp_dkv_acc);
    Tensor kc = block(a.cp_kv_b), kn = block(a.cp_kv_b_next), dc = block(a.cp_dkv_acc), dn = block(a.cp_dkv_next);
    for (int step = 0; step < R; ++step) {
        if (step > 0) {
            g.cp_ring_exchange(kc, kn);
            g.cp_ring_exchange(dc, dn);
            std::swap(kc, kn);
            std::swap(dc, dn);
        }
        g.cp_block_bwd(a.cp_dq, dc, a.datty, a.atty, a.qkv, kc, a.lse, cp_kpos((cp_.rank - step + R) % R), cp_meta_,
                       NH, KVH);
    }
    g.cp_ring_exchange(dc, block(a.cp_dkv_home));
    g.cp_qkv_grad(a.dqkv.view(0, {rows, a.dqkv.cols()}), a.cp_dq, a.cp_dkv_home, NH, KVH);
}

}  // namespace memfit
