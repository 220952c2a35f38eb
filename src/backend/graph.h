// Graph: the front through which the training step issues ops. The step is written once, as
// plain C++ calling these methods, and run in two modes:
//
//   recording  (Graph(program, sizing)):  nothing computes and nothing is allocated; each call
//              appends an OpRecord (name, phase, layer, FLOPs, bytes, buffers touched) to the
//              program, which fills in every buffer's first and last use.
//   executing  (Graph(program, memory, backend)): each call checks it is the op recorded at
//              this position, acquires the buffers that start here, resolves tensor views to
//              placed pointers, runs the backend, and releases the buffers that end here.
//
// The planner is the recording; the engine is the execution of the same calls.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "memory/program.h"

namespace memfit {

class StepMemory;
struct Timeline;
class Collectives;   // backend/collectives.h (comm/communicator.h's Communicator is one)
class CommRequest;

// How a weight matrix is stored: GPT-2 Conv1D keeps [in, out]; Linear (and the tied LM head
// reading wte [V, C]) keeps [out, in].
enum class WeightLayout { in_out, out_in };

// A frozen weight stored packed (LoRA's quantized base): the bytes, and what they hold (always
// [out, in], whatever the family's layout).
struct QWeight {
    Tensor    packed;   // u8 [quant_bytes(q)]
    QuantDesc q;
    // A mixture of experts' stack: expert e's packed matrix `stride` bytes after expert e - 1's
    // (packed then spans (E - 1) stride + quant_bytes(q)); 0: one matrix.
    int64_t   stride = 0;
    bool valid() const { return packed.valid(); }
};

// Thrown by an executing Graph whose cancel predicate said so (a run stopping within its grace
// time): the step did not happen.
struct StepAbandoned {};

class Graph {
public:
    // Recording. `sizing` answers workspace queries (may be null: no library scratch).
    Graph(Program & program, const Backend * sizing);
    // Executing a finalized program.
    Graph(const Program & program, StepMemory & memory, Backend & backend);
    ~Graph();

    bool recording() const { return recording_; }
    void phase(Phase p) { phase_ = p; }
    void layer(int l) { layer_ = l; }
    int current_layer() const { return layer_; }
    // The shared scratch buffer (category workspace) that gemms and attention backward use; its
    // size grows while recording to the largest request.
    void set_workspace(BufferId id) { workspace_ = id; }
    // Batch-invariant forward matmuls (paged generation, infer/decoder.h): one of M rows, M a
    // multiple of `rows`, runs as M / rows calls of `rows` rows each, so that a row's result does
    // not depend on how many rows the step has (a backend picks its kernel by the shape, and
    // every call has the same one). 0: one call (the default).
    void set_row_tile(int64_t rows) { row_tile_ = rows; }

    void fill_zero(Tensor t);
    // out[M,Nout] = inp[M,K] . W (+ bias)
    void matmul_fwd(Tensor out, Tensor inp, Tensor w, Tensor bias, WeightLayout layout);
    // dinp = dout . W^T (written, or added with acc_dinp; skipped if !dinp.valid()),
    // dw += ..., dbias += ... (if valid; an invalid dw is a frozen weight, and inp is not read).
    // round_dout (out_in layout, no dbias): an f32 dout may be rounded to bf16 in place and both
    // products read it so, where the backend multiplies bf16 natively (Backend::native_gemm;
    // rounds_dout says where); dout's values are gone afterwards. Elsewhere it changes nothing.
    // DoutBf16::rounded: the op that wrote dout rounded it so already (xent_fwd_bwd's round_bf16),
    // where rounds_dout said yes.
    enum class DoutBf16 { keep, round, rounded };
    void matmul_bwd(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, WeightLayout layout,
                    bool acc_dinp = false, DoutBf16 round_dout = DoutBf16::keep);
    bool rounds_dout(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, WeightLayout layout,
                     bool acc_dinp = false) const;
    // The same through a quantized frozen weight: out = inp . W'^T (+ bias); dinp (+)= dout . W'.
    void qmatmul_fwd(Tensor out, Tensor inp, const QWeight & w, Tensor bias);
    void qmatmul_bwd(Tensor dinp, Tensor dout, const QWeight & w, bool acc_dinp = false);
    // LoRA: out[:, col0 + j] += scale * d[:, j];  d[:, j] = scale * src[:, col0 + j].
    void add_columns(Tensor out, Tensor d, int64_t col0, float scale);
    // t *= s, in place (take_columns over t's own columns).
    void scale(Tensor t, float s);
    void take_columns(Tensor d, Tensor src, int64_t col0, float scale);
    // DoRA (model/lora.h, kernel_list.h): the adapted rows' norms, the column factor mag / norm on
    // the output slice (z: the slice less its bias, saved) and on its gradient (dmag +=).
    void dora_norm(Tensor norm, Tensor w, WeightLayout layout, int64_t col0, Tensor a, Tensor b, float scale);
    void dora_norm_packed(Tensor norm, const QWeight & w, int64_t col0, Tensor a, Tensor b, float scale);
    void dora_scale_fwd(Tensor out, Tensor z, Tensor bias, Tensor mag, Tensor norm, int64_t col0);
    void dora_scale_bwd(Tensor dout, Tensor dmag, Tensor z, Tensor mag, Tensor norm, int64_t col0);
    // dst = src (same numel; the dtypes may differ).
    void copy(Tensor dst, Tensor src);
    // Inverted dropout with the mask of (the step's seed, salt): the same salt within one step
    // gives the same mask, so backward and recomputation regenerate it.
    void dropout(Tensor out, Tensor in, float p, uint64_t salt);
    // The step's random seed (executing; set before the step's ops).
    void set_seed(uint64_t seed) { seed_ = seed; }

