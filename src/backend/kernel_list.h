// The kernels every backend runs, one line each: the list the base class (backend/backend.h)
// declares pure, and the CPU, CUDA and null backends declare their overrides from, so a new op is
// one row here and one definition per backend. Included several times (no include guard), each
// time with MF_KERNEL(name, (params)) defined as the declaration wanted; every kernel returns void.
// Tensors are resolved (device pointers); the comments say what each computes.
MF_KERNEL(fill_zero, (Tensor t))
// dst = src, converting between f32, bf16 and f16 when the dtypes differ (same numel).
MF_KERNEL(copy, (Tensor dst, Tensor src))

MF_KERNEL(gemm, (const GemmDesc & d, Tensor c, Tensor a, Tensor b, Tensor bias, Tensor workspace))
// dbias[N] += column sums of dout[rows, N]
MF_KERNEL(bias_grad, (Tensor dbias, Tensor dout))

// Packed documents. doc_start i32 [B,T], where an op takes it: the index, within its row, of
// the first token of the document token t belongs to (0 <= doc_start[b,t] <= t, and
// non-decreasing along a row). Token t's position is then t - doc_start[b,t], and it attends
// to keys doc_start[b,t] .. t only (a block-diagonal causal mask). An invalid doc_start
// (Tensor{}) is one document per row: positions t, keys 0 .. t. Under context parallelism a
// row holds chunks of a longer sequence and the ops that read positions only (encoder_fwd /
// encoder_bwd, rope_fwd / rope_bwd) get doc_start[b,t] = t - position, which may be negative.

// out[B,T,C] = wte[tokens] + wpe[position]; an invalid wpe (Tensor{}) means no position
// embedding (LLaMA): out = wte[tokens].
MF_KERNEL(encoder_fwd, (Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start = {}))
// dwte, dwpe += ...  (an invalid dwpe: only dwte)
MF_KERNEL(encoder_bwd, (Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start = {}))
// Vocabulary-parallel embedding (tensor parallelism): wte [Vl, C] holds rows vocab_lo ..
// vocab_lo+Vl-1 of the full table. out[b,t,:] = (wte[tok - vocab_lo] if vocab_lo <= tok <
// vocab_lo+Vl, else 0) + wpe[t] (an invalid wpe adds nothing). Tokens outside the shard are
// legal (they get the zero row); summing every shard's out gives encoder_fwd's.
MF_KERNEL(vocab_encoder_fwd, (Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo))
// dwte[tok - vocab_lo] += dout[b,t] for the tokens in the shard; dwpe += dout summed over the
// batch, for every token. An invalid dwte (a frozen table) or dwpe is skipped.
MF_KERNEL(vocab_encoder_bwd, (Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo))

// out[N,C], mean[N], rstd[N] from inp[N,C]
MF_KERNEL(layernorm_fwd, (Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps))
// dinp += ..., dw += ..., db += ... (invalid dw and db: a frozen norm, dinp only)
MF_KERNEL(layernorm_bwd, (Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
          Tensor rstd))

// Causal self-attention (within documents when doc_start is valid). qkv[B,T,3C] ->
// out[B,T,C]; att[B,NH,T,T] softmax probs saved (0 where masked).
MF_KERNEL(attention_fwd, (Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start = {}))
// dqkv = ... (written); scratch holds >= B*NH*T floats.
MF_KERNEL(attention_bwd, (Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, int NH,
          Tensor doc_start = {}))

// Memory-efficient causal attention: never stores the T x T scores. lse[B,NH,T] keeps one
// log-sum-exp per query; backward recomputes the scores tile by tile. Tiles wholly before a
// query tile's documents are skipped.
MF_KERNEL(flash_attention_fwd, (Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start = {}))
MF_KERNEL(flash_attention_bwd, (Tensor dqkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor lse, int NH,
          Tensor doc_start = {}))

// out = gelu(inp), the variant kind (backend/activation.h); dinp = dout * gelu'(inp).
MF_KERNEL(gelu_fwd, (Tensor out, Tensor inp, Gelu kind))
MF_KERNEL(gelu_bwd, (Tensor dinp, Tensor dout, Tensor inp, Gelu kind))
MF_KERNEL(residual_fwd, (Tensor out, Tensor a, Tensor b))   // out = a + b

