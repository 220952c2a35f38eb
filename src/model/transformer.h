// The transformer of both families (model/config.h): the per-op forward and backward, written
// once against Graph. The constructor declares every activation buffer the pass needs (name,
// category, bytes); forward()/backward() issue the ops. What each buffer's lifetime is follows
// from the ops that touch it, so tensors that backward does not need (the projection outputs,
// for example) are freed as soon as forward is done with them.
//
// One layer, GPT-2 | LLaMA where they differ:
//   ln_1 = LayerNorm | RMSNorm (x);  qkv = ln_1 . W_qkv (+ b) | then RoPE on q and k, in place
//     (Qwen3 first normalizes each q and k head, keeping the inputs: qk_raw, qk_rstd)
//   attention (causal; LLaMA's grouped KV heads are repeated into a transient full q|k|v first)
//   res2 = x + attn . W_o (+ b);  ln_2 = norm (res2);  fc = ln_2 . W_fc (+ b)   [4C | gate|up 2F]
//   act = GELU (fc) | silu(gate) * up;  res3 = res2 + act . W_down (+ b)
// OLMo 2 moves the two norms onto the attention's and the MLP's outputs; Gemma 3 keeps them and
// adds those two (pn1, pn2), takes GeGLU for SwiGLU and scales the embedding's output by sqrt(C).
// The fused W_qkv (and W_fc) of LLaMA are its adjacent q, k, v (gate, up) [out, in] matrices.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/graph.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/distill.h"
#include "model/expert_parallel.h"
#include "model/preference.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "model/recompute.h"
#include "model/tensor_parallel.h"