    // Data parallel: t summed over the ranks of the communicator (set before executing),
    // started here without blocking and completed by all_reduce_wait(slot).
    // `scratch` (f32, comm_scratch_elems): the fp32 copies of a 16-bit sum, declared in the
    // program (its last use must be the wait).
    void all_reduce_start(Tensor t, int slot, Tensor scratch = {});
    void all_reduce_wait(Tensor t, int slot);
    void set_communicator(Collectives * c) { comm_ = c; }
    // ZeRO, completed by comm_wait(slot, the tensors the transfer touches): reduce_scatter_start
    // sums `in` (a bucket of the whole gradient) over the ranks and leaves this rank's
    // counts[rank] elements at the start of `out` (which may be longer); all_gather_start fills `out` (a bucket of the whole weights)
    // with every rank's counts[i] elements, this rank's from `in`. Invalid `out` / `in`: count 0.
    void reduce_scatter_start(Tensor in, Tensor out, const std::vector<size_t> & counts, int slot,
                              Tensor scratch = {});
    void all_gather_start(Tensor out, Tensor in, const std::vector<size_t> & counts, int slot);
    void comm_wait(int slot, std::initializer_list<Tensor> uses);

    // Tensor parallelism: collectives over the tensor-parallel group (a second communicator,
    // set before executing; data parallelism keeps set_communicator's). Blocking: each is one op
    // that starts and completes its transfer, since the next op needs the result (Megatron-LM's
    // all-reduces sit on the critical path the same way). Executing without a tensor
    // communicator aborts. `scratch` (f32, comm_scratch_elems(dtype, ranks, in's numel)): the
    // fp32 copy of a 16-bit sum, declared in the program; may be invalid for f32 or one rank.
    void set_tensor_communicator(Collectives * c) { tp_comm_ = c; }
    // t (f32, bf16, f16) summed in place over the group's ranks.
    void tp_all_reduce(Tensor t, Tensor scratch = {});
    // out[R * in.numel()] = every rank's `in`, in rank order (any dtype; in disjoint from out or
    // this rank's slot of it).
    void tp_all_gather(Tensor out, Tensor in);
    // in[R * out.numel()] summed element-wise over the ranks; out (disjoint from in) receives this
    // rank's slot of the sum, in[rank * n .. (rank+1) * n).
    void tp_reduce_scatter(Tensor out, Tensor in, Tensor scratch = {});
    // Expert parallelism (model/expert_parallel.h): the expert group, whose ranks hold different
    // experts and exchange routed rows. Blocking, like the tensor group's.
    void set_expert_communicator(Collectives * c) { ep_comm_ = c; }
    // t summed in place over the expert group (the dense gradients, the routing statistics).
    void ep_all_reduce(Tensor t, Tensor scratch = {});
    // f32 t summed over every data-parallel rank: the expert group's, then the data group's (the
    // routing statistics, so that the load-balancing loss is the whole batch's).
    void data_all_reduce(Tensor t);
    // in [R, n] -> out [R, n]: out's block r is rank r's block for this rank (any dtype).
    void ep_all_to_all(Tensor out, Tensor in);
    // Pipeline parallelism: the pipeline group (its rank s is stage s) and the embedding group
    // (the first and last stages, which both hold a tied embedding; null when none is tied).
    void set_pipeline_communicator(Collectives * c) { pp_comm_ = c; }
    void set_embedding_communicator(Collectives * c) { emb_comm_ = c; }
    // One op, both halves at once (Collectives::sendrecv): `send` to stage dst with send_tag and
    // `recv` from stage src with recv_tag; an invalid tensor skips its half.
    void pp_exchange(Tensor send, int dst, int send_tag, Tensor recv, int src, int recv_tag);
    // A send to stage dst started without waiting for the receiver, completed by comm_wait(slot).
    void pp_send_start(Tensor t, int dst, int tag, int slot);
    // t summed (blocking) over the pipeline group, or over the embedding group.
    void pp_all_reduce(Tensor t, Tensor scratch = {});
    void emb_all_reduce(Tensor t, Tensor scratch = {});