// LLaMA family.
// RMSNorm: rstd[N] (f32) = 1/sqrt(mean_c(inp^2) + eps); out[N,C] = inp * rstd * w.
MF_KERNEL(rmsnorm_fwd, (Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps))
// dinp += ..., dw += ...  (dinp has dout's dtype; dw f32 or the compute dtype; invalid: frozen)
MF_KERNEL(rmsnorm_bwd, (Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd))
// Qwen3's q and k norms, in place on qkv[B,T,(NH+2*KVH)*hd]: each q head row becomes
// RMSNorm(row) * wq, each k head row RMSNorm(row) * wk (wq, wk [hd]); v untouched. The rows
// before are saved to raw[B,T,(NH+KVH)*hd] and their rstd to rstd[B,T,NH+KVH] (f32).
MF_KERNEL(qk_norm_fwd, (Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps))
// Its backward, in place on dqkv's q and k heads (d(normed) -> d(raw)); dwq, dwk += (f32 or
// the compute dtype; both invalid: frozen).
MF_KERNEL(qk_norm_bwd, (Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd, int NH,
          int KVH))
// Rotary position embeddings (HF rotate_half), in place on the q and k heads of
// qkv[B,T,(NH+2*KVH)*hd] (per row: NH q heads, KVH k heads, KVH v heads; v untouched).
// Row t has position p = pos0 + t (t - doc_start[b,t] with packed documents, pos0 0 then);
// head pair (i, i+hd/2) turns by p * rope.inv_freq(i, hd) (theta^(-2i/hd), or rope_scaling's).
MF_KERNEL(rope_fwd, (Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {}))
// Its backward, in place on dqkv: the inverse rotation.
MF_KERNEL(rope_bwd, (Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {}))
// inp[N,2I] = [gate | up] per row; out[N,I] = silu(gate) * up.
MF_KERNEL(swiglu_fwd, (Tensor out, Tensor inp))
MF_KERNEL(swiglu_bwd, (Tensor dinp, Tensor dout, Tensor inp))   // dinp[N,2I] = ...

// Mixture of experts (backend/moe.h: the route's layout). logits [N,E] (any float dtype) ->
// p = softmax, the top k (ties: the lower expert), weights wts f32 [N,k] (p, or p over the k's
// sum with norm_topk), the route, and this layer's stats row [moe_stats_width] (written).
MF_KERNEL(moe_route, (Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d))
// dlogits [N,E] (written, logits' dtype) from dwts f32 [N,k] through the weights, plus the
// load-balancing loss's gradient (d.aux_scale x E x the tokens every layer sent to each expert,
// over (layers x N)^2, on each probability) and the z-loss's (d.z_scale x 2 lse / (layers x N)
// on each logit through the log-sum-exp); stats_all [d.layers, moe_stats_width] every layer's.
MF_KERNEL(moe_route_bwd, (Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts, Tensor stats_all,
          const MoeDesc & d))