namespace memfit {

// Views of every weight (or gradient) inside one flat buffer. Tensors a family lacks (GPT-2's
// biases and wpe for LLaMA) are invalid; `head` is `wte` when the head is tied.
struct ModelWeights {
    // LoRA adapter `site` (model/lora.h) on one of the layer's projections: A [r, in], B [cols, r]
    // and, DoRA, the magnitude m [cols] (else invalid).
    struct Adapter {
        Proj proj = Proj::qkv;
        int  site = 0;
        Tensor a, b, mag;
    };
    struct Layer {
        Tensor ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
        Tensor qnw, knw;   // Qwen3's q and k norms [head_dim]
        Tensor pn1w, pn2w; // Gemma 3 (sandwich_norm): the norms on attention's and the MLP's outputs
        // A mixture of experts' layer: the router [E, C]; fcw and fcprojw are then the experts'
        // stacks [E, 2F, C] (gate|up) and [E, C, F] (down).
        Tensor routerw;
        Tensor shw1, shw2, shgw;   // Qwen2-MoE's shared expert: gate|up [2F, C], down [C, F], gate [1, C]
        // A quantized base (LoRA): the projections' packed weights; the Tensor ones are invalid.
        QWeight qkvq, projq, fcq, fcprojq;
        std::vector<Adapter> adapters;
    };
    Tensor wte, wpe, lnfw, lnfb, head;
    std::vector<Layer> h;
    std::vector<Adapter> head_adapters;   // LoRA on the LM head (target lm_head): at most one
    std::vector<Adapter> embed_adapters;  // and on the token embedding (embed_tokens): a [V, r], b [C, r]
};
// `dtype`: the storage of the flat buffer (element offsets scale with it).
ModelWeights model_weights(const ModelConfig & cfg, const ParamLayout & layout, BufferId flat, DType dtype = DType::f32);
// Views of a base whose projections `q` holds packed in `qflat` (QWeight fields) and whose other
// weights are dense_layout(cfg, q) in `flat`. With an empty q: model_weights of the whole layout.
ModelWeights quantized_model_weights(const ModelConfig & cfg, const QuantLayout & q, BufferId flat, DType dtype,
                                     BufferId qflat);
// LoRA: the base's views (a dense layout without the quantized projections, which come from `q`
// in `qflat`, when q has entries) plus the adapters of `lora` from `adapters` (a make_lora_layout
// buffer of dtype `adtype`). Gradients: pass flat = -1 for a frozen base (every base view invalid).
ModelWeights lora_model_weights(const ModelConfig & cfg, const LoraOptions & lora, BufferId flat, DType dtype,
                                const QuantLayout & q, BufferId qflat, BufferId adapters, DType adtype);
// The same of a part of the model (a pipeline stage's): its dense base `dense` (a dense_part),
// packed projections `q` and adapters `adapter_layout` (the others' views invalid, or absent).
ModelWeights lora_model_weights(const ModelConfig & cfg, const LoraOptions & lora, const ParamLayout & dense,
                                BufferId flat, DType dtype, const QuantLayout & q, BufferId qflat,
                                const ParamLayout & adapter_layout, BufferId adapters, DType adtype);
ModelWeights quantized_model_weights(const ModelConfig & cfg, const ParamLayout & dense, const QuantLayout & q,
                                     BufferId flat, DType dtype, BufferId qflat);

// --offload optimizer's staged unit, elements (a multiple of the 8-bit moments' block of 256):
// 3 MiB of fp32 master weights and moments, three units live at once (train/step.h).
constexpr size_t kOffloadUnit = size_t(1) << 18;
// Past kOffloadUnits units of kOffloadUnit (a shard of 64 Mi elements), the unit grows with the
// shard, up to kMaxOffloadUnit (4 Mi elements: three units' staging at most 144 MiB), so a
// shard is staged in about kOffloadUnits units (plus one per parameter it cuts): a 70B model's
// shard of a billion elements takes ~256 units of 4 Mi elements, not 4,096 of 2^18 (DeepSpeed's
// sub_group_size is 1e9 elements): fewer copies and launches per step, and a planner that
// records the step in a few milliseconds.
constexpr size_t kOffloadUnits = 256;
constexpr size_t kMaxOffloadUnit = size_t(1) << 22;
constexpr size_t offload_unit_for(size_t shard, size_t unit = kOffloadUnit) {
    const size_t grown = (shard / kOffloadUnits + 255) / 256 * 256;
    return grown > unit ? (grown < kMaxOffloadUnit ? grown : kMaxOffloadUnit) : unit;
}

struct ModelOptions {
    bool with_backward = false;  // declare the backward pass's gradient buffers
    bool keep_logits = false;    // logits persistent, so the host can read them after the step
    int  loss_chunk = 0;         // rows (tokens) per LM-head + loss chunk; 0: the whole batch at once
    // TiledMLP: rows (tokens) per MLP chunk. Forward runs fc, activation and the second matmul
    // one chunk at a time, keeping none of the [rows, 4C] (2F) intermediates; backward recomputes
    // each chunk's and takes its gradient before the next. 0 (or >= B*T): untiled.
    int  mlp_chunk = 0;
    bool flash_attention = false;// tiled attention: saves one log-sum-exp per query, not the T x T probabilities
    // Packed documents: the step declares each token's document start (Backend's doc_start) and
    // hands it to set_doc_start(); the embedding, RoPE and attention then keep to documents.
    bool documents = false;
    RecomputePlan recompute;     // what each layer keeps for backward (model/recompute.h)
    // Storage of weights and activations (kernels compute in f32 from it); mean/rstd/lse and
    // logits stay f32. Parameter gradients are stored as `grad`.
    DType compute = DType::f32;
    DType grad = DType::f32;
    // The optimizer (backend/optimizer.h's row): the states train/step.h declares and updates.
    Optimizer optimizer = Optimizer::adamw;
    // Each layer's update at the end of its backward, its gradients transient (train/step.h).
    bool optimizer_in_backward = false;
    // --galore-rank: the rank GaLore projects each projection matrix's gradient to (galore_rank()).
    int galore_rank = 128;
    // --adafactor-beta1 > 0: Adafactor keeps a first moment (StateSize::first_moment).
    bool adafactor_first_moment = false;
    // --offload optimizer: the share (0..1] of this rank's optimizer state (fp32 master weights,
    // moments) kept in the `offloaded` category and staged through device memory chunk by chunk
    // for the update (train/step.h); 0: every state resident.
    double offload = 0;
    // --offload optimizer+params (ZeRO 3, offload 1): the weights' shard too ("parameters",
    // category offloaded), read into staging buffers one layer ahead of its gather and written by
    // the update unit by unit (train/step.h); the device holds the gathered layers, not the shard.
    bool offload_params = false;
    // --offload activations (training programs): the activations each layer's forward saves for
    // its backward wait in the `offloaded` category in between (model/activation_offload.h), those
    // of the first offload_activation_layers layers (0: every layer's).
    bool offload_activations = false;
    int offload_activation_layers = 0;
    // --master-weights bf16-sr: no fp32 master weights; AdamW rounds the bf16 weights stochastically.
    bool sr_master = false;
    size_t offload_unit = kOffloadUnit;   // elements per staged unit (tests use small ones)
    // > 0: a decode program instead (forward only, B = 1): T new tokens attend over persistent
    // KV caches of this many rows ("kv_cache.<l>.k|v", activations; a ring under a sliding
    // window, infer/decoder.h), and only the last token's logits are kept ("logits" [1, V]).
    int kv_capacity = 0;
    // > 0: the cache rows of the layers that attend to every key (Gemma 3's global layers) while
    // kv_capacity is the sliding layers' ring (infer/decoder.h); 0: every layer's is kv_capacity.
    int kv_full_capacity = 0;
    // Paged generation (backend/paged_kv.h, infer/decoder.h): with paged.enabled(), a decode
    // program of T token rows of up to paged.seqs sequences (B = 1; kv_capacity is then a
    // sequence's context): each layer's keys and values in a pool of blocks ("kv_cache.<l>.k|v"
    // [paged.blocks * paged.block, KV], activations), the step's metadata in "decode.meta" (i32,
    // persistent, filled by the host), and the logits of one row per sequence ("logits" [seqs, V]).
    PagedKv paged;
    // LoRA adapters on the projections (rank 0: none); the base may be frozen (train/step.h).
    LoraOptions lora;
    // Knowledge distillation (model/distill.h): the training step's teacher; the Transformer itself
    // only takes a DistillHead in head_loss.
    DistillOptions distill;
    // Preference tuning (model/preference.h): the step's pairs loss and reference (train/step.h).
    PreferenceOptions pref;
    // Tensor parallel: the config is this rank's slice (tp_local_config). The row-parallel
    // projections' outputs are summed over the tensor group in forward (the output projection,
    // the MLP's second matmul) and the column-parallel ones' input gradients in backward (d ln_1,
    // d ln_2); the embedding is a masked lookup summed over the group, and the loss a
    // vocabulary-parallel cross-entropy that exchanges two floats per token, never the logits.
    TensorParallel tp;
    // Expert parallel (model/expert_parallel.h): the config is this rank's share of the experts
    // (ep_local_config, which the training step applies); its sparse layers exchange routed rows
    // over the Graph's expert communicator.
    ExpertParallel ep;
    // Context parallel (model/context_parallel.h): B and T are this rank's rows of each sequence
    // (T = the whole sequence / cp.ranks); attention gathers the group's keys and values.
    ContextParallel cp;
    // Pipeline parallel: this stage's blocks [layer_begin, layer_end) (-1: to the last). A stage
    // that does not start at block 0 reads its input from input() (received) instead of
    // embedding tokens; one that does not end at the last block has no final norm or head, and
    // its backward starts from output_grad() (received).
    int layer_begin = 0, layer_end = -1;
    // Prepended to every activation's name: one micro-batch's own set ("mb3.").
    std::string prefix;
};

class Transformer;
class ActivationOffload;

// Knowledge distillation in head_loss (train/step.h): a frozen teacher whose forward ran on the
// same tokens gives each loss chunk's logits (Transformer::head_chunk), and the loss becomes
// (1 - alpha) * cross-entropy + alpha * T^2 * KL(teacher_T || student_T) (Backend::distill_fwd).
struct DistillHead {
    const Transformer * teacher = nullptr;
    const ModelWeights * weights = nullptr;   // the teacher's
    Tensor stats;                             // f32 [2, chunk rows]: distill_fwd's per-row lse pair
    float alpha = 0.5f, temperature = 1.0f;
};

class Transformer {
public:
    // Declares the activation buffers for batch B, sequence T.
    Transformer(const ModelConfig & cfg, int B, int T, Program & program, const ModelOptions & opt);