    // wpe / dwpe may be invalid (Tensor{}): no position embedding. doc_start (i32 [B,T]; invalid:
    // one document per row): packed documents, for the ops that take it (see Backend). Their
    // FLOPs are recorded as for one document per row (the most a batch can need).
    void encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, Tensor doc_start = {});
    void encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor doc_start = {});
    // Vocabulary-parallel embedding: wte holds rows vocab_lo .. of the table (see Backend).
    void vocab_encoder_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t vocab_lo);
    void vocab_encoder_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t vocab_lo);
    void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps);
    void layernorm_bwd(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean, Tensor rstd);
    void attention_fwd(Tensor out, Tensor att, Tensor qkv, int NH, Tensor doc_start = {});
    void attention_bwd(Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int NH, Tensor doc_start = {});
    void flash_attention_fwd(Tensor out, Tensor lse, Tensor qkv, int NH, Tensor doc_start = {});
    void flash_attention_bwd(Tensor dqkv, Tensor dout, Tensor out, Tensor qkv, Tensor lse, int NH,
                             Tensor doc_start = {});
    void gelu_fwd(Tensor out, Tensor inp, Gelu kind);
    void gelu_bwd(Tensor dinp, Tensor dout, Tensor inp, Gelu kind);
    void residual_fwd(Tensor out, Tensor a, Tensor b);
    // LLaMA family (Backend has the contracts).
    void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps);
    void rmsnorm_bwd(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd);
    void qk_norm_fwd(Tensor qkv, Tensor raw, Tensor rstd, Tensor wq, Tensor wk, int NH, int KVH, float eps);   // in place
    void qk_norm_bwd(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor raw, Tensor wq, Tensor wk, Tensor rstd, int NH,
                     int KVH);   // in place
    void rope_fwd(Tensor qkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {});    // in place
    void rope_bwd(Tensor dqkv, int NH, int KVH, const Rope & rope, int pos0, Tensor doc_start = {});   // in place
    void swiglu_fwd(Tensor out, Tensor inp);
    void swiglu_bwd(Tensor dinp, Tensor dout, Tensor inp);
    // Mixture of experts (kernel_list.h's moe_*, backend/moe.h).
    void moe_route(Tensor route, Tensor wts, Tensor stats, Tensor logits, const MoeDesc & d);
    void moe_route_bwd(Tensor dlogits, Tensor dwts, Tensor logits, Tensor route, Tensor wts, Tensor stats_all,
                       const MoeDesc & d);
    void moe_gather(Tensor out, Tensor x, Tensor route, const MoeDesc & d);
    void moe_scatter(Tensor dx, Tensor dxs, Tensor route, const MoeDesc & d, bool accumulate);
    void moe_combine(Tensor out, Tensor y, Tensor wts, Tensor route, const MoeDesc & d);
    void moe_weight_bwd(Tensor dwts, Tensor g, Tensor dys, Tensor act, Tensor wts, Tensor route, const MoeDesc & d);
    void moe_counts(Tensor counts, Tensor stats, Tensor route, Tensor wts, const MoeDesc & d);
    void sigmoid_gate_fwd(Tensor out, Tensor y, Tensor logit);
    void sigmoid_gate_bwd(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit);
    // The grouped matmul (backend/moe.h's MoeGemm forms): each expert's rows, as the route's
    // offsets give them when the op runs, by the backend's gemm in tiles (kMoeTile, then powers
    // of two), so its workspace is planned for every tile shape. With d.capacity > 0 `route` is
    // counts instead (backend/moe.h: d.reps blocks of d.experts groups of capacity rows).
    // The stack (b for fwd and data, c for weight) holds expert e's [M, K] matrix `stride` elements
    // after expert e - 1's (0: packed, M K; LoRA's adapters sit between them); accumulate adds
    // c's fwd or data product to it.
    void moe_gemm(Tensor c, Tensor a, Tensor b, Tensor route, const MoeDesc & d, MoeGemm mode, int64_t stride = 0,
                  bool accumulate = false);
    // The same through a stack of packed frozen experts (QLoRA): fwd c = a W_e'^T, or data
    // c (+)= a W_e' (the backend's qgemm_fwd and qgemm_bwd, tile by tile).
    void moe_qgemm(Tensor c, Tensor a, const QWeight & w, Tensor route, const MoeDesc & d, MoeGemm mode,
                   bool accumulate = false);
    void geglu_fwd(Tensor out, Tensor inp);
    void geglu_bwd(Tensor dinp, Tensor dout, Tensor inp);
    void repeat_kv_fwd(Tensor full, Tensor qkv, int NH, int KVH);
    void repeat_kv_bwd(Tensor dqkv, Tensor dfull, int NH, int KVH);
    // Generation: appends qkv's new keys and values to the KV caches at pos0 and attends over
    // the cache (see Backend::cached_attention_fwd; window > 0: a ring of sliding-window positions).
    void cached_attention_fwd(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH, int KVH,
                              int window = 0);
    // Context parallelism (model/context_parallel.h, kernel_list.h): this rank's query rows over
    // every position's k | v (kv [B,T,2*KVH*hd]); meta i32 [2,B,Tl]: positions, first keys.
    void cp_attention_fwd(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor meta, int NH, int KVH);
    void cp_attention_bwd(Tensor dqkv, Tensor dkv, Tensor dout, Tensor out, Tensor qkv, Tensor kv, Tensor lse,
                          Tensor meta, int NH, int KVH);
    // The context-parallel group's collectives (blocking, as the tensor group's): every rank's
    // `in` in rank order into out; in [R * out.numel()] summed, this rank's slot into out.
    void set_context_communicator(Collectives * c) { cp_comm_ = c; }
    void cp_all_gather(Tensor out, Tensor in);
    void cp_reduce_scatter(Tensor out, Tensor in, Tensor scratch = {});
    // The ring (--cp-comm-type p2p): `send` to the next rank of the context group while `recv`
    // arrives from the previous one (blocking); and the block kernels (kernel_list.h).
    void cp_ring_exchange(Tensor send, Tensor recv);
    void cp_block_fwd(Tensor acc, Tensor lse, Tensor qkv, Tensor kv, Tensor kpos, Tensor meta, int NH, int KVH,
                      bool first);
    void cp_block_bwd(Tensor dq, Tensor dkv, Tensor dout, Tensor out, Tensor qkv, Tensor kv, Tensor lse, Tensor kpos,
                      Tensor meta, int NH, int KVH);
    void cp_qkv_grad(Tensor dqkv, Tensor dq, Tensor dkv, int NH, int KVH);
    // The same over a paged cache (backend/paged_kv.h): meta is the step's i32 metadata.
    void paged_attention_fwd(Tensor out, Tensor qkv, Tensor kpool, Tensor vpool, Tensor meta, const PagedKv & kv,
                             int NH, int KVH, int window = 0);
    void xent_fwd(Tensor losses, Tensor logits, Tensor targets);
    void xent_bwd(Tensor probs, Tensor targets, float dloss);
    // round_bf16: the gradients then rounded for matmul_bwd's DoutBf16::rounded (rounds_dout: yes).
    void xent_fwd_bwd(Tensor losses, Tensor logits, Tensor targets, float dloss, bool round_bf16 = false);
    // Vocabulary-parallel cross-entropy over logit columns vocab_lo .. of `vocab` (see Backend):
    // stats, tp_all_gather of the stats, loss; then the backward in place on the logits.
    void xent_shard_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_lo, int64_t vocab);
    void xent_shard_loss(Tensor losses, Tensor lse, Tensor gathered, Tensor targets);
    void xent_shard_bwd(Tensor logits, Tensor targets, Tensor lse, int64_t vocab_lo, int64_t vocab, float dloss);
    void row_logps(Tensor out, Tensor losses);
    void dpo_loss(Tensor losses, Tensor scale, Tensor logps, Tensor ref, Tensor targets, const DpoDesc & d);
    void xent_grad_rows(Tensor logits, Tensor targets, Tensor scale);
    void distill_fwd(Tensor losses, Tensor stats, Tensor logits, Tensor teacher, Tensor targets, float alpha,
                     float temperature);
    void distill_bwd(Tensor logits, Tensor stats, Tensor teacher_probs, Tensor targets, float alpha, float temperature,
                     float dloss);
    void sum_squares(Tensor out, Tensor x);
    // One optimizer step of a parameter view, for any row of backend/optimizer.h; param_copy
    // (optional): the compute-precision weights, rewritten from the updated param.
    void optimizer_step(Optimizer o, Tensor param, Tensor grad, const OptimizerStates & states, Tensor norm_sq,
                        Tensor param_copy, const OptimHyper & h);

    // --offload optimizer: copies between an offloaded buffer's view (`stored`, category
    // offloaded, in the executing memory's store) and a staging buffer the kernels read, started
    // here and completed by offload_wait(slot, the staging tensors the slot's copies touch).
    void offload_read(Tensor staging, Tensor stored, int slot);
    void offload_write(Tensor stored, Tensor staging, int slot);
    void offload_wait(int slot, std::initializer_list<Tensor> uses);
    void offload_wait(int slot, std::span<const Tensor> uses);

    // --offload activations (model/activation_offload.h): from here on, every op's view of
    // buffer `from` reads and writes buffer `to` instead (the same bytes reloaded elsewhere), in
    // the recording and the execution alike; unalias(from) ends it.
    void alias(BufferId from, BufferId to);
    void unalias(BufferId from) { alias(from, from); }

    // Executing: record every op (phase, layer, live bytes per category, wall time) into `t`; on a
    // device backend each op is waited for (synchronize) so that its time is its kernels'.
    void attach_timeline(Timeline * t) { timeline_ = t; }
    // Executing: asked before every op until the first of the optimizer phase; true abandons the
    // program there (StepAbandoned is thrown): the weights and optimizer states are those before it.
    void set_cancel(const std::function<bool()> * cancel) { cancel_ = cancel; }
    // Executing: asked once, just before the first op of the optimizer phase (every forward and
    // backward op has run); true leaves the step's weights and optimizer states as they were:
    // the adamw ops are issued (the program's order holds) but update nothing.
    void set_skip_update(const std::function<bool()> * ask) { skip_ask_ = ask; }

    // Number of ops issued so far (while executing: must end equal to the program's count).
    int ops_issued() const { return next_op_; }