// With d.capacity > 0 the routed rows below are the capacity layout's [E*capacity, C] (moe.h):
// a dropped choice has none (combine and scatter skip it, its dwts is 0), gather zeroes the rest.
// out [N*k, C]: out[s] = x[order[s] / k] (the dispatch, rows in expert order).
MF_KERNEL(moe_gather, (Tensor out, Tensor x, Tensor route, const MoeDesc & d))
// dx [N, C] (+)= the sum over each token's k slots of dxs[slot] (the dispatch's backward).
MF_KERNEL(moe_scatter, (Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate))
// out [N, C] = sum_j wts[n,j] y[slot(n,j)] (written; f32 sums).
MF_KERNEL(moe_combine, (Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d))
// The combine's backward through the down projection, g [N*k, F] = d(output) gathered times
// W_down: dwts[n,j] = g[s] . act[s] (s = slot(n,j)), then g[s] and dys[s] times wts[n,j] in place
// (an invalid dys: g only).
MF_KERNEL(moe_weight_bwd, (Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route, const MoeDesc & d))
// Expert parallelism's send counts: counts[e] (i32, [E]) = expert e's routed rows kept under
// d.capacity, and the choices dropped past it into stats[2E+1] (this layer's row). With
// d.drop_probs, an expert over the capacity first has its span of the route (order and slot)
// sorted by wts f32 [N,k], highest first (ties: the lower choice), so that its first rows kept
// are its most probable.
MF_KERNEL(moe_counts, (Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d))
// Qwen2-MoE's shared expert: out[n] += sigmoid(logit[n]) y[n] (out, y [N, C], logit [N, 1], one
// dtype); its backward: dy[n] = sigmoid(logit[n]) dout[n], dlogit[n] = s (1 - s) dout[n] . y[n]
// (both written).
MF_KERNEL(sigmoid_gate_fwd, (Tensor out, Tensor y, Tensor logit))
MF_KERNEL(sigmoid_gate_bwd, (Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit))
// GeGLU (Gemma 3): out[N,I] = gelu(gate) * up, GELU's tanh form; its backward as swiglu_bwd's.
MF_KERNEL(geglu_fwd, (Tensor out, Tensor inp))
MF_KERNEL(geglu_bwd, (Tensor dinp, Tensor dout, Tensor inp))
// Grouped-query attention: qkv[B,T,(NH+2*KVH)*hd] -> full[B,T,3*NH*hd] ([q|k|v], NH heads
// each; KV head j serves query heads j*G .. j*G+G-1, G = NH/KVH).
MF_KERNEL(repeat_kv_fwd, (Tensor full, Tensor qkv, int NH, int KVH))
// dqkv = ... (written): q copied; each KV head gets the sum over its G query heads.
MF_KERNEL(repeat_kv_bwd, (Tensor dqkv, Tensor dfull, int NH, int KVH))

// Attention of T new tokens over a KV cache (generation). qkv [B,T,(NH+2*KVH)*hd] holds the
// new tokens' q|k|v (after RoPE); their k and v rows are written into kcache and vcache
// [B,cap,KVH*hd] at rows pos0 .. pos0+T-1, then out[B,T,NH*hd] = causal attention of each
// new token (position pos0+t) over cache rows 0 .. pos0+t; query head h reads KV head
// h / (NH/KVH). With window W > 0 (sliding-window attention) the cache is a ring: position
// p lives in row p % cap, and token pos0+t attends to positions max(0, pos0+t-W+1) .. pos0+t
// (then T + W - 1 <= cap, or pos0 + T <= cap).
MF_KERNEL(cached_attention_fwd, (Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH, int KVH,
          int window = 0))
// The same over a paged KV cache (backend/paged_kv.h): qkv [1,n,(NH+2*KVH)*hd] holds n token rows
// (n <= kv.tokens) of any sequences, meta the step's i32 metadata. Each row's key and value are
// written to its pool row (kpool, vpool [kv.blocks * kv.block, KVH*hd]) first; then row i attends
// over its own sequence's positions max(0, pos - W + 1) .. pos (W = window, 0: all), read through
// the block table in position order. Padding rows (seq -1) write nothing and output zeros.
MF_KERNEL(paged_attention_fwd, (Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta, const PagedKv & kv,
          int NH, int KVH, int window = 0))
// Context parallelism (model/context_parallel.h): this rank's B x Tl query rows over every
// position of their sequences. qkv [B,Tl,(NH+2*KVH)*hd] (its q columns read), kv [B,T,2*KVH*hd]
// (each position's k | v, in position order), meta i32 [2,B,Tl]: each query's position (its last
// key) and its first key. out [B,Tl,NH*hd] and lse [B,NH,Tl] (f32, the scaled scores'
// log-sum-exp) written; q head h reads KV head h / (NH / KVH).
MF_KERNEL(cp_attention_fwd, (Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH))
// dqkv's q columns written and its k, v columns zeroed; dkv [B,T,2*KVH*hd] written: each
// position's key and value gradient from this rank's queries (zero where none reads it).
// scratch: B*Tl*NH floats (each query's dout . out).
MF_KERNEL(cp_attention_bwd, (Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor kv,
          Tensor lse, Tensor meta, int NH, int KVH))