    // Packed documents (ModelOptions::documents): doc_start [B,T] i32, the batch's document starts,
    // read by the embedding, RoPE and attention of every pass.
    void set_doc_start(Tensor doc_start) { docs_ = doc_start; }
    // Sliding-window attention (ModelConfig::sliding_window below T): start [B,T] i32, the first
    // key each query attends to, max(t - W + 1, its document's start); read by attention only
    // (positions stay the documents'). The kernels take it where they take document starts.
    void set_attention_start(Tensor start) { attn_lo_ = start; }
    // Mixture of experts: every sparse layer's routing statistics (f32 [sparse layers,
    // moe_stats_width], persistent: the engine reads the load-balancing loss from them), and the
    // weights of the router losses' gradients in this pass (TrainStep, per micro-batch: the
    // coefficients times the loss gradient's scale).
    Tensor moe_stats() const { return moe_stats_; }
    void set_router_loss_scale(float aux, float z) const { moe_aux_scale_ = aux, moe_z_scale_ = z; }
    // Context parallelism (ModelOptions::cp): ctx i32 [3*B*T + ranks*T], filled by the host per
    // batch: each local row's t - position (what the embedding and RoPE read as its document
    // start), its position in the whole sequence and its first key (its document's start); then
    // every context rank's rows' positions.
    void set_context(Tensor ctx);
    // --offload activations (model/activation_offload.h): its hooks around each layer's forward and
    // backward; null: everything stays resident.
    void set_activation_offload(ActivationOffload * o) { offload_ = o; }

    // A hook called with the layer's index (ZeRO: gather weights, reduce gradients).
    using LayerHook = std::function<void(Graph &, int)>;