private:
    // offload_read (read) and offload_write: one copy between staging and the store.
    void offload_copy(const char * name, Tensor staging, Tensor stored, int slot, bool read);
    // Records or begins op `name`; returns false while recording (the caller computes nothing).
    bool begin(const char * name, double flops, std::initializer_list<Tensor> uses, bool workspace = false) {
        return begin(name, flops, std::span<const Tensor>(uses.begin(), uses.size()), workspace);
    }
    bool begin(const char * name, double flops, std::span<const Tensor> uses, bool workspace = false);
    BufferId aliased(BufferId b) const { return size_t(b) < alias_.size() ? alias_[size_t(b)] : b; }
    void end();
    double now_us() const;
    void record_event(const char * name);   // the timeline event of op next_op_, begun now
    Tensor resolve(Tensor t) const;
    void grow_workspace(size_t bytes);
    Tensor workspace_tensor(size_t bytes) const;

    Program * program_ = nullptr;        // recording
    const Program * exec_program_ = nullptr;
    const Backend * sizing_ = nullptr;
    StepMemory * memory_ = nullptr;      // executing
    Backend * backend_ = nullptr;
    bool recording_ = true;
    int64_t row_tile_ = 0;   // set_row_tile
    Phase phase_ = Phase::other;
    int layer_ = -1;
    int next_op_ = 0;
    BufferId workspace_ = -1;
    std::vector<BufferId> alias_;   // alias(): by buffer, the one its views resolve to
    Timeline * timeline_ = nullptr;
    const std::function<bool()> * cancel_ = nullptr;
    bool updating_ = false;   // an optimizer op has begun
    const std::function<bool()> * skip_ask_ = nullptr;
    bool skip_update_ = false;   // skip_ask_ said so
    uint64_t seed_ = 0;
    Collectives * comm_ = nullptr;
    Collectives * tp_comm_ = nullptr;   // tensor-parallel group
    Collectives * ep_comm_ = nullptr;   // expert-parallel group
    Collectives * cp_comm_ = nullptr;   // context-parallel group
    Collectives * pp_comm_ = nullptr, * emb_comm_ = nullptr;
    // t summed in place over c (blocking; a 16-bit sum through scratch's fp32 copy).
    void blocking_sum(Collectives * c, Tensor t, Tensor scratch);
    // in (R slots) summed over c, this rank's slot into out (resolved tensors; blocking).
    void reduce_scatter_now(Collectives * c, Tensor out, Tensor in, Tensor scratch);
    std::vector<std::unique_ptr<CommRequest>> pending_;   // by slot
};

}  // namespace memfit