// The ring (--cp-comm-type p2p): one visiting block of the group's keys and values at a time.
// kv [B,Tl,2*KVH*hd] (one rank's rows), kpos i32 [Tl] (their positions), meta as above; acc f32
// [B,Tl,NH*hd] and lse f32 [B,NH,Tl] hold the attention over the blocks seen so far (normalized),
// this block merged in (first: they start with it).
MF_KERNEL(cp_block_fwd, (Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH, int KVH,
          bool first))
// Adds this block's part of dq (f32 [B,Tl,NH*hd]) and of its keys' and values' gradient (f32
// [B,Tl,2*KVH*hd]), the probabilities from the whole attention's lse and out; scratch B*Tl*NH floats.
MF_KERNEL(cp_block_bwd, (Tensor dq, Tensor dkv, Tensor scratch, Tensor dout, Tensor out, Tensor qkv, Tensor kv,
          Tensor lse, Tensor kpos, Tensor meta, int NH, int KVH))
// dqkv [rows, (NH+2*KVH)*hd] = dq | dkv (f32), rounded to its dtype.
MF_KERNEL(cp_qkv_grad, (Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH))

// Inverted dropout: out = in * keep / (1 - p), keep = a hash of (seed, element index) >= p,
// so the same seed gives the same mask (backward regenerates it). In place allowed.
MF_KERNEL(dropout, (Tensor out, Tensor in, float p, uint64_t seed))

// LoRA adapters write into (and read from) a column slice of a fused projection's output.
// out[N, col0 + j] += scale * d[N, j] for j < d.cols (out and d: f32, bf16 or f16).
MF_KERNEL(add_columns, (Tensor out, Tensor d, int64_t col0, float scale))
// d[N, j] = scale * src[N, col0 + j], written.
MF_KERNEL(take_columns, (Tensor d, Tensor src, int64_t col0, float scale))
// DoRA (model/lora.h), on the slice of `cols` = mag.numel columns from col0. norm[j] (f32) =
// || W_j + scale * B[j] A ||, W_j output col0 + j's row of the weight: w [out, in] (w_in_out
// false) or its column of w [in, out] (true); a [r, in], b [cols, r]; fp32 sums.
MF_KERNEL(dora_norm, (Tensor norm, Tensor w, bool w_in_out, int64_t col0, Tensor a, Tensor b, float scale))
// z[N, j] = out[N, col0 + j] - bias[col0 + j] (written), then out[N, col0 + j] = mag[j] / norm[j]
// * z[N, j] + bias[col0 + j]; an invalid bias is 0.
MF_KERNEL(dora_scale_fwd, (Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0))
// dmag[j] += sum_n dout[n, col0 + j] z[n, j] / norm[j] (summed in fp32 over rows in order), then
// dout[N, col0 + j] *= mag[j] / norm[j] in place.
MF_KERNEL(dora_scale_bwd, (Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0))

// logits[N,V] are turned into probabilities in place; losses[N] = -log p[target]
// (0 where target == -100).
MF_KERNEL(xent_fwd, (Tensor losses, Tensor logits, Tensor targets))
// probs[N,V] become dlogits in place: (p - onehot(target)) * dloss; rows with target -100 -> 0.
MF_KERNEL(xent_bwd, (Tensor probs, Tensor targets, float dloss))
// xent_fwd then xent_bwd (training's loss chunk): the same losses and dlogits, where a backend
// can, in one pass over the logits.
MF_KERNEL(xent_fwd_bwd, (Tensor losses, Tensor logits, Tensor targets, float dloss))

