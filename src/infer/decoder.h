// Decoder: text generation with a KV cache, planned like a training step.
//
// Two kinds of forward-only programs share one set of persistent buffers (bound by name): the
// weights in the compute dtype, each layer's key and value caches ([capacity, KVH * head_dim],
// category activations, named kv_cache.<l>.k|v), the token slots and the last token's logits.
// A prefill program runs a prompt of n tokens at once; the step program runs one token. Each
// appends its keys and values to the caches and attends over everything cached before it, so a
// new token costs one token's forward instead of the whole window's. Programs for new prompt
// lengths are recorded on first use and run inside the step program's arenas where they fit.
//
// Sliding-window models (Mistral's sliding_window W, --attention-window) whose context exceeds
// W keep a rolling cache: ring_rows() = W + kPrefillChunk - 1 rows (at most the context), position
// p in row p % rows, each token attending to its last W positions; prompts are prefilled in
// chunks of at most kPrefillChunk tokens, so that a chunk's new keys never overwrite one the
// chunk still reads. The caches' bytes are planned for those rows, whatever the context. Gemma
// 3's hybrid cache: its sliding layers (five in six) keep such a ring, its global layers every
// position of the context.
//
// On a device backend (`memfit generate --device cuda`) every buffer is device memory from the
// backend's allocator, planned exactly as on the CPU; the prompt's tokens are uploaded and each
// step's logits (V floats) downloaded, nothing else crosses.
//
// Quantized weights (`memfit generate --weights int8|nf4|sparse24`): the four block projections of
// every layer are stored packed as a QLoRA base is (model/lora.h: make_quant_layout, always [out, in]),
// in a second persistent buffer "parameters.quantized"; embeddings, norms, biases and the head
// stay in the compute dtype in "parameters" (dense_layout). The step multiplies through the
// packed bytes (qgemm) without materialising the dequantized matrices.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "model/transformer.h"

namespace memfit {

class Decoder {
public:
    // capacity: positions the caches hold (at most the model's max_seq). quant: store the block
    // projections packed in that format (the rest in `compute`).
    Decoder(const ModelConfig & cfg, Backend & backend, int capacity, DType compute = DType::f32,
            std::optional<QuantFormat> quant = std::nullopt);
    // The same with the packed projections of `quant` (a GPTQ folder's layout: its bits and groups).
    Decoder(const ModelConfig & cfg, Backend & backend, int capacity, DType compute, const QuantLayout & quant);
    // Paged (backend/paged_kv.h): the KV cache a pool of kv.blocks blocks of kv.block positions,
    // steps of up to kv.tokens token rows of up to kv.seqs sequences (both multiples of kRowTile),
    // each sequence at most `context` positions (kv.max_blocks is set from it). run_paged runs
    // the steps; prefill and step are the contiguous decoder's.
    Decoder(const ModelConfig & cfg, Backend & backend, const PagedKv & kv, int context, DType compute,
            const QuantLayout & quant = {});
    ~Decoder();

    // Sets the weights from the whole model's fp32 values in layout()'s order (converted to the
    // compute dtype; the projections quantized when the decoder stores them packed).
    // packed (optional): the projections already packed, quant_layout().bytes of them (a GPTQ
    // folder's), stored bit for bit instead of quantizing params'.
    void set_weights(const float * params, const std::vector<uint8_t> * packed = nullptr);
    // The weights as the decoder computes with them (rounded to the compute dtype, dequantized),
    // as fp32 in layout()'s order.
    std::vector<float> weights() const;
    // The whole model (make_param_layout), the order set_weights() reads.
    const ParamLayout & layout() const { return layout_; }
    // What "parameters" holds (the whole model, or the part the quantized layout does not), and
    // the packed projections (empty without quantization).
    const ParamLayout & dense_layout() const { return dense_; }
    const QuantLayout & quant_layout() const { return quant_; }
    // Bytes of the weights: dense_layout().total in the compute dtype plus quant_layout().bytes.
    uint64_t weight_bytes() const;
    DType compute() const { return compute_; }
    const ModelConfig & config() const { return cfg_; }

    // Forgets the cache and runs `tokens` (1 .. capacity of them) from position 0; returns the
    // last token's V logits (valid until the next call).
    const float * prefill(const std::vector<int32_t> & tokens);
    // Appends one token at position() (< capacity); returns its logits.
    const float * step(int32_t token);
    int position() const { return pos_; }
    int capacity() const { return capacity_; }
    // Rows of each layer's KV cache: the capacity, or the rolling cache's W + kPrefillChunk - 1.
    int cache_rows() const { return rows_; }
    static constexpr int kPrefillChunk = 64;   // prompt tokens per prefill under a rolling cache

    // Paged: one step of tokens.size() rows (a multiple of kRowTile, at most paged().tokens) with
    // the step's metadata (paged().meta_words() words, paged_kv.h); returns the logits of the rows
    // it names, [paged().seqs, V] (valid until the next call). Every matmul runs in calls of
    // kRowTile rows, so a row's logits do not depend on the other rows of its step.
    const float * run_paged(const std::vector<int32_t> & tokens, const std::vector<int32_t> & meta);
    const PagedKv & paged() const { return paged_; }
    // The rows of the step program that runs `rows` token rows: the smallest of kRowTile x 1, 2, 3,
    // 4, 6, 8, 12, 16, ... (each 4/3 or 3/2 of the last) that holds them, at most paged().tokens,
    // so a serving run records a few programs, not one per row count.
    int step_rows(int rows) const;
    // What a paged decoder of this geometry plans, recorded without allocating (the inference
    // planner, plan/inference_plan.h): its peak once a step of kv.tokens rows has run (every
    // smaller step's bytes are within it). `sizing` gives the backend's workspace sizes.
    static CategoryBytes plan_paged(const ModelConfig & cfg, const Backend & sizing, PagedKv kv, int context,
                                    DType compute, const QuantLayout & quant = {});
    static constexpr int kRowTile = 8;

    // Planned bytes over every program recorded so far (step plus prefills), and the KV cache's.
    CategoryBytes planned_peak_live() const;
    CategoryBytes planned_reserved() const;
    uint64_t kv_cache_bytes() const;
    const Ledger & ledger() const { return ledger_; }

private:
    struct Pass;
    Pass & program_for(int n);
    ModelOptions model_options() const;
    int token_slots() const;   // rows of the tokens buffer
    const float * run(Pass & p, const int32_t * tokens, int pos0);

    ModelConfig cfg_;
    Backend & backend_;
    int capacity_;
    int rows_ = 0;      // KV cache rows (cache_rows())
    int full_rows_ = 0; // > 0: the rows of Gemma 3's global layers, beside the sliding ones' ring
    PagedKv paged_;     // enabled: a paged decoder
    DType compute_;
    ParamLayout layout_, dense_;
    QuantLayout quant_;
    Ledger ledger_;
    std::unique_ptr<Pass> step_;                    // n = 1; owns the persistent buffers
    std::map<int, std::unique_ptr<Pass>> prefill_; // by prompt length (paged: by step rows)
    std::vector<float> logits_;                     // on a device backend: the last logits, downloaded
    int pos_ = 0;
};

}  // namespace memfit