    // Calibration (infer/calibration.h): called in forward() with each block projection's input
    // [rows, in] and its layer, before the projection; what it records runs there.
    using ProjectionTap = std::function<void(Graph &, int layer, Proj, Tensor inp)>;
    void set_projection_tap(ProjectionTap tap) { tap_ = std::move(tap); }

    // tokens [B,T] i32 -> the final norm's output (the blocks and the final norm).
    // layer_begin(g, l), when given, is called just before layer l's forward.
    void forward(Graph & g, const ModelWeights & w, Tensor tokens, const LayerHook & layer_begin = {}) const;
    // The LM head, for the whole batch: logits [B,T,V] into the `logits` buffer.
    void head_logits(Graph & g, const ModelWeights & w) const;
    // The LM head and the cross-entropy (losses [B,T]); with dw, also their backward (dlogits
    // scaled by dloss, dhead accumulated, d(final norm output) written). Chunked by loss_chunk
    // rows, so that with chunks the B*T*V logits never exist whole: each chunk's logits are
    // turned into gradients and consumed before the next chunk's are computed.
    // With `distill`, the distillation loss on every chunk instead (not with tensor parallelism).
    void head_loss(Graph & g, const ModelWeights & w, const ModelWeights * dw, Tensor targets, Tensor losses,
                   float dloss, const DistillHead * distill = nullptr) const;
    // Preference tuning's second pass over the LM head (model/preference.h), after head_loss
    // without dw wrote the losses: per chunk the logits again, their cross-entropy gradient with
    // row i's factor scale[i] (f32 [B*T], Backend::dpo_loss's), and the head's backward.
    void head_grad_rows(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor targets,
                        Tensor scale) const;
    // The LM head on rows [r0, r0 + n) of the final norm's output (n at most a loss chunk's rows),
    // into the logits buffer's first n rows (returned): a distillation teacher's, after forward().
    Tensor head_chunk(Graph & g, const ModelWeights & w, int64_t r0, int64_t n) const;
    // The blocks' backward, after head_loss with dw; accumulates parameter gradients into dw.
    // Recomputes what the recompute plan dropped just before each layer's (or segment's) backward.
    // layer_done(g, l), when given, is called as soon as layer l's parameter gradients are final
    // (l = -1: the rest, after the embedding's), so that data parallelism can start reducing them.
    // layer_begin(g, l) is called before layer l's backward and its recomputation (a segment's
    // recomputation, every:K, reads the weights of the segment's lower layers before their
    // layer_begin).
    void backward(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor tokens,
                  const LayerHook & layer_done = {}, const LayerHook & layer_begin = {}) const;
    int segment() const { return rc_plan_.segment; }
    // The lowest layer backward visits (LoRA on a frozen base: the lowest adapted one).
    int lowest_trained_layer() const { return lowest_trained_layer_; }
    // The blocks this program runs: [layer_begin, layer_end) (a pipeline stage's chunk; else all).
    int layer_begin() const { return lb_; }
    int layer_end() const { return le_; }

    // Decode program: the T tokens at positions pos0 .. pos0+T-1, their keys and values appended
    // to the caches, the last one's logits into logits().
    void decode(Graph & g, const ModelWeights & w, Tensor tokens, int pos0) const;
    // Paged decode program (ModelOptions::paged): T token rows, each at the sequence and position
    // decode_meta() gives; the logits of the rows it names into logits().
    void decode_paged(Graph & g, const ModelWeights & w, Tensor tokens) const;
    Tensor decode_meta() const { return meta_; }