// Vocabulary-parallel cross-entropy (tensor parallelism), never gathering the full logits.
// logits f32 [N, Vl] are this rank's columns vocab_lo .. vocab_lo+Vl-1 of a vocabulary of
// `vocab` entries; columns with vocab_lo + j >= vocab are padding and ignored. targets i32 [N]
// (-100: ignored). The three steps, with an all-gather of the stats between the first two:
// stats f32 [2, N] (written; logits untouched): stats[i] = log sum_j exp(logits[i][j]) over
// the valid columns (-inf when the shard has none); stats[N + i] = logits[i][target_i -
// vocab_lo] when the shard holds target_i, else 0 (0 for ignored rows).
MF_KERNEL(xent_shard_stats, (Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab))
// gathered f32 [R, 2, N]: every rank's stats, in rank order. lse [N] (written) = log sum_r
// exp(gathered[r][0][i]); losses [N] (written) = lse[i] - sum_r gathered[r][1][i], 0 where
// target == -100. Equals xent_fwd's losses on the concatenated logits.
MF_KERNEL(xent_shard_loss, (Tensor losses, Tensor lse, Tensor gathered, Tensor targets))
// In place: logits become dlogits, (exp(logits[i][j] - lse[i]) - [vocab_lo + j == target_i])
// * dloss; padding columns and rows with target -100 become 0. Equals xent_bwd's columns.
MF_KERNEL(xent_shard_bwd, (Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab, float dloss))

// Knowledge distillation's loss (Hinton et al. 2015), row by row, for the student's logits z
// and a teacher's logits t, both f32 [N, V] over one vocabulary, at temperature T > 0 with
// weight alpha in [0, 1]: losses[i] (written) = (1 - alpha) * CE(z_i, target_i) + alpha * T^2
// * KL(q_i || p_i), q = softmax(t_i / T), p = softmax(z_i / T); 0 where target == -100.
// stats f32 [2, N] (written): the log-sum-exp of z_i, then of z_i / T, for the backward. The
// logits stay as they are; the teacher's become q in place.
MF_KERNEL(distill_fwd, (Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
          float temperature))
// In place: logits become dlogits = dloss * ((1 - alpha) * (softmax(z) - onehot(target)) +
// alpha * T * (p - q)), from distill_fwd's stats and q (the gradient of its loss times dloss);
// rows with target -100 become 0.
MF_KERNEL(distill_bwd, (Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha,
          float temperature, float dloss))

// Preference tuning (backend/preference_loss.h). out f32 [B] (written) = -sum_t losses[b, t] of
// losses f32 [B, T]: each row's log-probability of its trained targets (xent_fwd's losses are 0
// elsewhere), summed in double.
MF_KERNEL(row_logps, (Tensor out, Tensor losses))
// Rows 2i and 2i+1 of losses f32 [B, T] (xent_fwd's, the policy's) are pair i's chosen and
// rejected answers; ref f32 [B] the reference's row_logps. Writes logps [B] = the policy's
// row_logps, scale f32 [B, T] = -dloss * d(pair loss) / d(row log-probability) at each trained
// target (0 where targets == -100), and losses (in place, after reading them) = the pair's loss
// at [2i, 0], 0 elsewhere, so that their sum is the batch's.
MF_KERNEL(dpo_loss, (Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d))
// In place: logits f32 [N, V] become (softmax(logits) - onehot(target)) * scale[i], scale f32
// [N]; rows with target -100 become 0 (xent_fwd_bwd with a factor per row).
MF_KERNEL(xent_grad_rows, (Tensor logits, Tensor targets, Tensor scale))

// out[0] (f32) = sum of squares of x (any float dtype, accumulated in double); inf or NaN
// if any element is.
MF_KERNEL(sum_squares, (Tensor out, Tensor x))
// One optimizer step of a parameter view (backend/optimizer.h's row `o`): param f32 (or bf16-sr's
// bf16 weights), grad f32/bf16/f16, the row's states in its order. norm_sq[0]: the gradients'
// global sum of squares (from sum_squares; invalid: 0), for clipping and the skips of
// skips_update(). When param_copy is valid (bf16/f16, the compute weights of mixed precision) it
// receives the updated param, rounded.
MF_KERNEL(optimizer_step, (Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states, Tensor norm_sq,
          Tensor param_copy, const OptimHyper & h))