    Tensor logits() const { return logits_; }
    // Pipeline stages: the received input and the output sent on (forward); the gradient of the
    // output, received before backward(), and of the input, sent back after it (the same buffer).
    Tensor input() const { return input_; }
    Tensor output() const { return layers_.back().res3; }
    Tensor output_grad() const { return dres_; }
    Tensor input_grad() const { return dres_; }
    bool first_stage() const { return lb_ == 0; }
    bool last_stage() const { return le_ == cfg_.n_layer; }

private:
    struct LayerActs {
        Tensor ln1, ln1_mean, ln1_rstd, qkv, qk_raw, qk_rstd, qkv_rep, att, lse, atty, attproj, res2, ln2, ln2_mean, ln2_rstd, fch,
            fch_gelu, fcproj, res3;
        // backward (qkv_rep_b, dqkv_rep: the repeated heads, grouped-query attention only)
        Tensor dfch_gelu, dfch, dln2, datty, dqkv, dln1, qkv_rep_b, dqkv_rep;
        // OLMo 2 (post_norm): ln1 and ln2 normalise the attention's and the MLP's outputs; dpost
        // is the gradient of the one whose backward runs. Gemma 3 (sandwich_norm): pn1 and pn2
        // do, ln1 and ln2 stay on the inputs.
        Tensor dpost, pn1, pn1_rstd, pn2, pn2_rstd;
        // Scores scaled by attn_scalar^-1/2 (Gemma 3): q's norm weight times score_scale() and
        // that weight's gradient before it is scaled into the norm's.
        Tensor qn_scaled, dqn_scaled;
        // TiledMLP: backward's recomputed chunk (fch, fch_gelu and their gradients are chunks too)
        Tensor fch_b, fch_gelu_b;
        // Tensor parallel, 16-bit: the fp32 copies of the four sums while in flight
        Tensor tp_attn, tp_mlp, tp_dln1, tp_dln2;
        // Sequence parallel: the norm outputs gathered whole (forward; again in backward), the
        // row-parallel outputs' and the column-parallel input gradients' own rows, and the
        // residual gradient gathered whole for the two row-parallel projections' backward.
        Tensor ln1g, ln2g, ln1g_b, ln2g_b, attproj_s, fcproj_s, dln1_s, dln2_s, dres_g1, dres_g2;
        // Context parallel: this rank's k | v, every rank's (rank order), the whole sequence's
        // (position order); backward gathers them again (_b) and reduce-scatters their gradients.
        Tensor cp_kv, cp_all, cp_abs, cp_kv_b, cp_all_b, cp_abs_b, cp_dabs, cp_dall, cp_dkv, cp_scratch;
        // The ring: the block arriving while one is attended to, fp32 accumulators of the output
        // (forward) and of dq and the travelling block's dk | dv (backward), and this rank's own
        // block's gradient once it is home.
        Tensor cp_kv_next, cp_acc, cp_kv_b_next, cp_dq, cp_dkv_acc, cp_dkv_next, cp_dkv_home;
        // Mixture of experts (model/moe.h): the router's logits [N, E], the route (i32) and the
        // k weights [N, k] (f32), kept for backward; the dispatched input and the experts'
        // outputs [N*k, C] (transient; fch and fch_gelu are the experts' [N*k, 2F] and [N*k, F]).
        // Backward: d(output) dispatched, the input dispatched again, its gradient, the weights'
        // and the logits' gradients.
        Tensor moe_logits, moe_route, moe_wts, moe_xs, moe_y, moe_dys, moe_xs_b, moe_dxs, moe_dwts, moe_dlogits;
        // Expert parallel (transformer_ep.cpp; the rows in the capacity layout, [E*cap, C]): moe_xs
        // and moe_dys are what this rank sends, moe_y and ep_dxs what comes back; ep_recv (kept),
        // ep_out, ep_dys and moe_dxs the expert side's; the send counts [E] and those received.
        Tensor ep_recv, ep_out, ep_dys, ep_dxs, ep_cnt, ep_cnt_recv;
        // Qwen2-MoE's shared expert (kept: its gate|up, SwiGLU and output [N, .], its gate's logit
        // [N, 1]) and backward's gradients of them.
        Tensor sh_fc, sh_act, sh_out, sh_gate, sh_dout, sh_dact, sh_dfc, sh_dgate;
        int layer = 0;
        bool rc = false;   // the recomputation's set
    };
    // LoRA activations of one site: u = x A^T [rows, r] is kept for backward; d = u B^T
    // [rows, cols] is transient, and so are the backward's dd and du.
    struct AdapterActs {
        Tensor u, d, d_rc, dd, du;   // d_rc: recomputation's own transient (d's lifetime stays short)
        // Dropout on the adapter's input (training): the dropped input in forward, regenerated
        // for backward (and recomputation), and its gradient.
        Tensor xd, xd_b, dxd;
        // DoRA: the slice less its bias before the factor (kept for the magnitude's gradient), the
        // adapted rows' norms (f32, forward to backward), and on the first DoRA site of each
        // projection, backward's copy of the projection's output gradient, scaled in its slices.
        Tensor z, norm, dscaled;
    };
    // One layer's forward from input x into the buffers of `a`; the output projection and the
    // last residual are skipped when the output is not needed (the last layer of a recomputed segment).
    // With cache >= 0 (decode), attention reads and extends layer `cache`'s KV cache at pos0.
    void layer_forward(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x, bool need_output,
                       int cache = -1, int pos0 = 0) const;
    // The LM head on rows x [n, C] into logits [n, V], with its LoRA adapter when lm_head is a
    // target; and its backward: dx gets d(x) (overwritten), dw the adapter's gradients.
    void head_fwd(Graph & g, const ModelWeights & w, Tensor logits, Tensor x) const;
    // LoRA on the token embedding (embed_tokens): its addition to encoded_, and its backward from
    // dres_ (d(encoded)).
    void embed_adapter_fwd(Graph & g, const ModelWeights & w, Tensor tokens) const;
    void embed_adapter_bwd(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor tokens) const;
    // dout_bf16: how the head's gemms read dlogits (Graph::matmul_bwd; rounded: the loss op did it).
    void head_bwd(Graph & g, const ModelWeights & w, const ModelWeights & dw, Tensor dx, Tensor dlogits, Tensor x,
                  Graph::DoutBf16 dout_bf16) const;
    // The recomputed set `r` with the layer's own gradient buffers (`own`): what backward reads.
    static LayerActs with_own_grads(LayerActs r, const LayerActs & own);
    void layer_backward(Graph & g, const LayerActs & a, const LayerActs & own, const ModelWeights::Layer & p,
                        const ModelWeights::Layer & dp, Tensor x) const;
    // The family's pieces.
    void norm_fwd(Graph & g, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b) const;
    // A sublayer's output as its residual add takes it: summed over the tensor group (this rank's
    // rows, sequence parallel) and, post_norm, normalised into `normed` (its rstd saved).
    Tensor sublayer_out(Graph & g, Tensor partial, Tensor slice, Tensor scratch, Tensor normed, Tensor rstd, Tensor w,
                        Phase resume) const;
    // The norm on a sublayer's output (OLMo 2's ln1 / ln2, Gemma 3's pn1 / pn2): its output, rstd,
    // weight and that weight's gradient, for attention (first) or the MLP.
    struct PostNorm {
        Tensor out, rstd, w, dw;
    };
    PostNorm post_norm(const LayerActs & a, const ModelWeights::Layer & p, const ModelWeights::Layer * dp,
                       bool mlp) const;
    bool has_post_norm() const { return cfg_.post_norm || cfg_.sandwich_norm; }
    // post_norm's backward of that norm: d(its input) into dout_in (overwritten) from dres_.
    Tensor post_norm_bwd(Graph & g, Tensor dout_in, Tensor dw, Tensor in, Tensor w, Tensor rstd) const;
    void norm_bwd(Graph & g, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                  Tensor rstd) const;
    // q|k|v of `a` (its qkv, and qk_raw/qk_rstd with Qwen3's norms) from ln1.
    void qkv_fwd(Graph & g, const LayerActs & a, Tensor ln1, const ModelWeights::Layer & p, int pos0) const;
    // Attention of layer l from qkv into out and lse | att; `s` is the set whose scratch it uses
    // (the repeated heads of GQA, context parallelism's gathered keys and values).
    void attention_fwd(Graph & g, int l, Tensor out, Tensor lse, Tensor att, const LayerActs & s, Tensor qkv) const;
    // Context parallelism (transformer_cp.cpp): its buffers in a set, the gathered k | v in
    // position order, the attention and its backward (into a.dqkv, the keys' and values'
    // gradients reduce-scattered back to their ranks).
    void declare_cp(Program & program, const std::string & h, bool with_backward, LayerActs & a) const;
    void cp_gather(Graph & g, const Tensor & kv, const Tensor & all, const Tensor & whole, const Tensor & qkv) const;
    void cp_permute(Graph & g, const Tensor & whole, const Tensor & all, bool to_whole) const;
    void cp_attention_bwd(Graph & g, const LayerActs & a) const;
    void cp_ring_fwd(Graph & g, Tensor out, Tensor lse, const LayerActs & s, Tensor qkv) const;
    void cp_ring_bwd(Graph & g, const LayerActs & a) const;
    Tensor cp_kpos(int rank) const { return cp_kpos_.view(int64_t(rank) * T_, {int64_t(T_)}); }
    void attention_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p,
                       const ModelWeights::Layer & dp) const;
    // Mixture of experts (transformer_moe.cpp): a sparse layer's buffers, its MLP from x (ln_2's
    // output) into a.fcproj (up to the experts' activation without the output), the experts'
    // first matmul alone (recomputation), and the backward from dout into a.dln2.
    void declare_moe(Program & program, const std::string & h, bool with_backward, LayerActs & a) const;
    MoeDesc moe_desc(int l) const;
    void moe_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x, bool need_output) const;
    void moe_fc(Graph & g, Tensor fch, Tensor xs, const LayerActs & a, const ModelWeights::Layer & p, Tensor x,
                bool rc = false) const;
    // LoRA on a sparse layer's experts: each module's (gate, up, down) sites as one grouped
    // adapter: its first expert's site and views, and the stride from one expert's A (and B) to
    // the next's.
    struct ExpertAdapter {
        int site = 0, index = 0;   // the first expert's site, and its place in the layer's adapters
        int64_t stride = 0;
    };
    std::vector<ExpertAdapter> expert_adapters(const ModelWeights::Layer & p, Proj proj) const;
    Tensor expert_stack(Tensor first, int64_t stride) const;
    void moe_adapters_fwd(Graph & g, Tensor out, Tensor in, const LayerActs & a, const ModelWeights::Layer & p,
                          Proj proj, bool rc) const;
    // The adapters' backward from dout (the projection's output gradient) and in (its input):
    // their gradients into dp's, and their share of d(in) added into din.
    void moe_adapters_bwd(Graph & g, Tensor din, Tensor dout, Tensor in, const LayerActs & a,
                          const ModelWeights::Layer & p, const ModelWeights::Layer & dp, Proj proj) const;
    void moe_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, const ModelWeights::Layer & dp, Tensor x,
                 Tensor dout) const;
    void declare_shared_expert(Program & program, const std::string & h, bool with_backward, LayerActs & a) const;
    void shared_expert_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x) const;
    void shared_expert_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, const ModelWeights::Layer & dp,
                           Tensor x, Tensor dout) const;
    // Expert parallelism (transformer_ep.cpp, model/expert_parallel.h): the same sparse MLP with
    // this rank's experts, the routed rows exchanged over the expert group.
    void declare_ep(Program & program, const std::string & h, bool with_backward, LayerActs & a) const;
    MoeDesc ep_local_desc() const;   // the grouped matmuls' over the received rows
    void ep_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x, bool need_output) const;
    void ep_fc(Graph & g, Tensor fch, const LayerActs & a, const ModelWeights::Layer & p) const;
    void ep_bwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, const ModelWeights::Layer & dp, Tensor x,
                Tensor dout) const;
    void act_fwd(Graph & g, Tensor out, Tensor fc) const;
    void act_bwd(Graph & g, Tensor dfc, Tensor dout, Tensor fc) const;
    // TiledMLP: the MLP of `a` chunk by chunk, from a.ln2 into a.fcproj; and its backward from
    // d(residual_mlp) = dres_, each chunk recomputed into own's backward chunk buffers, into a.dln2.
    void mlp_tiled_fwd(Graph & g, const LayerActs & a, const ModelWeights::Layer & p, Tensor x) const;
    void mlp_tiled_bwd(Graph & g, const LayerActs & a, const LayerActs & own, const ModelWeights::Layer & p,
                       const ModelWeights::Layer & dp, Tensor in, Tensor dout) const;
    // One block projection: out = inp . W (+ b), dense or quantized, plus the layer's adapters on it.
    void project(Graph & g, Tensor out, Tensor inp, const ModelWeights::Layer & p, Proj proj, bool rc) const;
    // Its backward: dinp (written), and the weight, bias and adapter gradients that dp holds.
    void project_bwd(Graph & g, Tensor dinp, Tensor dout, Tensor inp, const ModelWeights::Layer & p,
                     const ModelWeights::Layer & dp, Proj proj) const;
    LayerActs declare_layer(Program & program, const std::string & prefix, bool with_backward) const;
    // Tensor parallel: t summed over the tensor group (blocking; scratch: a 16-bit sum's fp32
    // copy), then the pass goes on in phase `resume`. Nothing without tensor parallelism.
    void tp_sum(Graph & g, Tensor t, Tensor scratch, Phase resume) const;
    // Sequence parallel: this rank's rows `slice` gathered whole into `full` (returned); without
    // it, the slice is the whole and is returned as is.
    Tensor gather_rows(Graph & g, Tensor slice, Tensor full, Phase resume) const;
    // A row-parallel result's partial sums over all rows: reduce-scattered into this rank's rows
    // (sequence parallel; `slice` returned), else summed in place over the group (returned).
    Tensor reduce_rows(Graph & g, Tensor partial, Tensor slice, Tensor scratch, Phase resume) const;
    Tensor tp_scratch(Program & program, const std::string & name, int64_t elems) const;
    // The vocabulary-parallel LM head and loss of rows [r0, r0 + n) (head_loss's chunk).
    void head_loss_tp(Graph & g, const ModelWeights & w, const ModelWeights * dw, Tensor targets, Tensor losses,
                      float dloss, int64_t r0, int64_t n) const;
    // bf16 weights: the head's backward may round the fp32 logit gradients to bf16 (autocast's
    // precision for them), in place, so that both of its gemms run as native bf16 matmuls where the
    // backend has them (Graph::matmul_bwd's round_dout). The loss and the probabilities stay fp32.
    static bool round_logit_grads(const ModelWeights & w) { return w.head.dtype == DType::bf16; }
    static Graph::DoutBf16 logit_grads_bf16(const ModelWeights & w) {
        return round_logit_grads(w) ? Graph::DoutBf16::round : Graph::DoutBf16::keep;
    }
    // Declares prefix + name + suffix ("h.3." + "attn.qkv"): one string, built once.
    Tensor act(Program & program, std::string_view name, std::initializer_list<int64_t> dims, bool f32 = false,
               std::string_view suffix = {}) const;
    // Recomputes the units layer l's mask dropped into rc_[l]; returns the layer's activations
    // as backward reads them (kept ones from forward, the rest recomputed).
    LayerActs recompute_dropped(Graph & g, int l, const ModelWeights::Layer & p, Tensor x) const;
    LayerActs recompute_dropped_post(Graph & g, int l, const ModelWeights::Layer & p, Tensor x) const;
    void recompute_attention(Graph & g, int l, LayerActs & a, const ModelWeights::Layer & p, Tensor x) const;

    ModelConfig cfg_;
    int B_, T_;
    bool llama_ = false, gqa_ = false;
    bool layer_norm_ = false;    // LayerNorm (GPT-2, GPT-NeoX), else RMSNorm
    // The rotary embedding for this pass's sequences (longrope picks its factors by their length).
    Rope rope_;
    std::vector<Rope> layer_rope_;   // each layer's (Gemma 3: local and global bases), by absolute index
    WeightLayout wl_ = WeightLayout::in_out;
    RecomputePlan rc_plan_;
    DType dt_ = DType::f32;
    DType gdt_ = DType::f32;      // parameter gradients' storage
    std::vector<LayerActs> rc_;   // recomputed activations (used by backward) when recomputing
    int chunk_rows_ = 0;   // rows per head chunk (B*T when unchunked)
    int mlp_rows_ = 0;     // rows per MLP chunk (TiledMLP); 0: untiled
    bool flash_ = false;
    Tensor docs_;                 // packed documents' starts (invalid: one document per row)
    Tensor attn_lo_;              // sliding window: each query's first key (invalid: docs_ bounds attention)
    // Layer l's first key per query: the window's (a global layer of Gemma 3: the documents').
    Tensor attention_start(int l) const {
        const int W = cfg_.layer_window(l);
        MF_ASSERT((W <= 0 || T_ <= W || attn_lo_.valid()) && "sliding window below T: the step must set the attention start");
        return attn_lo_.valid() && W > 0 ? attn_lo_ : docs_;
    }
    // Gemma 3: the embedding's output times sqrt(C) (forward), its gradient likewise (backward).
    void scale_embedding(Graph & g, Tensor t) const {
        if (cfg_.scale_embed) g.scale(t, cfg_.embed_scale());
    }
    ActivationOffload * offload_ = nullptr;
    Tensor moe_stats_;
    std::vector<int> moe_index_;   // by layer: its row of moe_stats_ (-1: dense)
    // Expert parallel: rows per expert a rank sends (0: not expert parallel), and the row a
    // recomputed route's statistics go to (the step's were summed over the group already).
    int64_t ep_cap_ = 0;
    Tensor moe_stats_rc_;
    mutable float moe_aux_scale_ = 0, moe_z_scale_ = 0;
    ContextParallel cp_;
    Tensor cp_meta_;   // [2,B,T]: positions and first keys (set_context)
    Tensor cp_kpos_;   // [ranks, T]: each context rank's rows' positions (the ring's blocks)
    Tensor encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_;
    Tensor dres_, dlnf_;
    std::vector<LayerActs> layers_;
    std::vector<Tensor> kcache_, vcache_;   // decode programs
    PagedKv paged_;                         // paged decode programs: the pools' geometry
    Tensor meta_, last_;                    // its metadata, the rows the head reads
    void declare_paged(Program & program, const ModelOptions & opt);
    std::vector<LoraSite> sites_;           // LoRA
    std::vector<AdapterActs> adapter_acts_; // by site
    float lora_scale_ = 0;
    float lora_dropout_ = 0;                // training programs only
    ProjectionTap tap_;                     // calibration programs only
    int lowest_trained_layer_ = 0;          // backward stops below it (a frozen base below)
    int lb_ = 0, le_ = 0;                   // the blocks this program runs (pipeline stage)
    std::string prefix_;
    Tensor input_;                          // a later stage's received input
    TensorParallel tp_;
    bool sp_ = false;                       // sequence parallel: the residual stream holds rows_ rows
    int64_t rows_ = 0;                      // B*T, or B*T / tensor ranks
    Tensor encoded_full_, lnf_s_, dlnf_s_, dres_embed_;   // sequence parallel (lnf_s_ = lnf_ without)
    // Layer l's activations (by absolute index) and its recomputation set.
    const LayerActs & acts(int l) const { return layers_[size_t(l - lb_)]; }
    const LayerActs & rc(int l) const { return rc_[size_t(l - lb_)]; }
    Tensor tp_encoded_, tp_dlnf_;           // 16-bit sums' fp32 copies
    Tensor xent_stats_, xent_gathered_, xent_lse_;   // vocabulary-parallel loss, per chunk
};

}  // namespace memfit
